/* Rowwise scaling (lutra/formats.h; torchao's ROWWISE): each row of the rowwise copy, and each
 * row of the columnwise (transposed) copy, i.e. each column of x, gets its own f32 scale from
 * its own amax by current scaling's rule (scale_rule, TransformerEngine's
 * compute_scale_from_amax). Matches lutra_cpu_quantize_rowwise (src/backend/cpu/rowwise_cpu.c)
 * bit for bit: a max does not depend on the order it is taken in, each code is the encoding of
 * one f32 product x * scale, and scale_inv is one f32 division.
 *
 * The rowwise copy: one warp per row, two passes over the row (its amax, then the codes; the
 * second pass finds the row in L1/L2), 16-element units where the rows allow it.
 * The columnwise copy, in four launches:
 *   1. col_scale_inv zeroed (it holds each column's amax until the last launch),
 *   2. the column amaxes: each block takes the maxima of 64 columns over a slice of the rows and
 *      merges them with an atomic maximum on the f32 bits (non-negative values: the integer
 *      maximum is the float maximum, so the result does not depend on the blocks' order),
 *   3. the cast: 64x64 tiles through shared memory, each written transposed into [cols][rows]
 *      with consecutive threads storing consecutive words (or bytes) of one output row,
 *   4. col_scale_inv[c] = 1 / scale_rule(amax[c]), replacing the amax.
 * Every launch reads skip (TE's noop flag) first and writes nothing when it is set. */
#include "common/codec.cuh"
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"
#include "common/reduce.cuh"
#include "common/scale.cuh"

using namespace lkc;

