/* GroupedLinear's split quantization on the device (the CPU reference is
 * src/backend/cpu/grouped_cpu.c): every expert's rows of one matrix, or every expert's weight,
 * quantized with the expert's own scale in a constant number of launches whatever the number of
 * experts (delayed scaling: one; current scaling: two), the row counts read from device memory
 * and each expert padded with zero rows to the packed layout of src/backend/grouped_layout.h
 * inside the kernels:
 *   k_amax   current scaling: max|x| of each expert (16-row tiles, one atomic per tile) into the
 *            expert's two work words, which are zero between calls
 *   k_cast   the FP8 codes, rowwise and each expert's transpose, of 16-row tiles (padding rows
 *            encode zero); an expert's first tile writes its scale_inv (and its scale), its last
 *            (current scaling) publishes the amax and zeroes the work words again
 *   k_dbias  each expert's column sums in double, rows in order (the CPU's bias_grad order)
 * Each block's first thread scans the splits (O(num_gemms)) for its expert's offsets and checks
 * them: bad splits (a split < 0, or a sum other than the rows) set *bad_split from block 0 and
 * every block returns without writing. A 16-row tile never straddles two experts: padded
 * offsets are multiples of 16. Per-tensor scaling only (delayed and current); the block-scaled
 * recipes are refused by the backend on this path. Codes and scales are bit for bit the CPU's
 * (common.cuh's conversions; tools/sim_grouped_quantize.cpp checks the kernels on the CPU). */
#include "act_cast.cuh"
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
  uint32_t *work; /* current scaling: expert e's accumulator and tile count at work[4 e] */
  /* lutra_grouped_quant_args.act: the values quantized are lkact::act_value's of the rows */
  const void *act;
  int act_kind, act_forward;
  void *act_out;
};

/* Where a block's rows are, from its first thread's scan of the splits. */
struct Where {
  int ok, e;          /* the splits are good; the expert (-1: none) */
  int64_t R, P, s, p; /* its rows before it, padded rows before it, rows, padded rows */
};

/* the expert holding padded row prow (e_fixed < 0), or expert e_fixed */
__device__ void locate(const GroupedQuant &a, int64_t prow, int e_fixed, Where *w) {
  int64_t r = 0, p = 0;
  w->ok = 1;
  w->e = -1;
  for (int e = 0; e < a.num; e++) {
    const int64_t s = a.splits ? (int64_t)a.splits[e] : a.rows_each;
    if (s < 0) {
      w->ok = 0;
      continue;
    }
    const int64_t pe = (s + a.align - 1) / a.align * a.align;
    if (w->e < 0 && (e_fixed >= 0 ? e == e_fixed : prow < p + pe)) {
      w->e = e;
      w->R = r, w->P = p, w->s = s, w->p = pe;
    }
    r += s;
    p += pe;
  }
  if (a.splits && r != a.total_rows) w->ok = 0;
}

template <int XD>
__device__ __forceinline__ float load_row(const GroupedQuant &a, const Where &w, int64_t r,
                                          int64_t c) {
  if (a.act) return lkact::act_value<XD>(a, w.R + r, c); /* token rows only */
  const void *base = a.xs ? a.xs[w.e] : a.x;
  const int64_t row = a.xs ? r : w.R + r;
  return load1<XD>(base, row * a.cols + c);
}

template <int XD> __global__ void __launch_bounds__(THREADS) k_amax(GroupedQuant a) {
  if (a.skip && *a.skip) return;
  __shared__ Where w;
  const int64_t prow0 = (int64_t)blockIdx.x * TILE_ROWS;
  if (threadIdx.x == 0) locate(a, prow0, -1, &w);
  __syncthreads();
  if (!w.ok || w.e < 0) return; /* uniform per block */
  const int64_t r0 = prow0 - w.P, rows = w.s - r0 < TILE_ROWS ? w.s - r0 : TILE_ROWS;
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < rows * a.cols; i += THREADS)
    m = fmaxf(m, fabsf(load_row<XD>(a, w, r0 + i / a.cols, i % a.cols)));
  __shared__ float red[32];
  m = block_max(m, red);
  if (threadIdx.x == 0 && rows > 0) atomic_fmax(reinterpret_cast<float *>(a.work + 4 * w.e), m);
}

