/* The tensor operations of lutra/tensor_ops.h on the GPU (kernels/tensor/tensor_ops.h; reference
 * src/backend/cpu/tensor_ops_cpu.c). axpby is element-wise and gives the CPU's bits (products and
 * the sum rounded apart: fmul/fadd, never contracted). The row operations run one block per row:
 * argmax gives the CPU's ids; softmax and the sampler sum in f32 in a fixed tree, where the CPU
 * sums in f64 in index order, so their values are within rounding of the CPU's (and a sample
 * within rounding of a boundary may pick a neighbour). */
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"
#include "common/reduce.cuh"

#include "backend/tensor_ops_shared.h"
#include "tensor/tensor_ops.h"

using namespace lkc;

namespace {

constexpr int kThreads = 256;

template <int DT>
__global__ void __launch_bounds__(kThreads)
    k_axpby(const void *x, float alpha, const void *y, float beta, void *out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    float v = fmul(alpha, ld<DT>(x, i));
    if (y) v = fadd(v, fmul(beta, ld<DT>(y, i)));
    st<DT>(out, i, v);
  }
}

/* the better of two (value, index) candidates: a valid one, the larger value, the lower index */
LKC_D void better(float &bv, int64_t &bi, float v, int64_t i) {
  if (i < 0) return;
  if (bi < 0 || v > bv || (v == bv && i < bi)) {
    bv = v;
    bi = i;
  }
}

template <int DT>
__global__ void __launch_bounds__(kThreads) k_argmax(const void *x, int64_t cols, int32_t *ids) {
  __shared__ float sv[kThreads];
  __shared__ int64_t si[kThreads];
  const int64_t o = static_cast<int64_t>(blockIdx.x) * cols;
  float bv = 0.0f;
  int64_t bi = -1;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
    const float v = ld<DT>(x, o + j);
    if (v == v) better(bv, bi, v, j);
  }
  sv[threadIdx.x] = bv;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) {
      float v = sv[threadIdx.x];
      int64_t i = si[threadIdx.x];
      better(v, i, sv[threadIdx.x + s], si[threadIdx.x + s]);
      sv[threadIdx.x] = v;
      si[threadIdx.x] = i;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) ids[blockIdx.x] = static_cast<int32_t>(si[0] < 0 ? 0 : si[0]);
}

template <int DT, int ODT>
__global__ void __launch_bounds__(kThreads)
    k_softmax(const void *x, int64_t cols, float temperature, void *out) {
  __shared__ float red[kThreads / 32];
  __shared__ double dred[kThreads / 32];
  const int64_t o = static_cast<int64_t>(blockIdx.x) * cols;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads)
    m = fmaxf(m, fdiv(ld<DT>(x, o + j), temperature));
  m = block_max<kThreads>(m, red);
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads)
    s = fadd(s, expf(fsub(fdiv(ld<DT>(x, o + j), temperature), m)));
  const float inv = static_cast<float>(1.0 / block_sum<kThreads>(static_cast<double>(s), dred));
  for (int64_t j = threadIdx.x; j < cols; j += kThreads)
    st<ODT>(out, o + j, fmul(expf(fsub(fdiv(ld<DT>(x, o + j), temperature), m)), inv));
}

LKC_D int64_t block_count(int64_t c, int64_t *smem) {
  __syncthreads();
  smem[threadIdx.x] = c;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) smem[threadIdx.x] += smem[threadIdx.x + s];
    __syncthreads();
  }
  return smem[0];
}

/* One row per block: the top-k threshold by bisection over the order keys (as the CPU), the
 * kept logits' max, then each thread's share of exp over a contiguous chunk, a serial prefix over
 * the threads' sums, and the chunk holding the draw walked by one thread. */
