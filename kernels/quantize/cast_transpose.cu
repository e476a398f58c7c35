/* 64x64 tiles: the per-tensor cast with a columnwise output and MXFP8, for what the 128x128
 * kernels of cast_transpose_16bit.cu do not take (f32 inputs, unaligned buffers, dims that are not
 * multiples of 16 (cast) or 32 (MXFP8), a fused bias gradient or GELU gradient); and the two
 * entry points that choose between the two (lk_quantize_mxfp8, lkc::cast_transpose).
 *
 * For the columnwise output (the transpose, quantized along its own rows) the tile goes through
 * shared memory as f32; a thread then takes 32 consecutive rows of one column, reduces its block
 * amax where one is needed, and encodes 32 codes of the transposed row. The transposed codes are
 * staged in shared memory (4 KiB, XOR-swizzled) and written back as whole 64-byte row segments
 * (4 lanes per row, 8 rows per warp store), so every 32-byte sector is written full.
 * Shared-memory rows are padded to 68 floats: a multiple of 4 keeps the 16-byte stores aligned,
 * and the 4-word skew puts the 8 rows written by each quarter-warp in distinct banks; the column
 * reads are 32 consecutive words.
 *
 * The per-tensor cast (without a bias gradient) skips the f32 staging: its columnwise codes are
 * its rowwise codes transposed (same scale), so it transposes the code bytes themselves
 * (MODE_CAST_CODES). The kernels issue the next tile's loads before encoding the current one and
 * visit tiles in bands of LUTRA_TILE_BAND tile rows (tile_coords). */
#include "activation/act_cast.cuh"
#include "activation/activation_math.cuh"
#include "cast_transpose.cuh"
#include "common/codec.cuh"
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"
#include "common/reduce.cuh"
#include "common/scale.cuh"
#include "quantize_tiles.cuh"

using namespace lkc;
using namespace lkq;