template <int XD, int OD> __global__ void __launch_bounds__(THREADS) k_cast(GroupedQuant a) {
  if (a.skip && *a.skip) return;
  __shared__ Where w;
  const int64_t prow0 = (int64_t)blockIdx.x * TILE_ROWS;
  if (threadIdx.x == 0) {
    locate(a, prow0, -1, &w);
    if (blockIdx.x == 0 && !w.ok && a.bad_split) *a.bad_split = 1;
    /* an expert without rows has no tile: block 0 gives it the CPU's zero amax */
    if (blockIdx.x == 0 && w.ok && a.current && a.amax)
      for (int e = 0; e < a.num; e++)
        if ((a.splits ? (int64_t)a.splits[e] : a.rows_each) == 0)
          a.amax[(int64_t)e * a.amax_stride] = 0.0f;
  }
  __syncthreads();
  if (!w.ok || w.e < 0) return;
  const int e = w.e;
  const int64_t P0 = w.P, p = w.p, r0 = prow0 - P0, s = w.s;
  const float acc = a.current ? bits_f32(a.work[4 * e]) : 0.0f;
  const float sc = a.current ? scale_rule(acc, a.fp8_max, a.power_2_scale, a.eps) : a.scale[4 * e];
  const int64_t cols = a.cols;
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < TILE_ROWS * cols; i += THREADS) {
    const int64_t r = r0 + i / cols, c = i % cols;
    const float v = r < s ? load_row<XD>(a, w, r, c) : 0.0f;
    if (a.act_out && r < s) store1<XD>(a.act_out, (w.R + r) * cols + c, v);
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
  __syncthreads(); /* every thread has read the work words before they are cleared below */
  if (threadIdx.x != 0) return;
  if (r0 == 0) {
    const float inv = div_x86(1.0f, sc);
    if (a.scale_inv) a.scale_inv[16 * e] = inv;
    if (a.col_scale_inv) a.col_scale_inv[16 * e] = inv;
    if (a.current) a.scale[4 * e] = sc;
  }
  if (a.current) { /* the expert's last tile to finish publishes the amax, clears the words */
    __threadfence();
    if (atomicAdd(a.work + 4 * e + 1, 1u) == (unsigned)(p / TILE_ROWS) - 1) {
      if (a.amax) a.amax[(int64_t)e * a.amax_stride] = acc;
      a.work[4 * e] = 0u;
      a.work[4 * e + 1] = 0u;
    }
  }
}

template <int XD> __global__ void __launch_bounds__(128) k_dbias(GroupedQuant a) {
  if (a.skip && *a.skip) return;
  __shared__ Where w;
  if (threadIdx.x == 0) locate(a, 0, (int)blockIdx.y, &w);
  __syncthreads();
  const int64_t c = (int64_t)blockIdx.x * 128 + threadIdx.x;
  if (c >= a.cols || !w.ok) return;
  void *db = a.dbias[w.e];
  double acc = a.dbias_accumulate ? (double)load1_any(db, a.dbias_dtype, c) : 0.0;
  for (int64_t r = w.R; r < w.R + w.s; r++)
    acc += (double)(a.act ? lkact::act_value<XD>(a, r, c) : load1<XD>(a.x, r * a.cols + c));
  store1_any(db, a.dbias_dtype, c, (float)acc);
}

} // namespace

extern "C" cudaError_t lk_grouped_quantize(const lutra_grouped_quant_args *q, int64_t rows_cap,
                                           cudaStream_t st) {
  if (q->kind != LUTRA_QUANT_DELAYED && q->kind != LUTRA_QUANT_CURRENT)
    return cudaErrorNotSupported;
  if (q->act && (q->xs || q->act_kind <= LUTRA_ACT_NONE || q->act_kind >= LUTRA_ACT_COUNT ||
                 (!q->act_forward && !q->x)))
    return cudaErrorInvalidValue;
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
  a.work = q->work;
  a.act = q->act;
  a.act_kind = q->act_kind;
  a.act_forward = q->act_forward;
  a.act_out = q->act_out;
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

/* the bias gradient of a high-precision backward: each expert's column sums of dy */
extern "C" cudaError_t lk_grouped_dbias(const void *dy, int dtype, int64_t rows, int64_t cols,
                                        int num, const int32_t *splits, void *const *db,
                                        int db_dtype, int accumulate, cudaStream_t st) {
  GroupedQuant a{};
  a.x = dy;
  a.splits = splits;
  a.total_rows = rows;
  a.cols = cols;
  a.num = num;
  a.align = 1;
  a.dbias = db;
  a.dbias_dtype = db_dtype;
  a.dbias_accumulate = accumulate;
  return with_float_dtype(dtype, [&](auto xd) {
    constexpr int XD = decltype(xd)::value;
    dim3 grid((unsigned)((cols + 127) / 128), (unsigned)num);
    LKC_LAUNCH(k_dbias<XD>, grid, 128, 0, st, a);
    return cudaGetLastError();
  });
}
