/* Float8BlockScaling: 1x128 blocks or 128x128 tiles with f32 scales: k_block16 (below) for bf16 /
 * f16 inputs on tiles16.cuh's tiles, k_block (128x128 tiles) for the rest. In k_block, for
 * the columnwise output the tile goes through shared memory as f32, rows padded to 132 floats: a
 * multiple of 4 keeps the 16-byte stores aligned, and the 4-word skew puts the 4 rows x 2 units
 * written together in distinct banks; a thread then takes 32 consecutive rows of one column and
 * stores the transposed row's 32 codes with two 16-byte stores. */
#include "common/scale.cuh"
#include "tiles16.cuh"

using namespace lkc;
using namespace lkq;

namespace {

constexpr int T128_THREADS = 256;
constexpr int T128_LD = 132; /* shared-memory row stride (floats) */
constexpr int T128_SMEM = (128 * T128_LD + 2 * 4 * 128) * 4;

/* Thread t holds rows lr + 32 q (q = 0..3) of the tile, columns 16 cq .. + 15 (lr = (lane & 3)
 * + 4 warp, cq = lane >> 2: the 8 units of a 128-column row are 8 lanes of one warp). In the
 * column phase warp w takes rows 32 (w & 3) .. + 31 of columns 32 (w >> 2) + lane and that + 64;
 * a 1x128 block of the transpose spans 4 warps, which combine their amaxes in shared memory. */
/* NormIn's norm of the 16 values of row r from column c on, in place, each rounded into x's
 * dtype (and stored into the norm's y where it is wanted); nothing for a unit outside */
template <int XD>
__device__ __forceinline__ void block_norm(const TileArgs &a, int64_t r, int64_t c,
                                           float (&v)[16]) {
  if (r >= a.rows || c >= a.cols) return;
  const NormIn &n = a.norm;
  float g[16], b[16];
  norm_params<16>(n, c, g, b);
  const float mean = n.mean ? __ldg(n.mean + r) : 0.0f, rstd = __ldg(n.rstd + r);
#pragma unroll
  for (int k = 0; k < 16; k++)
    v[k] = half_value<XD>(half_bits<XD>(norm_value(n, v[k], mean, rstd, g[k], b[k])));
  if (n.y) stv<XD, 16>(n.y, r * a.cols + c, v);
}

/* NORM: the tile is normalized as it is loaded (NormIn; 16-bit x, the vector path, 1x128) */
template <int XD, int OD, int DIM, bool VEC, bool NORM = false>
__global__ void __launch_bounds__(T128_THREADS, 2) k_block(TileArgs a) {
  if (a.skip && *a.skip) return;
  float *sm = reinterpret_cast<float *>(dyn_smem());
  float *col_red = sm + 128 * T128_LD; /* [2][4][128]: partial column amaxes */
  __shared__ float red[32];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int lr = (lane & 3) + 4 * warp, cq = lane >> 2;
  const int quarter = warp & 3;
  const bool row_out = a.data != nullptr, col_out = a.col_data != nullptr;
  float *sc = static_cast<float *>(a.scale_inv), *csc = static_cast<float *>(a.col_scale_inv);
  /* scale row strides (lutra.h's layout). 1D: sc [tiles_c][roundup(rows, 4)], csc
   * [tiles_r][roundup(cols, 4)]; 2D: sc [tiles_r][roundup(tiles_c, 4)], csc
   * [tiles_c][roundup(tiles_r, 4)]. Padding entries stay as allocated (zero). */
  const int64_t sc_ld = DIM == 1 ? (a.rows + 3) / 4 * 4 : (a.tiles_c + 3) / 4 * 4;
  const int64_t csc_ld = DIM == 1 ? (a.cols + 3) / 4 * 4 : (a.tiles_r + 3) / 4 * 4;

  for (int64_t tile = blockIdx.x; tile < a.ntiles; tile += gridDim.x) {
    const int64_t tr = tile / a.tiles_c, tc = tile - tr * a.tiles_c;
    const int64_t r0 = tr * 128, c0 = tc * 128, c = c0 + 16 * cq;
    float v[4][16];
#pragma unroll
    for (int q = 0; q < 4; q++) {
      load_unit<XD, VEC>(a, r0 + lr + 32 * q, c, v[q]);
      if (NORM) block_norm<XD>(a, r0 + lr + 32 * q, c, v[q]);
    }

    /* 128x128: one scale for the tile (zeros outside the matrix do not change the amax) */
    float s2 = 1.0f;
    if (DIM == 2) {
      float m = 0.0f;
#pragma unroll
      for (int q = 0; q < 4; q++)
#pragma unroll
        for (int k = 0; k < 16; k++)
          m = fmaxf(m, fabsf(v[q][k]));
      m = block_max(m, red);
      s2 = scale_rule(m, a.fp8_max, a.power_2_scale, a.eps);
      if (t == 0) {
        const float inv = div_x86(1.0f, s2);
        if (row_out) sc[tr * sc_ld + tc] = inv;
        if (col_out) csc[tc * csc_ld + tr] = inv;
      }
    }

    /* rowwise */
    if (row_out) {
#pragma unroll
      for (int q = 0; q < 4; q++) {
        const int64_t r = r0 + lr + 32 * q;
        float sq = s2;
        if (DIM == 1) {
          float m = 0.0f;
#pragma unroll
          for (int k = 0; k < 16; k++)
            m = fmaxf(m, fabsf(v[q][k]));
          m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, 4));
          m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, 8));
          m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, 16));
          sq = scale_rule(m, a.fp8_max, a.power_2_scale, a.eps);
          if (cq == 0 && r < a.rows) sc[tc * sc_ld + r] = div_x86(1.0f, sq);
        }
        store_row<VEC>(a, r, c, encode16<OD>(v[q], sq));
      }
    }

    /* columnwise */
    if (col_out) {
      __syncthreads(); /* the previous tile's column phase is done with sm and col_red */
#pragma unroll
      for (int q = 0; q < 4; q++) {
        float4 *d = reinterpret_cast<float4 *>(sm + (lr + 32 * q) * T128_LD + 16 * cq);
#pragma unroll
        for (int k = 0; k < 4; k++)
          d[k] = make_float4(v[q][4 * k], v[q][4 * k + 1], v[q][4 * k + 2], v[q][4 * k + 3]);
      }
      __syncthreads();
      if (DIM == 1) {
#pragma unroll
        for (int p = 0; p < 2; p++) {
          const int cc = 64 * p + 32 * (warp >> 2) + lane;
          float m = 0.0f;
#pragma unroll
          for (int i = 0; i < 32; i++)
            m = fmaxf(m, fabsf(sm[(32 * quarter + i) * T128_LD + cc]));
          col_red[(4 * p + quarter) * 128 + cc] = m;
        }
        __syncthreads();
      }
#pragma unroll
      for (int p = 0; p < 2; p++) {
        const int cc = 64 * p + 32 * (warp >> 2) + lane;
        const int64_t col = c0 + cc, rbase = r0 + 32 * quarter;
        float sq = s2;
        if (DIM == 1) {
          float m = col_red[(4 * p) * 128 + cc];
#pragma unroll
          for (int k = 1; k < 4; k++)
            m = fmaxf(m, col_red[(4 * p + k) * 128 + cc]);
          sq = scale_rule(m, a.fp8_max, a.power_2_scale, a.eps);
          if (quarter == 0 && col < a.cols) csc[tr * csc_ld + col] = div_x86(1.0f, sq);
        }
        float u[2][16];
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
          for (int k = 0; k < 16; k++)
            u[h][k] = sm[(32 * quarter + 16 * h + k) * T128_LD + cc];
        store_col<VEC>(a, col, rbase, encode16<OD>(u[0], sq), encode16<OD>(u[1], sq));
      }
    }
  }
}

