/* MSE and softmax cross-entropy (kernels.h). Semantics: lutra_cpu_mse and
 * lutra_cpu_softmax_xent (src/backend/cpu/loss_cpu.c): f32 element math, double accumulation of the
 * loss, loss = (float)(sum / count).
 *
 * The mean is deterministic and takes one launch: each block writes one double partial (its
 * share of the work depends only on the shape, and every sum inside a block is a fixed tree)
 * into the caller's scratch (lk_scratch: one per stream; device globals were shared by every
 * stream, so two threads' losses mixed their partials and arrival counts); the last block to
 * finish adds the partials in a fixed order and writes *loss. No host synchronization, no
 * allocation. */
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"
#include "common/reduce.cuh"

using namespace lkc;

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxPartials = LK_LOSS_PARTIALS; /* pass-1 grid cap */

/* Called by every thread of every block once its block's partial is written: the last block to
 * arrive sets *loss = (float)(sum(partial[0 .. gridDim.x)) / divisor), thread i adding partials i,
 * i + kThreads, ... in order, then a block sum, so the result does not depend on which block is
 * last; one launch per loss instead of two. */
__device__ void mean_by_last_block(const double *partial, unsigned *done, double divisor,
                                   float *loss) {
  __shared__ double red[kWarps];
  __shared__ bool last;
  __threadfence(); /* this block's partial is visible before it is counted */
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  double s = 0.0;
  for (unsigned i = threadIdx.x; i < gridDim.x; i += kThreads)
    s += __ldcg(partial + i);
  s = block_sum<kThreads>(s, red);
  if (threadIdx.x == 0) {
    *loss = static_cast<float>(s / divisor);
    *done = 0;
  }
}

/* ---- MSE ------------------------------------------------------------------------------- */

/* sum (pred - target)^2 over this block's elements into partial[blockIdx.x];
 * dpred = scale * (pred - target) when not NULL (scale = 2 / n, f32, from the host) */