namespace {

/* Tile order: bands of LUTRA_TILE_BAND tile rows (8 by default), column by column inside a band.
 * The tiles in flight at once (a few hundred) then cover whole 32-byte sectors of both scale arrays
 * (16 tiles x 2 E8M0 bytes along a row and along a column) and 1 KiB runs of each transposed row,
 * so L2 writes back full sectors instead of partial ones it would have to read from HBM first. */
/* 8 tile rows measured best of 8, 16 and 32 for the delayed cast + transpose
 * (bench/probes/tile_band_sweep.sh; docs/lab/). The macros are for tuning builds only. */
#ifndef LUTRA_TILE_BAND
#define LUTRA_TILE_BAND 8
#endif
constexpr int64_t BAND = LUTRA_TILE_BAND;
__device__ __forceinline__ void tile_coords(const TileArgs &a, int64_t tile, int64_t &tr,
                                            int64_t &tc) {
  const int64_t band = tile / (BAND * a.tiles_c), rem = tile - band * BAND * a.tiles_c;
  const int64_t h = min(BAND, a.tiles_r - band * BAND);
  tc = rem / h;
  tr = band * BAND + (rem - tc * h);
}

constexpr int T64_THREADS = 128;
constexpr int T64_LD = 68;                          /* shared-memory row stride (floats) */
constexpr int T64_SMEM = 64 * T64_LD * 4 + 64 * 64; /* f32 tile + the transposed codes */
/* MODE_CAST_CODES: a per-tensor cast transposes the codes themselves (the columnwise copy has
 * the same scale, so its codes are the rowwise codes transposed): 1 byte per element through
 * shared memory instead of 4, and no second encoding. Used unless a bias gradient is wanted
 * (that needs the f32 column sums of the f32 path). */
/* MODE_CAST_ACT: MODE_CAST of an activation's output or input gradient formed from act (and x)
 * in the kernel (lutra_quant_args.act_kind), the f32 path. */
enum { MODE_CAST = 0, MODE_MX = 1, MODE_CAST_CODES = 2, MODE_CAST_ACT = 3 };
constexpr int CODE_LDW = 17;                     /* words per row of a code tile */
constexpr int CODE_SMEM = 2 * 64 * CODE_LDW * 4; /* two code tiles (double buffered) */

/* ---- an activation inside the cast (MODE_CAST_ACT): act_value of act_cast.cuh ---- */
using lkact::act_value;

/* the 16 values of row r from column c (zeros outside the matrix), and their act_out stores:
 * act_values16 where VEC allows it (a kind without a gate), act_value element by element else */
template <int XD, bool VEC>
__device__ __forceinline__ void act_unit(const TileArgs &a, int64_t r, int64_t c, float (&v)[16]) {
  if (VEC && !lkact::act_gated(a.act_kind) && r < a.rows && c < a.cols) {
    lkact::act_values16<XD>(a, r, c, v); /* cols % 16 == 0: all 16 are in */
  } else {
#pragma unroll
    for (int k = 0; k < 16; k++)
      v[k] = (r < a.rows && c + k < a.cols) ? act_value<XD>(a, r, c + k) : 0.0f;
  }
  if (a.act_out && r < a.rows) {
#pragma unroll
    for (int k = 0; k < 16; k++)
      if (c + k < a.cols) st<XD>(a.act_out, r * a.cols + c + k, v[k]);
  }
}

/* *amax = max|v| over the activation's matrix, *scale = scale_rule(*amax): k_current_scale's
 * scheme (quantize.cu) over act_value instead of x: each block's maximum into work[0], the last
 * block to arrive (work[1]) writes both and clears the words again, so no memset precedes it. */
template <int XD>
__global__ void __launch_bounds__(T64_THREADS)
    k_current_scale_act(TileArgs a, float fp8_max, float *amax, float *scale, uint32_t *work) {
  if (a.skip && *a.skip) return;
  __shared__ float red[32];
  const int64_t n = a.rows * a.cols, stride = (int64_t)gridDim.x * T64_THREADS;
  float m = -INFINITY;
  for (int64_t i = (int64_t)blockIdx.x * T64_THREADS + threadIdx.x; i < n; i += stride)
    m = fmaxf(m, fabsf(act_value<XD>(a, i / a.cols, i % a.cols)));
  m = block_max(m, red);
  if (threadIdx.x != 0) return;
  float *acc = reinterpret_cast<float *>(work);
  if (m >= 0.0f) atomic_fmax(acc, m);
  __threadfence();
  if (atomicAdd(work + 1, 1u) != gridDim.x - 1) return;
  __threadfence();
  const float v = bits_f32(atomicExch(work, 0u));
  *amax = v;
  *scale = scale_rule(v, fp8_max, a.power_2_scale, a.eps);
  work[1] = 0u;
}

/* After the tile cast (k_tile64 or k_cast16, same stream): the bias gradient, dbias[c] (+)= the sum
 * over tile rows y of dbias_partial[y][c], in double, in an order fixed by the shape alone, so
 * results repeat bit for bit. A block takes DB_COLS columns (one 32-byte sector of each partial
 * row) with DB_GROUPS row groups: thread (c, g) sums rows g, g + DB_GROUPS, ... into 4 running sums
 * (row y into acc[(y / DB_GROUPS) & 3]), added in order, then the groups are added pairwise in
 * shared memory (a fixed tree). Many short walks rather than one thread walking every tile row of a
 * column: the partials come from L2 and each walk is bound by its latency. A launch of its own: the
 * last tile of each column reducing it in the cast needed every tile to fence its partials and
 * count itself before going on (a fence and two barriers a tile). */
constexpr int DB_COLS = 8, DB_GROUPS = 32, DB_THREADS = DB_COLS * DB_GROUPS;
__global__ void __launch_bounds__(DB_THREADS) k_dbias_strips(TileArgs a) {
  if (a.skip && *a.skip) return;
  __shared__ double group_sum[DB_GROUPS][DB_COLS];
  const int c = threadIdx.x % DB_COLS, g = threadIdx.x / DB_COLS;
  const int64_t col = (int64_t)blockIdx.x * DB_COLS + c;
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  if (col < a.cols) {
    /* __ldcg: the cast's partials, read from L2; four steps unrolled, their sums in order */
#pragma unroll 4
    for (int64_t y = g, i = 0; y < a.tiles_r; y += DB_GROUPS, i++)
      acc[i & 3] += static_cast<double>(__ldcg(a.dbias_partial + y * a.cols + col));
  }
  group_sum[g][c] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  __syncthreads();
#pragma unroll
  for (int half = DB_GROUPS / 2; half > 0; half /= 2) {
    if (g < half) group_sum[g][c] += group_sum[g + half][c];
    __syncthreads();
  }
  if (g == 0 && col < a.cols) {
    const double before =
        a.dbias_accumulate ? static_cast<double>(lkc::ld_rt(a.dbias, a.dbias_dtype, col)) : 0.0;
    lkc::st_rt(a.dbias, a.dbias_dtype, col, static_cast<float>(before + group_sum[0][c]));
  }
}

/* Thread t of the block holds rows lr and lr + 32 of the tile, columns 16 cq .. 16 cq + 15
 * (lr = (lane & 7) + 8 warp, cq = lane >> 3: a warp loads 8 rows x 64 columns, and the two
 * halves of an MXFP8 block sit in lanes l and l ^ 8). In the column phase it takes column
 * t & 63, rows 32 (t >> 6) .. + 31. */
template <int XD, int OD, int MODE, bool VEC>
__global__ void __launch_bounds__(T64_THREADS, XD == LUTRA_F32 ? 4 : 5) k_tile64(TileArgs a) {
  if (a.skip && *a.skip) return;
  float *sm = reinterpret_cast<float *>(dyn_smem());
  uint8_t *tb = dyn_smem() + 64 * T64_LD * 4; /* [64][64] transposed codes, swizzled */
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int lr = (lane & 7) + 8 * warp, cq = lane >> 3;
  const int cc = t & 63, rb = t >> 6;
  const bool row_out = a.data != nullptr, col_out = a.col_data != nullptr;
  constexpr bool ACT = MODE == MODE_CAST_ACT;
  constexpr bool CAST = MODE == MODE_CAST || MODE == MODE_CAST_CODES || ACT;
  constexpr bool CODES = MODE == MODE_CAST_CODES;
  const float s = CAST ? *a.scale : 1.0f;
  uint32_t *codes = reinterpret_cast<uint32_t *>(dyn_smem()); /* CODES: [2][64][CODE_LDW] */
  int parity = 0;
  float m_loc = -INFINITY;   /* per-tensor amax of this thread's elements */
  __shared__ float dsum[64]; /* bias gradient: column sums of the tile's lower 32 rows */

  /* software pipeline: the loads of tile i + gridDim.x are issued before tile i is encoded */
  /* (MODE_CAST_ACT forms its values per element in the loop below instead) */
  RawUnit<XD> next[2];
  auto load_tile = [&](int64_t tile) {
    if (ACT) return;
    int64_t tr, tc;
    tile_coords(a, tile, tr, tc);
#pragma unroll
    for (int q = 0; q < 2; q++)
      load_raw<XD, VEC>(a, a.x, tr * 64 + lr + 32 * q, tc * 64 + 16 * cq, next[q]);
  };
  if (blockIdx.x < a.ntiles) load_tile(blockIdx.x);

  for (int64_t tile = blockIdx.x; tile < a.ntiles; tile += gridDim.x) {
    int64_t tr, tc;
    tile_coords(a, tile, tr, tc);
    const int64_t r0 = tr * 64, c0 = tc * 64, c = c0 + 16 * cq;
    float v[2][16];
#pragma unroll
    for (int q = 0; q < 2; q++) {
      if (ACT)
        act_unit<XD, VEC>(a, r0 + lr + 32 * q, c, v[q]);
      else
        unpack<XD>(next[q], v[q]);
    }
    if (tile + gridDim.x < a.ntiles) load_tile(tile + gridDim.x);

      /* rowwise */
#pragma unroll
    for (int q = 0; q < 2; q++) {
      const int64_t r = r0 + lr + 32 * q;
      if (CAST) {
        if (a.amax) { /* over the elements of x only */
          if (VEC) {
            if (r < a.rows && c < a.cols) {
#pragma unroll
              for (int k = 0; k < 16; k++)
                m_loc = fmaxf(m_loc, fabsf(v[q][k]));
            }
          } else {
#pragma unroll
            for (int k = 0; k < 16; k++)
              if (r < a.rows && c + k < a.cols) m_loc = fmaxf(m_loc, fabsf(v[q][k]));
          }
        }
        const uint4 w = encode16<OD>(v[q], s);
        if (row_out) store_row<VEC>(a, r, c, w);
        if (CODES && col_out) {
          uint32_t *d = codes + (parity * 64 + lr + 32 * q) * CODE_LDW + 4 * cq;
          d[0] = w.x;
          d[1] = w.y;
          d[2] = w.z;
          d[3] = w.w;
        }
      } else if (row_out) {
        float m = 0.0f;
#pragma unroll
        for (int k = 0; k < 16; k++)
          m = fmaxf(m, fabsf(v[q][k]));
        m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, 8));
        const uint32_t e = e8m0_bits(m * a.max_rcp);
        store_row<VEC>(a, r, c, encode16<OD>(v[q], mx_scale_rcp(e)));
        if ((cq & 1) == 0 && r < a.rows && c < a.cols)
          static_cast<uint8_t *>(a.scale_inv)[r * (a.cols / 32) + c / 32] = (uint8_t)e;
      }
    }

