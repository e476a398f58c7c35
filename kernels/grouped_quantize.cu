/* GroupedLinear's split quantization on the device (the CPU reference is
 * src/backend/cpu/grouped_cpu.c): every expert's rows of one matrix, or every expert's weight,
 * quantized with the expert's own scale in a constant number of launches whatever the number of
 * experts, the row counts read from device memory and each expert padded with zero rows to the
 * packed layout of src/backend/grouped_layout.h inside the kernels:
 *   k_offsets   one thread: the prefix sums of the splits (rows and padded rows) into scratch,
 *               the split check (a bad split sets *bad_split and leaves no work for the others),
 *               current scaling's amax slots zeroed
 *   k_amax      current scaling: max|x| of each expert (16-row tiles, one atomic per tile)
 *   k_cast      the FP8 codes, rowwise and each expert's transpose, of 16-row tiles (padding
 *               rows encode zero); an expert's first tile writes its scale_inv (and, under
 *               current scaling, its scale)
 *   k_dbias     each expert's column sums in double, rows in order (the CPU's bias_grad order)
 * A 16-row tile never straddles two experts: padded offsets are multiples of 16. Per-tensor
 * scaling only (delayed and current); the block-scaled recipes are refused by the backend on
 * this path. Codes and scales are bit for bit the CPU's (common.cuh's conversions). */
#include "common.cuh"
#include "grouped_kernels.h"

#include "backend/grouped_layout.h"