template <int DT, int N>
__global__ void __launch_bounds__(kThreads)
    mse_kernel(const void *pred, const void *target, void *dpred, int64_t n, float scale,
               float *loss, double *partial, unsigned *done) {
  __shared__ double red[kWarps];
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t nvec = n / N;
  double acc = 0.0;
  for (int64_t v = tid; v < nvec; v += stride) {
    float p[N], t[N];
    ldv<DT, N>(pred, v * N, p);
    ldv<DT, N>(target, v * N, t);
#pragma unroll
    for (int k = 0; k < N; k++) {
      const float diff = fsub(p[k], t[k]);
      acc += static_cast<double>(diff) * static_cast<double>(diff); /* exact product */
      p[k] = fmul(scale, diff);
    }
    if (dpred) stv<DT, N>(dpred, v * N, p);
  }
  for (int64_t i = nvec * N + tid; i < n; i += stride) {
    const float diff = fsub(ld<DT>(pred, i), ld<DT>(target, i));
    acc += static_cast<double>(diff) * static_cast<double>(diff);
    if (dpred) st<DT>(dpred, i, fmul(scale, diff));
  }
  acc = block_sum<kThreads>(acc, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
  mean_by_last_block(partial, done, static_cast<double>(n), loss);
}

/* ---- softmax cross-entropy ----------------------------------------------------------------
 * One row per warp (cols <= kWarpColsMax; 8 rows per block at a time) or one row per block.
 * Per row, as the CPU: mx = max; sum = sum (double) expf(x - mx); loss_r = (double)(mx - x[label])
 * + (double)(float)log(sum); dlogits = (expf(x - mx) * (float)(1 / sum) - onehot) * (1 / rows).
 * Each thread reads and writes the same elements in every pass; the label's logit is read
 * before a barrier that precedes the first write, so dlogits may alias logits. A label outside
 * [0, cols) makes the row's loss (so the mean) NaN and fills the row of dlogits with NaN. */

constexpr int64_t kWarpColsMax = 2048;

template <bool BLOCK> __device__ __forceinline__ void group_sync() {
  if constexpr (BLOCK)
    __syncthreads();
  else
    __syncwarp();
}

/* One row's dlogits = (softmax - onehot(label)) / rows, a thread's elements j_first, + j_step ..
 * read from src at src_base + j (the logits, or the row staged in shared memory) */
template <int DT, int N>
__device__ __forceinline__ void write_row_grad(const void *src, int64_t src_base, void *dlogits,
                                               int64_t base, int64_t j_first, int64_t j_step,
                                               int64_t cols, float mx, double sum, int32_t label,
                                               bool ok, float inv_rows) {
  const float inv_sum = static_cast<float>(1.0 / sum);
  for (int64_t j = j_first; j < cols; j += j_step) {
    float x[N];
    ldv<DT, N>(src, src_base + j, x);
#pragma unroll
    for (int k = 0; k < N; k++) {
      float p = fmul(expf(fsub(x[k], mx)), inv_sum);
      if (j + k == label) p = fsub(p, 1.0f);
      x[k] = ok ? fmul(p, inv_rows) : NAN;
    }
    stv<DT, N>(dlogits, base + j, x);
  }
}

template <int DT, int N, bool BLOCK>
__global__ void __launch_bounds__(kThreads)
    xent_kernel(const void *logits, const int32_t *__restrict__ labels, int64_t rows, int64_t cols,
                void *dlogits, float inv_rows, float *loss, double *partial, unsigned *done,
                int32_t *bad_label) {
  constexpr int G = BLOCK ? kThreads : 32; /* threads per row */
  __shared__ double red_d[kWarps];
  __shared__ float red_f[kWarps];
  __shared__ double warp_acc[kWarps];
  const int lane = BLOCK ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x & 31);
  const int64_t r_first = BLOCK ? static_cast<int64_t>(blockIdx.x)
                                : static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int64_t r_step = static_cast<int64_t>(gridDim.x) * (BLOCK ? 1 : kWarps);
  const int64_t j_first = static_cast<int64_t>(lane) * N, j_step = static_cast<int64_t>(G) * N;

  double acc = 0.0; /* this group's rows, valid in lane 0 */
  for (int64_t r = r_first; r < rows; r += r_step) {
    const int64_t base = r * cols;
    float mx = -INFINITY;
    for (int64_t j = j_first; j < cols; j += j_step) {
      float x[N];
      ldv<DT, N>(logits, base + j, x);
#pragma unroll
      for (int k = 0; k < N; k++)
        mx = x[k] > mx ? x[k] : mx; /* NaNs ignored, as the CPU's v > mx */
    }
    if constexpr (BLOCK)
      mx = block_max<kThreads>(mx, red_f);
    else
      mx = warp_max(mx);

    const int32_t label = labels[r];
    const bool ok = label >= 0 && static_cast<int64_t>(label) < cols;
    const float target = ok ? ld<DT>(logits, base + label) : NAN;

    double sum = 0.0;
    for (int64_t j = j_first; j < cols; j += j_step) {
      float x[N];
      ldv<DT, N>(logits, base + j, x);
#pragma unroll
      for (int k = 0; k < N; k++)
        sum += static_cast<double>(expf(fsub(x[k], mx)));
    }
    if constexpr (BLOCK)
      sum = block_sum<kThreads>(sum, red_d);
    else
      sum = warp_sum(sum);

    if (lane == 0) {
      const float log_sum = static_cast<float>(log(sum));
      const double row_loss = static_cast<double>(fsub(mx, target)) + static_cast<double>(log_sum);
      acc += ok ? row_loss : static_cast<double>(NAN);
      if (!ok && bad_label) *bad_label = 1; /* every writer stores the same value */
    }

    if (dlogits) {
      group_sync<BLOCK>(); /* every read of the label's logit is done */
      write_row_grad<DT, N>(logits, base, dlogits, base, j_first, j_step, cols, mx, sum, label, ok,
                            inv_rows);
    }
  }

  if constexpr (BLOCK) {
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
  } else {
    if (lane == 0) warp_acc[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
      double s = 0.0;
#pragma unroll
      for (int w = 0; w < kWarps; w++)
        s += warp_acc[w];
      partial[blockIdx.x] = s;
    }
  }
  mean_by_last_block(partial, done, static_cast<double>(rows), loss);
}