    /* columnwise, CODES: thread (quad qq, group g) reads columns 4 qq .. + 3 of rows 8 g .. + 7
     * (8 words, 2-way bank conflicts at most), transposes the bytes in registers and writes 8
     * bytes to each of the 4 transposed rows; the 8 lanes of one qq write 64 contiguous bytes
     * of each. The code tiles alternate, so a tile's writes never meet the previous tile's
     * reads: one barrier per tile. */
    if (CODES && col_out) {
      __syncthreads();
      const int g = lane & 7, qq = (lane >> 3) + 4 * warp;
      const uint32_t *src = codes + (parity * 64 + 8 * g) * CODE_LDW + qq;
      uint32_t lo[4], hi[4], w[4];
#pragma unroll
      for (int i = 0; i < 4; i++)
        w[i] = src[i * CODE_LDW];
      transpose4x4(w, lo);
#pragma unroll
      for (int i = 0; i < 4; i++)
        w[i] = src[(4 + i) * CODE_LDW];
      transpose4x4(w, hi);
      const int64_t rr = r0 + 8 * g;
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int64_t col = c0 + 4 * qq + e;
        if (col >= a.cols || rr >= a.rows) continue;
        uint8_t *d = a.col_data + col * a.rows + rr;
        if (VEC) { /* rows % 16 == 0: all 8 rows are in, and d is 8-byte aligned */
          *reinterpret_cast<uint2 *>(d) = make_uint2(lo[e], hi[e]);
        } else {
#pragma unroll
          for (int k = 0; k < 8; k++)
            if (rr + k < a.rows) d[k] = (uint8_t)((k < 4 ? lo[e] : hi[e]) >> (8 * (k & 3)));
        }
      }
      parity ^= 1;
    }

    /* columnwise */
    if (!CODES && col_out) {
      /* no barrier needed before these stores: the previous tile's reads of sm came before its
       * second barrier, which every thread has passed */
#pragma unroll
      for (int q = 0; q < 2; q++) {
        float4 *d = reinterpret_cast<float4 *>(sm + (lr + 32 * q) * T64_LD + 16 * cq);
#pragma unroll
        for (int k = 0; k < 4; k++)
          d[k] = make_float4(v[q][4 * k], v[q][4 * k + 1], v[q][4 * k + 2], v[q][4 * k + 3]);
      }
      __syncthreads();
      float u[2][16];
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int k = 0; k < 16; k++)
          u[h][k] = sm[(32 * rb + 16 * h + k) * T64_LD + cc];
      const int64_t col = c0 + cc, rbase = r0 + 32 * rb;
      float colsum = 0.0f; /* rows in order; the two halves are added in order below */
      if (a.dbias_partial) {
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
          for (int k = 0; k < 16; k++)
            colsum += u[h][k];
        if (rb == 1) dsum[cc] = colsum;
      }
      float sc = s;
      if (MODE == MODE_MX) {
        float m = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
          for (int k = 0; k < 16; k++)
            m = fmaxf(m, fabsf(u[h][k]));
        const uint32_t e = e8m0_bits(m * a.max_rcp);
        sc = mx_scale_rcp(e);
        if (col < a.cols && rbase < a.rows)
          static_cast<uint8_t *>(a.col_scale_inv)[col * (a.rows / 32) + rbase / 32] = (uint8_t)e;
      }
      /* the transposed codes: 16-byte chunk g of row j (g = 16-row group) sits at
       * tb + 64 j + 16 (g ^ ((j >> 1) & 3)), so that 8 consecutive lanes hit distinct bank
       * quads both here (8 rows j, one g) and in the reads below (2 rows j, 4 g) */
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int g = 2 * rb + h;
        *reinterpret_cast<uint4 *>(tb + 64 * cc + 16 * (g ^ ((cc >> 1) & 3))) =
            encode16<OD>(u[h], sc);
      }
      __syncthreads();
      /* dsum is rewritten only after the next tile's first barrier, which this thread passes
       * after reading it here */
      if (a.dbias_partial) {
        /* reduced by k_dbias_strips after this kernel */
        if (rb == 0 && col < a.cols) a.dbias_partial[tr * a.cols + col] = colsum + dsum[cc];
      }
      /* each thread writes 16 contiguous bytes: 4 lanes cover the 64 bytes of one transposed
       * row of the tile, a warp 8 rows per store */