template <int XD, int OD, int DIM, bool V, bool NORM = false>
cudaError_t launch_block(const TileArgs &a, cudaStream_t s) {
  constexpr auto K = k_block<XD, OD, DIM, V, NORM>;
  static std::atomic<uint64_t> smem_set{0};
  int smem = 0;
  if (a.col_data) {
    smem = T128_SMEM;
    const cudaError_t e = allow_smem(K, smem, smem_set);
    if (e != cudaSuccess) return e;
  }
  LKC_LAUNCH(K, persistent_grid<K>(a.ntiles, T128_THREADS, smem), T128_THREADS, smem, s, a);
  return cudaGetLastError();
}

/* ---- k_block16: bf16 / f16 inputs on the 128x128 tiles of tiles16.cuh ------------------------
 * The tile stays in registers as loaded (k_block stages it as f32 and reads it twice). 1x128
 * blocks: a row's 128 columns are 8 lanes of two warps (w, w ^ 4), a column's 128 rows 4 lanes of
 * four warps (w & 3 = 0..3); each warp reduces its part by shuffles, as 16-bit magnitudes two
 * rows or columns to a word, and the parts meet in shared memory. 128x128 tiles: one block max;
 * the column codes are the row codes transposed in registers. Both code tiles leave as whole
 * 128-byte lines, the scales of a tile's 128 rows (columns) as one coalesced store. Scales by
 * k_block's rule (scale_rule of the block's f32 amax, NaNs left out). */