/* The same rows, one per block, with the row kept in shared memory: the logits are read from
 * global memory once instead of three times (max, sum, gradient). Each thread stages and later
 * reads back only its own elements (those of the kernel above), so the staging needs no barrier
 * and every value and sum is formed exactly as above: the bits are the same. */
constexpr int64_t kSmemRowBytesMax = 112 * 1024; /* two blocks per SM on Hopper */

template <int DT, int N>
__global__ void __launch_bounds__(kThreads)
    xent_smem_kernel(const void *logits, const int32_t *__restrict__ labels, int64_t rows,
                     int64_t cols, void *dlogits, float inv_rows, float *loss, double *partial,
                     unsigned *done, int32_t *bad_label) {
  extern __shared__ uint4 row_smem[]; /* the row, in the logits' dtype */
  __shared__ double red_d[kWarps];
  __shared__ float red_f[kWarps];
  constexpr int64_t kBytes = N * elem_size<DT>(); /* 16: one uint4 per vector */
  const int64_t j_first = static_cast<int64_t>(threadIdx.x) * N, j_step = kThreads * N;
  double acc = 0.0; /* this block's rows, valid in thread 0 */
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * cols;
    const uint4 *src =
        reinterpret_cast<const uint4 *>(static_cast<const char *>(logits) + base * elem_size<DT>());
    float mx = -INFINITY;
#pragma unroll 4
    for (int64_t j = j_first; j < cols; j += j_step) {
      const uint4 v = src[j / N];
      row_smem[j / N] = v;
      float x[N];
      ldv<DT, N>(&v, 0, x);
#pragma unroll
      for (int k = 0; k < N; k++)
        mx = x[k] > mx ? x[k] : mx; /* NaNs ignored, as the CPU's v > mx */
    }
    mx = block_max<kThreads>(mx, red_f); /* its barriers also order the staging for the label */
    const int32_t label = labels[r];
    const bool ok = label >= 0 && static_cast<int64_t>(label) < cols;
    const float target = ok ? ld<DT>(row_smem, label) : NAN;

    double sum = 0.0;
    for (int64_t j = j_first; j < cols; j += j_step) {
      float x[N];
      ldv<DT, N>(row_smem, j, x);
#pragma unroll
      for (int k = 0; k < N; k++)
        sum += static_cast<double>(expf(fsub(x[k], mx)));
    }
    sum = block_sum<kThreads>(sum, red_d);

    if (threadIdx.x == 0) {
      const float log_sum = static_cast<float>(log(sum));
      const double row_loss = static_cast<double>(fsub(mx, target)) + static_cast<double>(log_sum);
      acc += ok ? row_loss : static_cast<double>(NAN);
      if (!ok && bad_label) *bad_label = 1;
    }
    if (dlogits)
      write_row_grad<DT, N>(row_smem, 0, dlogits, base, j_first, j_step, cols, mx, sum, label, ok,
                            inv_rows);
    __syncthreads(); /* the label's logit of this row is read before the next row is staged */
  }
  static_assert(kBytes == 16, "one uint4 per vector");
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
  mean_by_last_block(partial, done, static_cast<double>(rows), loss);
}

} // namespace