template <int DT>
__global__ void __launch_bounds__(kThreads) k_sample(const void *x, int64_t cols, float temperature,
                                                     int top_k, uint64_t seed, int32_t *ids) {
  __shared__ int64_t counts[kThreads];
  __shared__ float red[kThreads / 32];
  __shared__ float part[kThreads];
  const int64_t o = static_cast<int64_t>(blockIdx.x) * cols;
  uint32_t kept = 0;
  if (top_k > 0 && top_k < cols) {
    for (int bit = 31; bit >= 0; bit--) {
      const uint32_t cand = kept | (1u << bit);
      int64_t c = 0;
      for (int64_t j = threadIdx.x; j < cols; j += kThreads)
        c += lutra_order_key(ld<DT>(x, o + j)) >= cand;
      if (block_count(c, counts) >= top_k) kept = cand;
    }
  }
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
    const float v = ld<DT>(x, o + j);
    if (lutra_order_key(v) >= kept) m = fmaxf(m, fdiv(v, temperature));
  }
  m = block_max<kThreads>(m, red);
  const int64_t chunk = (cols + kThreads - 1) / kThreads;
  const int64_t lo = imin<int64_t>(static_cast<int64_t>(threadIdx.x) * chunk, cols);
  const int64_t hi = imin<int64_t>(lo + chunk, cols);
  float s = 0.0f;
  for (int64_t j = lo; j < hi; j++) {
    const float v = ld<DT>(x, o + j);
    if (lutra_order_key(v) >= kept) s = fadd(s, expf(fsub(fdiv(v, temperature), m)));
  }
  part[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x != 0) return;
  float total = 0.0f;
  for (int t = 0; t < kThreads; t++)
    total = fadd(total, part[t]);
  const float target = fmul(lutra_sample_uniform(seed, blockIdx.x), total);
  float acc = 0.0f;
  int64_t pick = -1;
  for (int t = 0; t < kThreads && pick < 0; t++) {
    const bool here = t == kThreads - 1 || fadd(acc, part[t]) > target;
    if (!here) {
      acc = fadd(acc, part[t]);
      continue;
    }
    /* the draw falls in thread t's chunk (or, by rounding, beyond every chunk: the last kept) */
    const int64_t c0 = imin<int64_t>(static_cast<int64_t>(t) * chunk, cols);
    const int64_t c1 = t == kThreads - 1 ? cols : imin<int64_t>(c0 + chunk, cols);
    for (int64_t j = c0; j < c1; j++) {
      const float v = ld<DT>(x, o + j);
      if (lutra_order_key(v) < kept) continue;
      pick = j;
      acc = fadd(acc, expf(fsub(fdiv(v, temperature), m)));
      if (acc > target) break;
    }
    if (pick < 0) { /* an empty chunk by rounding: the last kept logit of the row */
      for (int64_t j = cols - 1; j >= 0 && pick < 0; j--)
        if (lutra_order_key(ld<DT>(x, o + j)) >= kept) pick = j;
    }
  }
  ids[blockIdx.x] = static_cast<int32_t>(pick < 0 ? 0 : pick);
}

bool rows_ok(const void *x, int dtype, int64_t rows, int64_t cols, const void *out) {
  return is_float_dtype(dtype) && rows >= 0 && rows <= 0x7FFFFFFF && cols >= 1 &&
         (rows == 0 || (x && out));
}

} // namespace

extern "C" cudaError_t lk_axpby(const void *x, float alpha, const void *y, float beta, void *out,
                                int dtype, int64_t n, cudaStream_t s) {
  if (n < 0 || (n > 0 && (!x || !out)) || !is_float_dtype(dtype)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return with_float_dtype(dtype, [&](auto t) {
    constexpr int DT = decltype(t)::value;
    const unsigned grid = static_cast<unsigned>(imin<int64_t>(cdiv<int64_t>(n, kThreads), 4096));
    LKC_LAUNCH((k_axpby<DT>), grid, kThreads, 0, s, x, alpha, y, beta, out, n);
    return cudaGetLastError();
  });
}

extern "C" cudaError_t lk_rows_argmax(const void *x, int dtype, int64_t rows, int64_t cols,
                                      int32_t *ids, cudaStream_t s) {
  if (!rows_ok(x, dtype, rows, cols, ids)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  return with_float_dtype(dtype, [&](auto t) {
    constexpr int DT = decltype(t)::value;
    LKC_LAUNCH(k_argmax<DT>, static_cast<unsigned>(rows), kThreads, 0, s, x, cols, ids);
    return cudaGetLastError();
  });
}

extern "C" cudaError_t lk_rows_softmax(const void *x, int dtype, int64_t rows, int64_t cols,
                                       float temperature, void *out, int out_dtype,
                                       cudaStream_t s) {
  if (!rows_ok(x, dtype, rows, cols, out) || !is_float_dtype(out_dtype))
    return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  return with_float_dtype(dtype, [&](auto t) {
    constexpr int DT = decltype(t)::value;
    return with_float_dtype(out_dtype, [&](auto u) {
      constexpr int ODT = decltype(u)::value;
      LKC_LAUNCH((k_softmax<DT, ODT>), static_cast<unsigned>(rows), kThreads, 0, s, x, cols,
                 temperature, out);
      return cudaGetLastError();
    });
  });
}

extern "C" cudaError_t lk_rows_sample(const void *x, int dtype, int64_t rows, int64_t cols,
                                      float temperature, int top_k, uint64_t seed, int32_t *ids,
                                      cudaStream_t s) {
  if (!rows_ok(x, dtype, rows, cols, ids) || top_k < 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  return with_float_dtype(dtype, [&](auto t) {
    constexpr int DT = decltype(t)::value;
    LKC_LAUNCH(k_sample<DT>, static_cast<unsigned>(rows), kThreads, 0, s, x, cols, temperature,
               top_k, seed, ids);
    return cudaGetLastError();
  });
}
