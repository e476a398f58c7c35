/* Host-side launch helpers (kernels/common/, see base.cuh): the current device and its
 * attributes (cached), grids, alignment, dispatch of a run-time dtype or flag to a template, and
 * the dynamic shared memory limit. */
#ifndef LUTRA_KERNELS_COMMON_LAUNCH_CUH
#define LUTRA_KERNELS_COMMON_LAUNCH_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>
#include <type_traits>

#include "common/base.cuh"

namespace lkc {

inline int device_index() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
  return dev;
}

/* attribute A of the current device, or fallback where the query fails or gives 0 or less
 * (cached per device and attribute: launchers ask on every call) */
template <cudaDeviceAttr A> int device_attr(int fallback) {
  static std::atomic<int> cache[64];
  const int dev = device_index();
  if (dev >= 0 && dev < 64) {
    const int v = cache[dev].load(std::memory_order_relaxed);
    if (v > 0) return v;
  }
  int v = 0;
  if (cudaDeviceGetAttribute(&v, A, dev) != cudaSuccess || v <= 0) v = fallback;
  if (dev >= 0 && dev < 64) cache[dev].store(v, std::memory_order_relaxed);
  return v;
}

/* multiprocessors of the current device */
inline int num_sms() {
  return device_attr<cudaDevAttrMultiProcessorCount>(132);
}

/* blocks for `work` items of `per_block` each, at most `cap` (and the int range of gridDim.x) */
inline unsigned grid_for(int64_t work, int64_t per_block, int64_t cap) {
  int64_t g = (work + per_block - 1) / per_block;
  if (g > cap) g = cap;
  if (g > 0x7FFFFFFF) g = 0x7FFFFFFF;
  if (g < 1) g = 1;
  return (unsigned)g;
}

/* A grid of at most as many blocks of Kernel as fit on the device at once (the kernels loop over
 * their work): `blocks_needed` when fewer. The occupancy is asked once per kernel. */
template <auto Kernel> unsigned persistent_grid(int64_t blocks_needed, int threads, size_t smem) {
  static std::atomic<int> cache[2];
  std::atomic<int> &c = cache[smem ? 1 : 0];
  int per_sm = c.load(std::memory_order_relaxed);
  if (per_sm <= 0) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, reinterpret_cast<const void *>(Kernel), threads, smem) != cudaSuccess ||
        per_sm < 1)
      per_sm = 1;
    c.store(per_sm, std::memory_order_relaxed);
  }
  return grid_for(blocks_needed, 1, (int64_t)num_sms() * per_sm);
}

/* p is a multiple of bytes (a power of 2) */
inline bool aligned(const void *p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

inline bool is_float_dtype(int d) {
  return d == LUTRA_F32 || d == LUTRA_BF16 || d == LUTRA_F16;
}
inline bool is_fp8_dtype(int d) {
  return d == LUTRA_E4M3 || d == LUTRA_E5M2;
}

/* f(std::integral_constant<int, dtype>) for a float / FP8 dtype, or cudaErrorInvalidValue */
template <typename F> cudaError_t with_float_dtype(int d, F &&f) {
  switch (d) {
  case LUTRA_F32:
    return f(std::integral_constant<int, LUTRA_F32>{});
  case LUTRA_BF16:
    return f(std::integral_constant<int, LUTRA_BF16>{});
  case LUTRA_F16:
    return f(std::integral_constant<int, LUTRA_F16>{});
  default:
    return cudaErrorInvalidValue;
  }
}

template <typename F> cudaError_t with_fp8_dtype(int d, F &&f) {
  switch (d) {
  case LUTRA_E4M3:
    return f(std::integral_constant<int, LUTRA_E4M3>{});
  case LUTRA_E5M2:
    return f(std::integral_constant<int, LUTRA_E5M2>{});
  default:
    return cudaErrorInvalidValue;
  }
}

template <typename F> cudaError_t with_bool(bool b, F &&f) {
  return b ? f(std::true_type{}) : f(std::false_type{});
}

/* Raises a kernel's dynamic shared memory limit once per device (needed above 48 KiB). */
template <typename K> cudaError_t allow_smem(K *kernel, int bytes, std::atomic<uint64_t> &done) {
  const int dev = device_index();
  const uint64_t bit = dev >= 0 && dev < 64 ? (uint64_t)1 << dev : 0;
  if (bit && (done.load(std::memory_order_relaxed) & bit)) return cudaSuccess;
  cudaError_t e = cudaFuncSetAttribute(reinterpret_cast<const void *>(kernel),
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess && bit) done.fetch_or(bit, std::memory_order_relaxed);
  return e;
}

} // namespace lkc

#endif
