/* Process-group helpers: the amaxes of a step's delayed-scaling metas live in separate
 * allocations; one collective needs them in one buffer. The pointers go by value in the kernel
 * parameters (no upload, nothing to allocate), 256 per launch. */
#include "kernels.h"

namespace {
constexpr int AMAX_PER_LAUNCH = 256;
struct AmaxPtrs {
  float *p[AMAX_PER_LAUNCH];
};

__global__ void k_amax_gather(AmaxPtrs src, int n, float *buf) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) buf[i] = *src.p[i];
}

__global__ void k_amax_scatter(AmaxPtrs dst, int n, const float *buf) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) *dst.p[i] = buf[i];
}

template <bool Gather>
cudaError_t amax_move(lutra_scale_meta *const *metas, int n, float *buf, cudaStream_t s) {
  if (n < 0 || (n > 0 && (!metas || !buf))) return cudaErrorInvalidValue;
  for (int j0 = 0; j0 < n; j0 += AMAX_PER_LAUNCH) {
    const int k = n - j0 < AMAX_PER_LAUNCH ? n - j0 : AMAX_PER_LAUNCH;
    AmaxPtrs ptrs;
    for (int j = 0; j < k; j++) {
      if (!metas[j0 + j] || !metas[j0 + j]->amax_history) return cudaErrorInvalidValue;
      ptrs.p[j] = metas[j0 + j]->amax_history;
    }
    if (Gather)
      k_amax_gather<<<1, AMAX_PER_LAUNCH, 0, s>>>(ptrs, k, buf + j0);
    else
      k_amax_scatter<<<1, AMAX_PER_LAUNCH, 0, s>>>(ptrs, k, buf + j0);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
} // namespace

extern "C" cudaError_t lk_amax_gather(lutra_scale_meta *const *metas, int n, float *buf,
                                      cudaStream_t s) {
  return amax_move<true>(metas, n, buf, s);
}

extern "C" cudaError_t lk_amax_scatter(lutra_scale_meta *const *metas, int n, const float *buf,
                                       cudaStream_t s) {
  return amax_move<false>(metas, n, const_cast<float *>(buf), s);
}