#pragma unroll
      for (int i = 0; i < 2; i++) {
        const int unit = t + T64_THREADS * i, j = unit >> 2, g = unit & 3;
        const uint4 w = *reinterpret_cast<const uint4 *>(tb + 64 * j + 16 * (g ^ ((j >> 1) & 3)));
        store_col16<VEC>(a, c0 + j, r0 + 16 * g, w);
      }
    }
  }

  if (CAST) cast_finish(a, m_loc, s);
}

cudaError_t launch_tile64(const TileArgs &a, int x_dtype, int out_dtype, int mode, cudaStream_t s) {
  const bool vec = vec_ok(a);
  if (a.act) mode = MODE_CAST_ACT;
  if (mode == MODE_CAST && !a.dbias_partial) mode = MODE_CAST_CODES;
  const int smem = !a.col_data ? 0 : mode == MODE_CAST_CODES ? CODE_SMEM : T64_SMEM;
  return with_float_dtype(x_dtype, [&](auto xd) {
    return with_fp8_dtype(out_dtype, [&](auto od) {
      return with_bool(vec, [&](auto v) {
        constexpr int XD = decltype(xd)::value, OD = decltype(od)::value;
        constexpr bool V = decltype(v)::value;
        constexpr auto KC = k_tile64<XD, OD, MODE_CAST, V>;
        constexpr auto KB = k_tile64<XD, OD, MODE_CAST_CODES, V>;
        constexpr auto KM = k_tile64<XD, OD, MODE_MX, V>;
        constexpr auto KA = k_tile64<XD, OD, MODE_CAST_ACT, V>;
        if (mode == MODE_CAST_ACT)
          LKC_LAUNCH(KA, persistent_grid<KA>(a.ntiles, T64_THREADS, smem), T64_THREADS, smem, s, a);
        else if (mode == MODE_CAST_CODES)
          LKC_LAUNCH(KB, persistent_grid<KB>(a.ntiles, T64_THREADS, smem), T64_THREADS, smem, s, a);
        else if (mode == MODE_CAST)
          LKC_LAUNCH(KC, persistent_grid<KC>(a.ntiles, T64_THREADS, smem), T64_THREADS, smem, s, a);
        else
          LKC_LAUNCH(KM, persistent_grid<KM>(a.ntiles, T64_THREADS, smem), T64_THREADS, smem, s, a);
        return cudaGetLastError();
      });
    });
  });
}