constexpr int B16_SMEM = 2 * MX_T * MX_T      /* code tiles */
                         + (2 + 4) * MX_T * 2 /* row parts [2][128], column parts [4][128] */
                         + 2 * MX_T * 4;      /* row and column scale_inv [128] each */
static_assert(B16_SMEM <= 48 * 1024, "k_block16 launches without raising its shared memory limit");

/* The thread's parts of the 1x128 amaxes: rows tr .. tr + 7 over the warp's 64 columns (lanes k
 * = 0 write them to row_part[w >> 2]), columns tc .. tc + 7 over the warp's 32 rows (lanes h = 0
 * to col_part[w & 3]); 16-bit magnitudes, row (column) 2p in the low half of word p */
template <int XD, bool SAFE>
__device__ __forceinline__ void b16_parts(const uint4 (&x)[8], bool row_out, bool col_out, int tr,
                                          int tc, uint16_t *row_part, uint16_t *col_part) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t rm[4], cm[4];
  tile_amax<XD, SAFE, 8>(x, row_out, col_out, rm, cm);
  if (row_out && (lane & 7) == 0)
    *reinterpret_cast<uint4 *>(row_part + MX_T * (warp >> 2) + tr) =
        make_uint4(rm[0], rm[1], rm[2], rm[3]);
  if (col_out && (lane >> 3) == 0)
    *reinterpret_cast<uint4 *>(col_part + MX_T * (warp & 3) + tc) =
        make_uint4(cm[0], cm[1], cm[2], cm[3]);
}

/* the 8 amaxes (16-bit magnitudes) of lines l .. l + 7 from n parts of 128 lines each */
__device__ __forceinline__ void b16_amax(const uint16_t *part, int n, int l, uint32_t (&m)[4]) {
  uint4 u = *reinterpret_cast<const uint4 *>(part + l);
  for (int q = 1; q < n; q++) {
    const uint4 v = *reinterpret_cast<const uint4 *>(part + MX_T * q + l);
    u = make_uint4(__vmaxu2(u.x, v.x), __vmaxu2(u.y, v.y), __vmaxu2(u.z, v.z), __vmaxu2(u.w, v.w));
  }
  m[0] = u.x, m[1] = u.y, m[2] = u.z, m[3] = u.w;
}

template <int XD> __device__ __forceinline__ float b16_scale(const TileArgs &a, uint32_t m16) {
  return scale_rule(value16<XD>(m16, 0), a.fp8_max, a.power_2_scale, a.eps);
}