namespace {

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int TILE = 64;           /* the columnwise tiles: TILE x TILE */
constexpr int AMAX_ROW_LANES = 4;  /* the amax pass: 64 columns x 4 row lanes per block */
constexpr int AMAX_ROWS = 256;     /* rows one amax block covers at least */
constexpr int64_t MAX_SLICES = 64; /* amax blocks per column strip at most */

struct RowwiseArgs {
  const void *x;
  uint8_t *data, *col_data;
  float *scale_inv, *col_scale_inv;
  int64_t rows, cols;
  float fp8_max, epsilon;
  int power_2_scale;
  const int32_t *skip;
};

__device__ __forceinline__ bool skipped(const RowwiseArgs &a) {
  return a.skip && *a.skip;
}

/* ---- the rowwise copy --------------------------------------------------------------------------
 */

/* VEC: cols % 16 == 0 and x, data 16-byte aligned, so every row starts aligned */
template <int DT, int OD, bool VEC>
__global__ void __launch_bounds__(THREADS) k_rows(const RowwiseArgs a) {
  if (skipped(a)) return;
  const int lane = threadIdx.x & 31;
  const int64_t warp = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
  const int64_t nwarps = (int64_t)gridDim.x * WARPS, cols = a.cols;
  for (int64_t r = warp; r < a.rows; r += nwarps) { /* uniform per warp: the shuffles are safe */
    const int64_t base = r * cols;
    float m = 0.0f;
    if (VEC) {
      for (int64_t u = lane; u < cols / 16; u += 32) {
        float v[16];
        ldv<DT, 16>(a.x, base + u * 16, v);
#pragma unroll
        for (int k = 0; k < 16; k++)
          m = fmaxf(m, fabsf(v[k]));
      }
    } else {
      for (int64_t c = lane; c < cols; c += 32)
        m = fmaxf(m, fabsf(ld<DT>(a.x, base + c)));
    }
    m = warp_max(m);
    const float s = scale_rule(m, a.fp8_max, a.power_2_scale, a.epsilon);
    if (VEC) {
      for (int64_t u = lane; u < cols / 16; u += 32) {
        float v[16];
        ldv<DT, 16>(a.x, base + u * 16, v);
        *reinterpret_cast<uint4 *>(a.data + base + u * 16) = encode16<OD>(v, s);
      }
    } else {
      for (int64_t c = lane; c < cols; c += 32)
        a.data[base + c] = (uint8_t)encode1<OD>(ld<DT>(a.x, base + c), s);
    }
    if (lane == 0) a.scale_inv[r] = div_x86(1.0f, s);
  }
}

/* ---- the columnwise copy -----------------------------------------------------------------------
 */

__global__ void __launch_bounds__(THREADS) k_col_zero(const RowwiseArgs a) {
  if (skipped(a)) return;
  for (int64_t c = (int64_t)blockIdx.x * THREADS + threadIdx.x; c < a.cols;
       c += (int64_t)gridDim.x * THREADS)
    a.col_scale_inv[c] = 0.0f;
}

/* grid (column strips of TILE, row slices): thread (column lane, row lane) */
template <int DT> __global__ void __launch_bounds__(THREADS) k_col_amax(const RowwiseArgs a) {
  if (skipped(a)) return;
  __shared__ float part[AMAX_ROW_LANES][TILE];
  const int cl = threadIdx.x % TILE, rl = threadIdx.x / TILE;
  const int64_t c = (int64_t)blockIdx.x * TILE + cl;
  const int64_t per = (a.rows + gridDim.y - 1) / gridDim.y;
  const int64_t r0 = (int64_t)blockIdx.y * per;
  const int64_t r1 = r0 + per < a.rows ? r0 + per : a.rows;
  float m = 0.0f;
  if (c < a.cols)
    for (int64_t r = r0 + rl; r < r1; r += AMAX_ROW_LANES)
      m = fmaxf(m, fabsf(ld<DT>(a.x, r * a.cols + c)));
  part[rl][cl] = m;
  __syncthreads();
  if (rl == 0 && c < a.cols) {
    for (int k = 1; k < AMAX_ROW_LANES; k++)
      m = fmaxf(m, part[k][cl]);
    if (m > 0.0f) atomic_fmax(&a.col_scale_inv[c], m);
  }
}

/* grid (column tiles, row tiles): the TILE x TILE tile at (r0, c0), codes of column c of x in
 * row c of col_data; col_scale_inv still holds the amaxes. WORDS (rows % 4 == 0, col_data 4-byte
 * aligned): each thread encodes 4 consecutive bytes of an output row and stores them as one
 * word, 16 threads per output row of the tile; else one byte per thread. */
template <int DT, int OD, bool WORDS>
__global__ void __launch_bounds__(THREADS) k_col_cast(const RowwiseArgs a) {
  if (skipped(a)) return;
  __shared__ float tile[TILE][TILE + 1];
  __shared__ float scale[TILE];
  const int64_t c0 = (int64_t)blockIdx.x * TILE, r0 = (int64_t)blockIdx.y * TILE;
  const int t = threadIdx.x;
  if (t < TILE && c0 + t < a.cols)
    scale[t] = scale_rule(a.col_scale_inv[c0 + t], a.fp8_max, a.power_2_scale, a.epsilon);
  /* loads along x's rows: thread t reads column t % TILE of rows t / TILE, + 4, ... */
  for (int i = t; i < TILE * TILE; i += THREADS) {
    const int tr = i / TILE, tc = i % TILE;
    const int64_t r = r0 + tr, c = c0 + tc;
    if (r < a.rows && c < a.cols) tile[tr][tc] = ld<DT>(a.x, r * a.cols + c);
  }
  __syncthreads();
  if (WORDS) {
    /* rows % 4 == 0: a word of 4 rows lies wholly inside or outside the matrix */
    constexpr int PER_ROW = TILE / 4;
    for (int i = t; i < TILE * PER_ROW; i += THREADS) {
      const int tc = i / PER_ROW, tr = (i % PER_ROW) * 4;
      const int64_t r = r0 + tr, c = c0 + tc;
      if (r < a.rows && c < a.cols) {
        uint32_t w = 0;
#pragma unroll
        for (int k = 0; k < 4; k++)
          w |= encode1<OD>(tile[tr + k][tc], scale[tc]) << (8 * k);
        *reinterpret_cast<uint32_t *>(a.col_data + c * a.rows + r) = w;
      }
    }
  } else {
    /* stores along col_data's rows: thread t writes byte t % TILE of output rows t / TILE, + 4 */
    for (int i = t; i < TILE * TILE; i += THREADS) {
      const int tc = i / TILE, tr = i % TILE;
      const int64_t r = r0 + tr, c = c0 + tc;
      if (r < a.rows && c < a.cols)
        a.col_data[c * a.rows + r] = (uint8_t)encode1<OD>(tile[tr][tc], scale[tc]);
    }
  }
}

__global__ void __launch_bounds__(THREADS) k_col_finish(const RowwiseArgs a) {
  if (skipped(a)) return;
  for (int64_t c = (int64_t)blockIdx.x * THREADS + threadIdx.x; c < a.cols;
       c += (int64_t)gridDim.x * THREADS)
    a.col_scale_inv[c] =
        div_x86(1.0f, scale_rule(a.col_scale_inv[c], a.fp8_max, a.power_2_scale, a.epsilon));
}

template <int DT, int OD> cudaError_t launch(const RowwiseArgs &r, cudaStream_t s) {
  const int64_t rows = r.rows, cols = r.cols;
  if (r.data && rows > 0) {
    const bool vec = cols % 16 == 0 && aligned(r.x, 16) && aligned(r.data, 16);
    cudaError_t e = with_bool(vec, [&](auto v) {
      constexpr auto K = k_rows<DT, OD, decltype(v)::value>;
      LKC_LAUNCH(K, persistent_grid<K>((rows + WARPS - 1) / WARPS, THREADS, 0), THREADS, 0, s, r);
      return cudaGetLastError();
    });
    if (e != cudaSuccess) return e;
  }
  if (!r.col_data || cols == 0) return cudaSuccess;
  const unsigned flat = grid_for(cols, THREADS, 4096);
  LKC_LAUNCH(k_col_zero, flat, THREADS, 0, s, r);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  if (rows > 0) {
    const unsigned strips = grid_for(cols, TILE, 0x7FFFFFFF);
    const unsigned slices = grid_for(rows, AMAX_ROWS, MAX_SLICES);
    LKC_LAUNCH(k_col_amax<DT>, dim3(strips, slices), THREADS, 0, s, r);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    const bool words = rows % 4 == 0 && ((uintptr_t)r.col_data & 3u) == 0;
    e = with_bool(words, [&](auto w) {
      constexpr auto K = k_col_cast<DT, OD, decltype(w)::value>;
      LKC_LAUNCH(K, dim3(strips, (unsigned)((rows + TILE - 1) / TILE)), THREADS, 0, s, r);
      return cudaGetLastError();
    });
    if (e != cudaSuccess) return e;
  }
  LKC_LAUNCH(k_col_finish, flat, THREADS, 0, s, r);
  return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t lk_quantize_rowwise(const lutra_quant_args *a, cudaStream_t s) {
  if (!a || !is_float_dtype(a->x_dtype) || !is_fp8_dtype(a->out_dtype) || a->rows < 0 ||
      a->cols < 0 || a->dbias || a->act)
    return cudaErrorInvalidValue;
  if ((a->data && !a->scale_inv) || (a->col_data && !a->col_scale_inv) ||
      (!a->x && a->rows > 0 && a->cols > 0))
    return cudaErrorInvalidValue;
  /* the columnwise tiles' grid: at most 65535 row tiles */
  if (a->col_data && (a->rows + TILE - 1) / TILE > 0xFFFF) return cudaErrorInvalidValue;
  RowwiseArgs r;
  r.x = a->x;
  r.data = static_cast<uint8_t *>(a->data);
  r.col_data = static_cast<uint8_t *>(a->col_data);
  r.scale_inv = static_cast<float *>(a->scale_inv);
  r.col_scale_inv = static_cast<float *>(a->col_scale_inv);
  r.rows = a->rows;
  r.cols = a->cols;
  r.fp8_max = a->out_dtype == LUTRA_E4M3 ? 448.0f : 57344.0f;
  r.epsilon = a->amax_epsilon;
  r.power_2_scale = a->power_2_scale;
  r.skip = a->skip;
  return with_float_dtype(a->x_dtype, [&](auto xd) {
    return with_fp8_dtype(a->out_dtype, [&](auto od) {
      return launch<decltype(xd)::value, decltype(od)::value>(r, s);
    });
  });
}