namespace {

using namespace lkc;

constexpr int THREADS = 256;

__device__ __forceinline__ float load1_any(const void *p, int dtype, int64_t i) {
  return dtype == LUTRA_F32    ? load1<LUTRA_F32>(p, i)
         : dtype == LUTRA_BF16 ? load1<LUTRA_BF16>(p, i)
                               : load1<LUTRA_F16>(p, i);
}

__device__ __forceinline__ void store1_any(void *p, int dtype, int64_t i, float v) {
  if (dtype == LUTRA_F32)
    store1<LUTRA_F32>(p, i, v);
  else if (dtype == LUTRA_BF16)
    store1<LUTRA_BF16>(p, i, v);
  else
    store1<LUTRA_F16>(p, i, v);
}
constexpr int TILE_ROWS = 16;

struct GroupedQuant {
  const void *x;
  const void *const *xs;
  const int32_t *splits;
  int32_t *bad_split;
  int64_t total_rows, cols, rows_each;
  int num, align, current, power_2_scale;
  float fp8_max, eps;
  uint8_t *data, *col_data;
  float *scale_inv, *col_scale_inv;
  float *scale, *amax;
  int amax_stride;
  void *const *dbias;
  int dbias_dtype, dbias_accumulate;
  const int32_t *skip;
  int64_t *R, *P; /* scratch: [num + 1] each */
  int64_t *ok;    /* scratch: the splits were good */
};

__global__ void k_offsets(GroupedQuant a) {
  if (a.skip && *a.skip) return;
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  int64_t r = 0, p = 0;
  bool ok = true;
  a.R[0] = a.P[0] = 0;
  for (int e = 0; e < a.num; e++) {
    const int64_t s = a.splits ? (int64_t)a.splits[e] : a.rows_each;
    if (s < 0) ok = false;
    r += s < 0 ? 0 : s;
    p += s < 0 ? 0 : (s + a.align - 1) / a.align * a.align;
    a.R[e + 1] = r;
    a.P[e + 1] = p;
  }
  if (a.splits && r != a.total_rows) ok = false;
  *a.ok = ok;
  if (!ok) {
    if (a.bad_split) *a.bad_split = 1;
    for (int e = 0; e <= a.num; e++) /* no expert has rows: every later kernel does nothing */
      a.R[e] = a.P[e] = 0;
    return;
  }
  if (a.current && a.amax)
    for (int e = 0; e < a.num; e++)
      a.amax[(int64_t)e * a.amax_stride] = 0.0f;
}

/* the expert whose padded rows hold padded row prow (prow < P[num]) */
__device__ __forceinline__ int expert_of(const int64_t *P, int num, int64_t prow) {
  int lo = 0, hi = num;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (P[mid] <= prow)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

template <int XD>
__device__ __forceinline__ float load_row(const GroupedQuant &a, int e, int64_t r, int64_t c) {
  const void *base = a.xs ? a.xs[e] : a.x;
  const int64_t row = a.xs ? r : a.R[e] + r;
  return load1<XD>(base, row * a.cols + c);
}

template <int XD> __global__ void __launch_bounds__(THREADS) k_amax(GroupedQuant a) {
  if (a.skip && *a.skip) return;
  const int64_t prow0 = (int64_t)blockIdx.x * TILE_ROWS;
  if (prow0 >= a.P[a.num]) return; /* uniform per block */
  const int e = expert_of(a.P, a.num, prow0);
  const int64_t r0 = prow0 - a.P[e], s = a.R[e + 1] - a.R[e];
  const int64_t rows = s - r0 < TILE_ROWS ? s - r0 : TILE_ROWS;
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < rows * a.cols; i += THREADS)
    m = fmaxf(m, fabsf(load_row<XD>(a, e, r0 + i / a.cols, i % a.cols)));
  __shared__ float red[32];
  m = block_max(m, red);
  if (threadIdx.x == 0 && rows > 0) atomic_fmax(a.amax + (int64_t)e * a.amax_stride, m);
}

template <int XD, int OD> __global__ void __launch_bounds__(THREADS) k_cast(GroupedQuant a) {
  if (a.skip && *a.skip) return;
  const int64_t prow0 = (int64_t)blockIdx.x * TILE_ROWS;
  if (prow0 >= a.P[a.num]) return;
  const int e = expert_of(a.P, a.num, prow0);
  const int64_t P0 = a.P[e], p = a.P[e + 1] - P0, r0 = prow0 - P0, s = a.R[e + 1] - a.R[e];
  const float sc =
      a.current ? scale_rule(a.amax[(int64_t)e * a.amax_stride], a.fp8_max, a.power_2_scale, a.eps)
                : a.scale[4 * e];
  const int64_t cols = a.cols;
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < TILE_ROWS * cols; i += THREADS) {
    const int64_t r = r0 + i / cols, c = i % cols;
    const float v = r < s ? load_row<XD>(a, e, r, c) : 0.0f;
    m = fmaxf(m, fabsf(v));
    const uint8_t code = (uint8_t)encode1<OD>(v, sc);
    if (a.data) a.data[(P0 + r) * cols + c] = code;
    if (a.col_data) a.col_data[P0 * cols + c * p + r] = code;
  }
  if (!a.current && a.amax) { /* delayed scaling: this step's amax slot, max-accumulated */
    __shared__ float red[32];
    m = block_max(m, red);
    if (threadIdx.x == 0) atomic_fmax(a.amax + (int64_t)e * a.amax_stride, m);
  }
  if (threadIdx.x == 0 && r0 == 0) {
    const float inv = div_x86(1.0f, sc);
    if (a.scale_inv) a.scale_inv[16 * e] = inv;
    if (a.col_scale_inv) a.col_scale_inv[16 * e] = inv;
    if (a.current) a.scale[4 * e] = sc;
  }
}

template <int XD> __global__ void __launch_bounds__(128) k_dbias(GroupedQuant a) {
  if (a.skip && *a.skip) return;
  const int e = blockIdx.y;
  const int64_t c = (int64_t)blockIdx.x * 128 + threadIdx.x;
  if (c >= a.cols || !*a.ok) return;
  void *db = a.dbias[e];
  double acc = a.dbias_accumulate ? (double)load1_any(db, a.dbias_dtype, c) : 0.0;
  for (int64_t r = a.R[e]; r < a.R[e + 1]; r++)
    acc += (double)load1<XD>(a.x, r * a.cols + c);
  store1_any(db, a.dbias_dtype, c, (float)acc);
}

} // namespace