template <int XD, int OD, int DIM, bool NORM>
__global__ void __launch_bounds__(MX_THREADS, 2) k_block16(TileArgs a) {
  if (a.skip && *a.skip) return;
  const MxSmem sm = mx_smem();
  uint16_t *row_part = reinterpret_cast<uint16_t *>(sm.rs), *col_part = row_part + 2 * MX_T;
  float *row_inv = reinterpret_cast<float *>(col_part + 4 * MX_T), *col_inv = row_inv + MX_T;
  __shared__ float red[32];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, k = lane & 7, h = lane >> 3;
  const int tr = 32 * (warp & 3) + 8 * h, tc = 64 * (warp >> 2) + 8 * k;
  const bool row_out = a.data != nullptr, col_out = a.col_data != nullptr;
  float *sc = static_cast<float *>(a.scale_inv), *csc = static_cast<float *>(a.col_scale_inv);
  /* scale row strides as k_block's */
  const int64_t sc_ld = DIM == 1 ? (a.rows + 3) / 4 * 4 : (a.tiles_c + 3) / 4 * 4;
  const int64_t csc_ld = DIM == 1 ? (a.cols + 3) / 4 * 4 : (a.tiles_r + 3) / 4 * 4;
  constexpr uint32_t INF = XD == LUTRA_BF16 ? 0x7F80u : 0x7C00u;

  for (uint32_t tile = blockIdx.x; tile < (uint32_t)a.ntiles; tile += gridDim.x) {
    int64_t r0, c0;
    mx_tile_origin(a, tile, r0, c0);
    const int64_t tile_r = r0 / MX_T, tile_c = c0 / MX_T;
    uint4 x[8];
    const bool in = mx_load<XD>(a, r0 + tr, c0 + tc, x);
    if (NORM && in) mx_norm<XD>(a, r0 + tr, c0 + tc, x);
    /* a warp holding a NaN (or an infinity) takes the magnitudes that leave NaNs out */
    const bool special = mx_top<XD>(x) >= INF;
    uint2 w[8];
    if (DIM == 2) {
      const uint32_t top = __any_sync(FULL_MASK, special) ? mx_top<XD, true>(x) : mx_top<XD>(x);
      const float s =
          scale_rule(block_max(value16<XD>(top, 0), red), a.fp8_max, a.power_2_scale, a.eps);
      if (t == 0) {
        const float inv = div_x86(1.0f, s);
        if (row_out) sc[tile_r * sc_ld + tile_c] = inv;
        if (col_out) csc[tile_c * csc_ld + tile_r] = inv;
      }
      encode_rows<XD, OD>(x, s, w);
      stage_codes(sm, w, row_out, col_out, tr, tc);
    } else {
      if (__any_sync(FULL_MASK, special))
        b16_parts<XD, true>(x, row_out, col_out, tr, tc, row_part, col_part);
      else
        b16_parts<XD, false>(x, row_out, col_out, tr, tc, row_part, col_part);
      __syncthreads();
      if (row_out) {
        uint32_t m[4];
        b16_amax(row_part, 2, tr, m);
#pragma unroll
        for (int i = 0; i < 8; i++) {
          const float s = b16_scale<XD>(a, (m[i >> 1] >> (16 * (i & 1))) & 0xFFFFu);
          if (k == 0 && warp < 4) row_inv[tr + i] = div_x86(1.0f, s);
          float v[8];
#pragma unroll
          for (int j = 0; j < 8; j++)
            v[j] = value16<XD>(word_of(x[i], j >> 1), j & 1);
          *reinterpret_cast<uint2 *>(sm.rb + MX_T * (tr + i) + 16 * mx_rb_chunk(tr + i, tc >> 4) +
                                     8 * (k & 1)) = encode8<OD>(v, s);
        }
      }
      if (col_out) {
        uint32_t m[4];
        b16_amax(col_part, 4, tc, m);
#pragma unroll
        for (int jj = 0; jj < 8; jj++) {
          const float s = b16_scale<XD>(a, (m[jj >> 1] >> (16 * (jj & 1))) & 0xFFFFu);
          if (h == 0 && (warp & 3) == 0) col_inv[tc + jj] = div_x86(1.0f, s);
          float v[8];
#pragma unroll
          for (int i = 0; i < 8; i++)
            v[i] = value16<XD>(word_of(x[i], jj >> 1), jj & 1);
          *reinterpret_cast<uint2 *>(sm.cb + MX_T * (tc + jj) + 16 * mx_cb_chunk(tc + jj, tr >> 4) +
                                     8 * (h & 1)) = encode8<OD>(v, s);
        }
      }
    }
    __syncthreads();

    mx_store_codes(a, t, r0, c0, sm, row_out, col_out);
    if (DIM == 1) { /* threads 0..127 a row's scale, 128..255 a column's */
      const int line = t & (MX_T - 1);
      if (t < MX_T) {
        if (row_out && r0 + line < a.rows) sc[tile_c * sc_ld + r0 + line] = row_inv[line];
      } else if (col_out && c0 + line < a.cols) {
        csc[tile_r * csc_ld + c0 + line] = col_inv[line];
      }
    }
    __syncthreads(); /* the shared tiles and parts are free for the next tile */
  }
}

/* k_block16's conditions: 16-bit x, rows and cols multiples of 16 (a thread's 8x8 values all in
 * or all out, whole 16-byte chunks stored), 16-byte aligned buffers */
