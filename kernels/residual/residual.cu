/* The element-wise sum of a residual connection (kernels.h: lk_add; reference
 * src/backend/cpu/residual_cpu.c): one f32 addition (fadd: never contracted) per element,
 * rounded once, so the result is the CPU's bit for bit. Grid-stride, 16-byte vectors when every
 * pointer is aligned. */
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"

using namespace lkc;

namespace {

constexpr int kThreads = 256;

template <int DT, int V>
__global__ void __launch_bounds__(kThreads)
    k_add(const void *a, const void *b, void *out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads * V;
  const int64_t full = n / V * V;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * V; i < full;
       i += stride) {
    float x[V], y[V];
    ldv<DT, V>(a, i, x);
    ldv<DT, V>(b, i, y);
#pragma unroll
    for (int k = 0; k < V; k++)
      x[k] = fadd(x[k], y[k]);
    stv<DT, V>(out, i, x);
  }
  if (blockIdx.x == 0)
    for (int64_t i = full + threadIdx.x; i < n; i += kThreads)
      st<DT>(out, i, fadd(ld<DT>(a, i), ld<DT>(b, i)));
}

} // namespace

extern "C" cudaError_t lk_add(const void *a, const void *b, void *out, int dtype, int64_t n,
                              cudaStream_t s) {
  if (n < 0 || (n > 0 && (!a || !b || !out)) || !is_float_dtype(dtype))
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return with_float_dtype(dtype, [&](auto t) {
    constexpr int DT = decltype(t)::value;
    constexpr int V = vec16<DT>();
    const bool vec = aligned(a, 16) && aligned(b, 16) && aligned(out, 16);
    const int64_t per = static_cast<int64_t>(kThreads) * (vec ? V : 1);
    const unsigned grid = static_cast<unsigned>(imin<int64_t>(cdiv<int64_t>(n, per), 4096));
    if (vec)
      k_add<DT, V><<<grid, kThreads, 0, s>>>(a, b, out, n);
    else
      k_add<DT, 1><<<grid, kThreads, 0, s>>>(a, b, out, n);
    return cudaGetLastError();
  });
}
