/* lutra's device helper library (kernels/common/, namespace lkc), one header per job:
 *   base.cuh       the macros (LKC_HD, LKC_D, LKC_UNROLL, LKC_LAUNCH), constants, integer helpers
 *   f32.cuh        f32 bit patterns, x86-64's NaN results, f32 arithmetic rounded where the CPU
 *                  rounds
 *   codec.cuh      the bf16 / f16 / FP8 / E8M0 conversions of src/core/codec.h, FP8 encoding of
 *                  products
 *   scale.cuh      the f32 scale rules of src/backend/cpu/quantize_cpu.c
 *   elements.cuh   element loads and stores by dtype, one or a vector at a time
 *   reduce.cuh     warp and block reductions, the atomic maximum
 *   launch.cuh     host side: device attributes, grids, dtype dispatch, alignment, shared memory
 *   bulk_rows.cuh  rows staged in shared memory by the bulk copy engine
 * A kernel file includes the headers whose helpers it uses; each header includes what it needs.
 *
 * Bit-exactness with the CPU backend
 * - Conversions follow src/core/codec.h bit for bit, NaN included: codec.h gives what the
 *   hardware gives (one positive NaN per format: 0x7F for E4M3 and E5M2, 0x7FFF for bf16 and
 *   f16; 0x7FFFFFFF when a NaN code is widened), so the results of the hardware's RNE conversions
 *   (cvt.rn.satfinite.e4m3x2/e5m2x2.f32, cvt.rn.bf16.f32, cvt.rn.f16.f32, cvt.f32.f16,
 *   cvt.rn.f16x2.e4m3x2/e5m2x2) are stored
 *   as they are. Build with -DLKC_SOFT_FP8 to encode FP8 with the integer mirror of codec.h
 *   instead (slower; for cross-checking).
 * - The CPU backend runs on x86-64, whose SSE arithmetic propagates NaN operands (quieted; the
 *   first operand when both are NaN) and produces the negative "default NaN" 0xFFC00000 for
 *   inf*0, 0/0, inf-inf; a GPU returns the canonical 0x7FFFFFFF. That no longer matters where a
 *   NaN result is encoded (every NaN has the same code), but an f32 output keeps all 32 bits:
 *   mul_x86/div_x86 remain only where a product or quotient can be a NaN written as f32 (scales,
 *   scale inverses, dequantized f32 values).
 * - No fused multiply-adds: every expression here is a single f32 multiply or divide, so nvcc's
 *   contraction cannot change a result; divisions are IEEE (nvcc's default -prec-div=true) and
 *   subnormals are kept (default -ftz=false). Do not build these files with --use_fast_math.
 *
 * Everything that can run on the host is __host__ __device__, so that the conversions and the
 * element formulas built on them can be checked against src/core/codec.h and the CPU backend on
 * the CPU (spec/native/). */
#ifndef LUTRA_KERNELS_COMMON_BASE_CUH
#define LUTRA_KERNELS_COMMON_BASE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels.h"

#define LKC_HD __host__ __device__ __forceinline__
#define LKC_D  __device__ __forceinline__

/* #pragma unroll for __host__ __device__ code (the host compiler does not know it) */
#ifdef __CUDA_ARCH__
#define LKC_UNROLL _Pragma("unroll")
#else
#define LKC_UNROLL
#endif

/* kernel launches go through this macro (a test harness may define its own) */
#ifndef LKC_LAUNCH
#define LKC_LAUNCH(kernel, grid, block, smem, stream, ...)                                         \
  kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#endif

namespace lkc {

constexpr unsigned FULL_MASK = 0xFFFFFFFFu;
constexpr float FLT_MAX_F = 3.40282346638528859812e+38f;

/* integer helpers */
template <class T> LKC_HD constexpr T cdiv(T a, T b) {
  return (a + b - 1) / b;
}
template <class T> LKC_HD constexpr T imin(T a, T b) {
  return a < b ? a : b;
}
template <class T> LKC_HD constexpr T imax(T a, T b) {
  return a > b ? a : b;
}

} // namespace lkc

#endif