extern "C" cudaError_t lk_grouped_quantize(const lutra_grouped_quant_args *q, int64_t rows_cap,
                                           cudaStream_t st) {
  if (q->kind != LUTRA_QUANT_DELAYED && q->kind != LUTRA_QUANT_CURRENT)
    return cudaErrorNotSupported;
  GroupedQuant a;
  a.x = q->x;
  a.xs = q->xs;
  a.splits = q->xs ? nullptr : q->splits;
  a.bad_split = q->bad_split;
  a.total_rows = q->total_rows;
  a.cols = q->cols;
  a.rows_each = q->rows_each;
  a.num = q->num;
  a.align = q->out.align;
  a.current = q->kind == LUTRA_QUANT_CURRENT;
  a.power_2_scale = q->power_2_scale;
  a.fp8_max = q->fp8_max;
  a.eps = q->amax_epsilon;
  a.data = static_cast<uint8_t *>(q->out.data);
  a.col_data = static_cast<uint8_t *>(q->out.col_data);
  a.scale_inv = static_cast<float *>(q->out.scale_inv);
  a.col_scale_inv = static_cast<float *>(q->out.col_scale_inv);
  a.scale = q->scale;
  a.amax = q->amax;
  a.amax_stride = q->amax_stride;
  a.dbias = q->dbias;
  a.dbias_dtype = q->dbias_dtype;
  a.dbias_accumulate = q->dbias_accumulate;
  a.skip = q->skip;
  a.R = lk_grouped_row_offsets(q->scratch, q->num);
  a.P = a.R + (q->num + 1);
  a.ok = lk_grouped_splits_ok(q->scratch, q->num);
  LKC_LAUNCH(k_offsets, 1, 1, 0, st, a);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const unsigned tiles = grid_for(rows_cap, TILE_ROWS, 0x7FFFFFFF);
  return with_float_dtype(q->x_dtype, [&](auto xd) {
    constexpr int XD = decltype(xd)::value;
    if (a.current) LKC_LAUNCH(k_amax<XD>, tiles, THREADS, 0, st, a);
    cudaError_t e = with_fp8_dtype(q->out.dtype, [&](auto od) {
      constexpr int OD = decltype(od)::value;
      if (a.data || a.col_data || a.amax) LKC_LAUNCH((k_cast<XD, OD>), tiles, THREADS, 0, st, a);
      return cudaGetLastError();
    });
    if (e != cudaSuccess || !a.dbias || a.xs) return e;
    dim3 grid((unsigned)((a.cols + 127) / 128), (unsigned)a.num);
    LKC_LAUNCH(k_dbias<XD>, grid, 128, 0, st, a);
    return cudaGetLastError();
  });
}

/* the bias gradient of a high-precision backward: each expert's column sums of dy, with the row
 * offsets a grouped call before it left in scratch */
extern "C" cudaError_t lk_grouped_dbias(const void *dy, int dtype, int64_t cols, int num,
                                        void *scratch, void *const *db, int db_dtype,
                                        int accumulate, cudaStream_t st) {
  GroupedQuant a{};
  a.x = dy;
  a.cols = cols;
  a.num = num;
  a.dbias = db;
  a.dbias_dtype = db_dtype;
  a.dbias_accumulate = accumulate;
  a.R = lk_grouped_row_offsets(scratch, num);
  a.P = a.R + (num + 1);
  a.ok = lk_grouped_splits_ok(scratch, num);
  return with_float_dtype(dtype, [&](auto xd) {
    constexpr int XD = decltype(xd)::value;
    dim3 grid((unsigned)((cols + 127) / 128), (unsigned)num);
    LKC_LAUNCH(k_dbias<XD>, grid, 128, 0, st, a);
    return cudaGetLastError();
  });
}