/* A tiled quantization launched by `launch` (k_tile64's or k_cast16's, which set a.tiles_r),
 * and its bias gradient, when one is asked, reduced from the tiles' partials after it */
template <class Launch>
cudaError_t with_dbias(const lutra_quant_args *q, TileArgs &a, cudaStream_t s, Launch launch) {
  if (q->dbias) {
    if (!a.col_data || !q->dbias_scratch) return cudaErrorInvalidValue;
    a.dbias_partial = q->dbias_scratch;
    a.dbias = q->dbias;
    a.dbias_dtype = q->dbias_dtype;
    a.dbias_accumulate = q->dbias_accumulate;
  }
  cudaError_t e = launch();
  if (e != cudaSuccess || !q->dbias) return e;
  LKC_LAUNCH(k_dbias_strips, (unsigned)((a.cols + DB_COLS - 1) / DB_COLS), DB_THREADS, 0, s, a);
  return cudaGetLastError();
}

/* a tile64 quantization, with its bias gradient when one is asked */
cudaError_t launch_tile64_dbias(const lutra_quant_args *q, TileArgs &a, int mode, cudaStream_t s) {
  return with_dbias(q, a, s, [&] { return launch_tile64(a, q->x_dtype, q->out_dtype, mode, s); });
}

} // namespace

