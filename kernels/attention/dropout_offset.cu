/* Attention dropout's Philox offset advanced on the device (kernels.h): one thread adds the step
 * to the module's offset before cuDNN's forward reads it, so that a forward captured in a CUDA
 * graph draws a fresh mask at each replay, exactly as the same forwards run eagerly would (no
 * CPU reference: the CPU backend's offsets are the module's host counter). */
#include "kernels.h"

namespace {

__global__ void __launch_bounds__(1) advance_kernel(int64_t *offset, uint64_t step) {
  /* unsigned: the offset wraps as the module's host counter does */
  *offset = static_cast<int64_t>(static_cast<uint64_t>(*offset) + step);
}

} // namespace

extern "C" cudaError_t lk_attention_offset_advance(int64_t *offset, uint64_t step, cudaStream_t s) {
  advance_kernel<<<1, 1, 0, s>>>(offset, step);
  return cudaGetLastError();
}