extern "C" cudaError_t lk_mse(const lutra_loss_args *a, const lk_scratch *scratch, cudaStream_t s) {
  if (!a || !scratch || !scratch->loss_partial || !scratch->loss_done) return cudaErrorInvalidValue;
  const void *pred = a->pred, *target = a->target;
  void *dpred = a->dgrad;
  float *loss = a->loss;
  const int dtype = a->dtype;
  const int64_t n = a->n;
  if (n < 0 || !is_float_dtype(dtype)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (!pred || !target || !loss) return cudaErrorInvalidValue;
  double *sp = scratch->loss_partial;
  unsigned *sd = scratch->loss_done;
  return with_float_dtype(dtype, [&](auto tag) {
    constexpr int DT = decltype(tag)::value;
    constexpr int V = vec16<DT>();
    const float scale = 2.0f / static_cast<float>(n); /* the CPU's f32 scale */
    const bool vec = aligned(pred, 16) && aligned(target, 16) && (!dpred || aligned(dpred, 16));
    const int64_t work = vec ? cdiv<int64_t>(n, V) : n;
    const int blocks = static_cast<int>(imin<int64_t>(cdiv<int64_t>(work, kThreads), kMaxPartials));
    if (vec)
      mse_kernel<DT, V><<<blocks, kThreads, 0, s>>>(pred, target, dpred, n, scale, loss, sp, sd);
    else
      mse_kernel<DT, 1><<<blocks, kThreads, 0, s>>>(pred, target, dpred, n, scale, loss, sp, sd);
    return cudaGetLastError();
  });
}

extern "C" cudaError_t lk_softmax_xent(const lutra_loss_args *a, const lk_scratch *scratch,
                                       cudaStream_t s) {
  if (!a || !scratch || !scratch->loss_partial || !scratch->loss_done) return cudaErrorInvalidValue;
  const void *logits = a->pred;
  const int32_t *labels = a->labels;
  void *dlogits = a->dgrad;
  float *loss = a->loss;
  const int dtype = a->dtype;
  const int64_t rows = a->rows, cols = a->cols;
  if (rows < 0 || cols < 0 || !is_float_dtype(dtype)) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (!logits || !labels || !loss) return cudaErrorInvalidValue;
  double *sp = scratch->loss_partial;
  unsigned *sd = scratch->loss_done;
  return with_float_dtype(dtype, [&](auto tag) {
    constexpr int DT = decltype(tag)::value;
    constexpr int V = vec16<DT>();
    const float inv_rows = 1.0f / static_cast<float>(rows); /* the CPU's f32 1 / rows */
    const bool vec = cols % V == 0 && aligned(logits, 16) && (!dlogits || aligned(dlogits, 16));
    const bool block_rows = cols > kWarpColsMax;
    const int blocks = static_cast<int>(
        imin<int64_t>(block_rows ? rows : cdiv<int64_t>(rows, kWarps), kMaxPartials));
    const int64_t row_bytes = cols * elem_size<DT>();
    if (block_rows && vec && row_bytes <= kSmemRowBytesMax) {
      /* above 48 KiB a kernel must opt in to its dynamic shared memory, once per process (two
       * threads doing it at once set the same value) */
      static bool opted_in = false;
      if (!opted_in) {
        const cudaError_t e = cudaFuncSetAttribute(xent_smem_kernel<DT, V>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(kSmemRowBytesMax));
        if (e != cudaSuccess) return e;
        opted_in = true;
      }
      xent_smem_kernel<DT, V><<<blocks, kThreads, static_cast<size_t>(row_bytes), s>>>(
          logits, labels, rows, cols, dlogits, inv_rows, loss, sp, sd, a->bad_label);
    } else if (block_rows) {
      if (vec)
        xent_kernel<DT, V, true><<<blocks, kThreads, 0, s>>>(logits, labels, rows, cols, dlogits,
                                                             inv_rows, loss, sp, sd, a->bad_label);
      else
        xent_kernel<DT, 1, true><<<blocks, kThreads, 0, s>>>(logits, labels, rows, cols, dlogits,
                                                             inv_rows, loss, sp, sd, a->bad_label);
    } else {
      if (vec)
        xent_kernel<DT, V, false><<<blocks, kThreads, 0, s>>>(logits, labels, rows, cols, dlogits,
                                                              inv_rows, loss, sp, sd, a->bad_label);
      else
        xent_kernel<DT, 1, false><<<blocks, kThreads, 0, s>>>(logits, labels, rows, cols, dlogits,
                                                              inv_rows, loss, sp, sd, a->bad_label);
    }
    return cudaGetLastError();
  });
}
