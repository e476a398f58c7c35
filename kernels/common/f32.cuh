/* f32 as the CPU backend computes it (kernels/common/, see base.cuh): bit patterns, the NaN
 * results of x86-64's SSE arithmetic where a NaN is written as f32, and the f32 operations
 * rounded where the CPU's ISO C code (no contraction) rounds: fadd/fsub/fmul/fdiv/fsqrt are the
 * _rn intrinsics on the device, which nvcc never contracts into FMAs, so a formula written with
 * them rounds operation for operation as src/backend/cpu/ does. */
#ifndef LUTRA_KERNELS_COMMON_F32_CUH
#define LUTRA_KERNELS_COMMON_F32_CUH

#include <math.h>
#include <string.h>

#include "common/base.cuh"

namespace lkc {

/* ---- f32 bit patterns ------------------------------------------------------------------------ */

LKC_HD uint32_t f32_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}

LKC_HD float bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

LKC_HD bool is_nan(float f) {
  return f != f;
}
LKC_HD bool is_inf(float f) {
  return (f32_bits(f) & 0x7FFFFFFFu) == 0x7F800000u;
}
LKC_HD bool is_finite(float f) {
  return (f32_bits(f) & 0x7F800000u) != 0x7F800000u;
}

/* ---- what x86-64 (the CPU backend) computes when a product or quotient is NaN ---------------- */
/* Only for results written as f32 (scales, scale inverses, dequantized f32 values), whose NaN
 * bits a GPU would otherwise give as 0x7FFFFFFF where x86 keeps an operand's sign or gives
 * 0xFFC00000; an encoded result needs none of this. */

LKC_HD float quiet(float a) {
  return bits_f32(f32_bits(a) | 0x00400000u);
}

/* a NaN result of a op b: the first NaN operand, quieted; else the default NaN */
LKC_HD float nan_result(float a, float b) {
  if (is_nan(a)) return quiet(a);
  if (is_nan(b)) return quiet(b);
  return bits_f32(0xFFC00000u);
}

LKC_HD float mul_x86(float a, float b) {
  float r = a * b;
  return is_nan(r) ? nan_result(a, b) : r;
}

LKC_HD float div_x86(float a, float b) {
  float r = a / b;
  return is_nan(r) ? nan_result(a, b) : r;
}

/* ---- f32 arithmetic rounded where the CPU rounds (no FMA contraction) -------------------- */

LKC_HD float fadd(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
LKC_HD float fsub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
LKC_HD float fmul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LKC_HD float fdiv(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
LKC_HD float fsqrt(float a) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(a);
#else
  return sqrtf(a);
#endif
}

} // namespace lkc

#endif
