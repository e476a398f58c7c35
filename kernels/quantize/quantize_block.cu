/* Float8BlockScaling: 1x128 blocks or 128x128 tiles with f32 scales (k_block, 128x128 tiles). For
 * the columnwise output the tile goes through shared memory as f32, rows padded to 132 floats: a
 * multiple of 4 keeps the 16-byte stores aligned, and the 4-word skew puts the 4 rows x 2 units
 * written together in distinct banks; a thread then takes 32 consecutive rows of one column and
 * stores the transposed row's 32 codes with two 16-byte stores. */
#include "common/scale.cuh"
#include "quantize_tiles.cuh"

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
  const bool vec = vec_ok(a);
  const int dim = q->block_dim;
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
  return with_fp8_dtype(out_dtype, [&](auto od) {
    constexpr int OD = decltype(od)::value;
    return x_dtype == LUTRA_BF16 ? launch_block<LUTRA_BF16, OD, 1, true, true>(a, s)
                                 : launch_block<LUTRA_F16, OD, 1, true, true>(a, s);
  });
}
