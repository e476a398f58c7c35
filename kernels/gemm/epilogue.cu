/* GEMM epilogues done by kernels (kernels.h), for the plans whose epilogue cuBLASLt does not run
 * (src/backend/cuda/gemm_cuda.c): the GEMM writes its f32 result (D itself, or an f32 staging
 * scratch) and these finish it in place, as src/backend/cpu/gemm_cpu.c does on the f32 result
 * before its single rounding. The GELU formulas are activation_math.cuh's, operation for operation
 * the CPU's (src/backend/cpu/activation_cpu.c: the tanh approximation, as cuBLASLt's GELU
 * epilogue). */
#include "activation/activation_math.cuh"
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"
#include "common/reduce.cuh"

using namespace lkc;

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192; /* grid-stride beyond this */

unsigned grid_for(int64_t work) {
  return static_cast<unsigned>(imin<int64_t>(cdiv<int64_t>(work, kThreads), kMaxBlocks));
}

/* GELU_AUX: aux[i] = x[i] rounded to AUX (the pre-activation), then x[i] = gelu(x[i]) */
template <int AUX>
__global__ void __launch_bounds__(kThreads) gelu_aux_kernel(float *x, void *aux, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    const float v = x[i];
    st<AUX>(aux, i, v);
    x[i] = gelu(v);
  }
}

/* DGELU: x[i] = x[i] * gelu'(aux[i]) (the CPU's df * gelu_grad(aux)) */
template <int AUX>
__global__ void __launch_bounds__(kThreads)
    dgelu_kernel(float *x, const void *__restrict__ aux, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride)
    x[i] = fmul(x[i], gelu_grad(ld<AUX>(aux, i)));
}

/* out[r] = sum_c x[r, c]: one block per row (grid-stride over rows), each thread adds its
 * strided elements in double, then a fixed-tree block sum: the same bits every run. */
template <int DT>
__global__ void __launch_bounds__(kThreads) row_sum_kernel(const void *__restrict__ x, int64_t rows,
                                                           int64_t cols, void *out, int out_dtype) {
  __shared__ double smem[kThreads / 32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    double acc = 0.0;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads)
      acc += static_cast<double>(ld<DT>(x, r * cols + c));
    const double total = block_sum<kThreads>(acc, smem);
    if (threadIdx.x == 0) st_rt(out, out_dtype, r, static_cast<float>(total));
  }
}

} // namespace

extern "C" cudaError_t lk_gelu_aux(float *x, void *aux, int aux_dtype, int64_t n, cudaStream_t s) {
  if (n < 0 || !is_float_dtype(aux_dtype)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (!x || !aux) return cudaErrorInvalidValue;
  return with_float_dtype(aux_dtype, [&](auto tag) {
    constexpr int AUX = decltype(tag)::value;
    gelu_aux_kernel<AUX><<<grid_for(n), kThreads, 0, s>>>(x, aux, n);
    return cudaGetLastError();
  });
}

extern "C" cudaError_t lk_dgelu(float *x, const void *aux, int aux_dtype, int64_t n,
                                cudaStream_t s) {
  if (n < 0 || !is_float_dtype(aux_dtype)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (!x || !aux) return cudaErrorInvalidValue;
  return with_float_dtype(aux_dtype, [&](auto tag) {
    constexpr int AUX = decltype(tag)::value;
    dgelu_kernel<AUX><<<grid_for(n), kThreads, 0, s>>>(x, aux, n);
    return cudaGetLastError();
  });
}

extern "C" cudaError_t lk_row_sum(const void *x, int dtype, int64_t rows, int64_t cols, void *out,
                                  int out_dtype, cudaStream_t s) {
  if (rows < 0 || cols < 0 || !is_float_dtype(dtype) || !is_float_dtype(out_dtype))
    return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  /* cols == 0 still writes zeros, as the CPU does */
  if (!out || (cols > 0 && !x)) return cudaErrorInvalidValue;
  return with_float_dtype(dtype, [&](auto tag) {
    constexpr int DT = decltype(tag)::value;
    const unsigned blocks = static_cast<unsigned>(imin<int64_t>(rows, 65535));
    row_sum_kernel<DT><<<blocks, kThreads, 0, s>>>(x, rows, cols, out, out_dtype);
    return cudaGetLastError();
  });
}