/* ---- launchers ------------------------------------------------------------------------------- */

cudaError_t lkc::cast_transpose(const lutra_quant_args *q, cudaStream_t s) {
  TileArgs a = tile_args(q, 64);
  a.data = static_cast<uint8_t *>(q->data);
  a.col_data = static_cast<uint8_t *>(q->col_data);
  a.scale = q->scale;
  a.amax = q->amax;
  a.cast_scale_inv = static_cast<float *>(q->scale_inv);
  a.cast_col_scale_inv = static_cast<float *>(q->col_scale_inv);
  a.act = q->act;
  a.act_kind = q->act_kind ? q->act_kind : LUTRA_ACT_GELU_TANH;
  a.act_forward = q->act_forward;
  a.act_out = q->act_out;
  /* the activation's cast stays on k_tile64: its values' arithmetic (GELU's gradient: expf and
   * an IEEE division an element) bounds it, not its bandwidth, and neither k_cast16's tiles nor
   * more k_tile64 blocks an SM made it faster (measured: the commit that added this) */
  if (!q->act && t128_ok(q, a, 16))
    return with_dbias(q, a, s, [&] { return launch_t128(a, q->x_dtype, q->out_dtype, false, s); });
  return launch_tile64_dbias(q, a, MODE_CAST, s);
}

extern "C" cudaError_t lk_quantize_mxfp8(const lutra_quant_args *q, cudaStream_t s) {
  if (!q || !is_float_dtype(q->x_dtype) || !is_fp8_dtype(q->out_dtype) || q->rows < 0 ||
      q->cols < 0)
    return cudaErrorInvalidValue;
  if ((q->data && !q->scale_inv) || (q->col_data && !q->col_scale_inv))
    return cudaErrorInvalidValue;
  const bool row_out = q->data && q->scale_inv, col_out = q->col_data && q->col_scale_inv;
  if ((row_out && q->cols % 32 != 0) || (col_out && q->rows % 32 != 0))
    return cudaErrorInvalidValue;
  if ((!row_out && !col_out) || q->rows == 0 || q->cols == 0) return cudaSuccess;
  if (!q->x) return cudaErrorInvalidValue;
  TileArgs a = tile_args(q, 64);
  block_outputs(a, q, row_out, col_out);
  a.max_rcp = 1.0f / (q->out_dtype == LUTRA_E4M3 ? 448.0f : 57344.0f);
  if (!q->dbias && t128_ok(q, a, 32)) return launch_t128(a, q->x_dtype, q->out_dtype, true, s);
  return launch_tile64_dbias(q, a, MODE_MX, s);
}

extern "C" cudaError_t lk_current_scale_act(const lutra_quant_args *q, float fp8_max, float *amax,
                                            float *scale, uint32_t *work, cudaStream_t s) {
  if (!q || !q->act || !is_float_dtype(q->x_dtype) || q->rows < 0 || q->cols < 0 || !amax ||
      !scale || !work || q->act_kind < 0 || q->act_kind >= LUTRA_ACT_COUNT ||
      (!q->act_forward && !q->x))
    return cudaErrorInvalidValue;
  TileArgs a = tile_args(q, 64);
  a.act = q->act;
  a.act_kind = q->act_kind ? q->act_kind : LUTRA_ACT_GELU_TANH;
  a.act_forward = q->act_forward;
  a.power_2_scale = q->power_2_scale;
  a.eps = q->amax_epsilon;
  /* n == 0 still launches (one block): amax 0 and its scale are written */
  const int64_t blocks = (q->rows * q->cols + T64_THREADS - 1) / T64_THREADS;
  return with_float_dtype(q->x_dtype, [&](auto xd) {
    constexpr auto K = k_current_scale_act<decltype(xd)::value>;
    LKC_LAUNCH(K, persistent_grid<K>(blocks > 0 ? blocks : 1, T64_THREADS, 0), T64_THREADS, 0, s, a,
               fp8_max, amax, scale, work);
    return cudaGetLastError();
  });
}