bool b16_ok(const TileArgs &a, int x_dtype) {
  return (x_dtype == LUTRA_BF16 || x_dtype == LUTRA_F16) && a.rows % 16 == 0 && a.cols % 16 == 0 &&
         aligned(a.x, 16) && aligned(a.data, 16) && aligned(a.col_data, 16) &&
         ((a.rows + MX_T - 1) / MX_T) * ((a.cols + MX_T - 1) / MX_T) < UINT32_MAX;
}

template <int XD, int OD, int DIM, bool NORM>
cudaError_t launch_block16(TileArgs a, cudaStream_t s) {
  a.tiles_r = (a.rows + MX_T - 1) / MX_T;
  a.tiles_c = (a.cols + MX_T - 1) / MX_T;
  a.ntiles = a.tiles_r * a.tiles_c;
  constexpr auto K = k_block16<XD, OD, DIM, NORM>;
  LKC_LAUNCH(K, grid_for(a.ntiles, 1, INT32_MAX), MX_THREADS, B16_SMEM, s, a);
  return cudaGetLastError();
}

} // namespace

/* ---- launcher -------------------------------------------------------------------------------- */

extern "C" cudaError_t lk_quantize_block(const lutra_quant_args *q, cudaStream_t s) {
  if (!q || !is_float_dtype(q->x_dtype) || !is_fp8_dtype(q->out_dtype) || q->rows < 0 ||
      q->cols < 0 || (q->block_dim != 1 && q->block_dim != 2))
    return cudaErrorInvalidValue;
  if ((q->data && !q->scale_inv) || (q->col_data && !q->col_scale_inv))
    return cudaErrorInvalidValue;
  const bool row_out = q->data && q->scale_inv, col_out = q->col_data && q->col_scale_inv;
  if ((!row_out && !col_out) || q->rows == 0 || q->cols == 0) return cudaSuccess;
  if (!q->x) return cudaErrorInvalidValue;
  TileArgs a = tile_args(q, 128);
  block_outputs(a, q, row_out, col_out);
  a.fp8_max = q->out_dtype == LUTRA_E4M3 ? 448.0f : 57344.0f;
  a.eps = q->amax_epsilon;
  a.power_2_scale = q->power_2_scale;
  const int dim = q->block_dim;
  if (b16_ok(a, q->x_dtype))
    return with_fp8_dtype(q->out_dtype, [&](auto od) {
      constexpr int OD = decltype(od)::value;
      if (q->x_dtype == LUTRA_BF16)
        return dim == 1 ? launch_block16<LUTRA_BF16, OD, 1, false>(a, s)
                        : launch_block16<LUTRA_BF16, OD, 2, false>(a, s);
      return dim == 1 ? launch_block16<LUTRA_F16, OD, 1, false>(a, s)
                      : launch_block16<LUTRA_F16, OD, 2, false>(a, s);
    });
  const bool vec = vec_ok(a);
  return with_float_dtype(q->x_dtype, [&](auto xd) {
    return with_fp8_dtype(q->out_dtype, [&](auto od) {
      return with_bool(vec, [&](auto v) {
        constexpr int XD = decltype(xd)::value, OD = decltype(od)::value;
        constexpr bool V = decltype(v)::value;
        return dim == 1 ? launch_block<XD, OD, 1, V>(a, s) : launch_block<XD, OD, 2, V>(a, s);
      });
    });
  });
}

/* 1x128 blocks of a.norm's output (lk_norm_quantize): bf16 / f16 x on the vector path only */
cudaError_t lkq::launch_block_norm(TileArgs a, int x_dtype, int out_dtype, cudaStream_t s) {
  if ((x_dtype != LUTRA_BF16 && x_dtype != LUTRA_F16) || !a.norm.rstd || !vec_ok(a))
    return cudaErrorInvalidValue;
  a.tiles_r = (a.rows + 127) / 128;
  a.tiles_c = (a.cols + 127) / 128;
  a.ntiles = a.tiles_r * a.tiles_c;
  const bool b16 = b16_ok(a, x_dtype);
  return with_fp8_dtype(out_dtype, [&](auto od) {
    constexpr int OD = decltype(od)::value;
    if (b16)
      return x_dtype == LUTRA_BF16 ? launch_block16<LUTRA_BF16, OD, 1, true>(a, s)
                                   : launch_block16<LUTRA_F16, OD, 1, true>(a, s);
    return x_dtype == LUTRA_BF16 ? launch_block<LUTRA_BF16, OD, 1, true, true>(a, s)
                                 : launch_block<LUTRA_F16, OD, 1, true, true>(a, s);
  });
}
