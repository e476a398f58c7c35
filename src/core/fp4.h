/* NVFP4's scalar pieces (lutra/nvfp4.h says what they compute): E2M1 encode (RNE and stochastic)
 * and decode, the counter-based random bits, the 16-point Hadamard transform and the scale
 * rules. Integer work on bit patterns and plain f32 operations in a fixed order. The CPU backend
 * and the CUDA kernels (kernels/nvfp4_math.cuh, kernels/quantize_nvfp4.cu) both run this header:
 * under nvcc every function is a host and device function, in device code the f32 operations are
 * CUDA's _rn intrinsics (never contracted into FMAs) and E4M3 encoding is the hardware's
 * conversion (tools/check_codecs.cu: equal to core/codec.h's), so both give the same bits;
 * tools/check_fp4.cpp compares the encoders with cuda_fp4.h's host conversions. */
#ifndef LUTRA_CORE_FP4_H
#define LUTRA_CORE_FP4_H

#include "core/codec.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#include <cuda_fp8.h>
#endif

#ifdef __CUDA_ARCH__
#define FP4_ADD(a, b) __fadd_rn(a, b)
#define FP4_SUB(a, b) __fsub_rn(a, b)
#define FP4_MUL(a, b) __fmul_rn(a, b)
#define FP4_DIV(a, b) __fdiv_rn(a, b)
#else
#define FP4_ADD(a, b) ((a) + (b))
#define FP4_SUB(a, b) ((a) - (b))
#define FP4_MUL(a, b) ((a) * (b))
#define FP4_DIV(a, b) ((a) / (b))
#endif

enum { FP4_BLOCK = 16 };
#define FP4_MAX      6.0f
#define FP4_E4M3_MAX 448.0f

/* the E2M1 magnitude of code c (0..7); a function, not a table, as device code runs it too */
static inline LUTRA_CODEC_HD float fp4_grid(uint32_t c) {
  return c == 0   ? 0.0f
         : c == 1 ? 0.5f
         : c == 2 ? 1.0f
         : c == 3 ? 1.5f
         : c == 4 ? 2.0f
         : c == 5 ? 3.0f
         : c == 6 ? 4.0f
                  : 6.0f;
}

/* E2M1 code -> f32 (exact); codes are the low 4 bits */
static inline LUTRA_CODEC_HD float e2m1_to_f32(uint32_t c) {
  const float v = fp4_grid(c & 7u);
  return (c & 8u) ? -v : v;
}

/* f32 -> E2M1, round to nearest even, saturating; NaN gives +6 (0x7) as cuda_fp4.h does. The
 * magnitude thresholds are the midpoints between neighbours; a tie goes to the even code. */
static inline LUTRA_CODEC_HD uint8_t f32_to_e2m1(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return 0x7u;
  const uint8_t sign = (uint8_t)((u >> 28) & 0x8u);
  const float a = bits_f32(mag);
  uint8_t c;
  if (a <= 0.25f)
    c = 0; /* tie at 0.25 to 0 (even) */
  else if (a < 0.75f)
    c = 1;
  else if (a <= 1.25f)
    c = 2; /* tie at 1.25 to 1.0 (code 2, even) */
  else if (a < 1.75f)
    c = 3;
  else if (a <= 2.5f)
    c = 4;
  else if (a < 3.5f)
    c = 5;
  else if (a <= 5.0f)
    c = 6;
  else
    c = 7;
  return (uint8_t)(sign | c);
}

/* splitmix64's finalizer */
static inline LUTRA_CODEC_HD uint64_t fp4_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

#define FP4_GOLDEN     0x9E3779B97F4A7C15ull
#define FP4_COL_STREAM 0xD1B54A32D192ED03ull

/* the seed of a quantizer's n-th quantization */
static inline LUTRA_CODEC_HD uint64_t fp4_call_seed(uint64_t recipe_seed, uint64_t n) {
  return fp4_mix64(recipe_seed + n * FP4_GOLDEN);
}

/* 24 random bits for element index of a copy (stream 0 or FP4_COL_STREAM) */
static inline LUTRA_CODEC_HD uint32_t fp4_random24(uint64_t seed, uint64_t stream, uint64_t index) {
  return (uint32_t)(fp4_mix64((seed ^ stream) + (index + 1) * FP4_GOLDEN) >> 40);
}

/* f32 -> E2M1 with stochastic rounding by r (24 random bits); NaN gives +6, |v| >= 6 gives 6 */
static inline LUTRA_CODEC_HD uint8_t f32_to_e2m1_sr(float f, uint32_t r) {
  const uint32_t u = f32_bits(f);
  const uint32_t mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return 0x7u;
  const uint8_t sign = (uint8_t)((u >> 28) & 0x8u);
  const float a = bits_f32(mag);
  if (a >= 6.0f) return (uint8_t)(sign | 7u);
  uint32_t lo = 0;
  while (lo < 6 && fp4_grid(lo + 1) <= a)
    lo++;
  /* a - lo is exact (Sterbenz, or lo = 0) and hi - lo a power of two: frac is exact */
  const float frac = FP4_DIV(FP4_SUB(a, fp4_grid(lo)), FP4_SUB(fp4_grid(lo + 1), fp4_grid(lo)));
  const float uf = FP4_MUL((float)r, 1.0f / 16777216.0f);
  return (uint8_t)(sign | (uf < frac ? lo + 1 : lo));
}

/* TE's compute_global_encode_scaling_factor_FP4: 448 * 6 / amax, FLT_MAX when that overflows,
 * 1 when amax is 0 (or the quotient is 0) */
static inline LUTRA_CODEC_HD float fp4_global_encode(float amax) {
  float s = FP4_DIV(FP4_E4M3_MAX * FP4_MAX, amax);
  if (s > FLT_MAX) s = FLT_MAX;
  if (amax == 0.0f || s == 0.0f) return 1.0f;
  return s;
}

/* f32 -> E4M3 (saturating RNE): the hardware's conversion in device code */
static inline LUTRA_CODEC_HD uint8_t fp4_e4m3(float v) {
#ifdef __CUDA_ARCH__
  return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
#else
  return f32_to_e4m3(v);
#endif
}

/* the E4M3 block scale code of a block, in TE's order: block_amax * (global_encode * (1/6)) */
static inline LUTRA_CODEC_HD uint8_t fp4_block_scale(float block_amax, float global_encode) {
  const float s = FP4_MUL(block_amax, FP4_MUL(global_encode, 1.0f / FP4_MAX));
  return fp4_e4m3(fminf(s, FLT_MAX));
}

/* the multiplier that takes a block's values to E2M1 range, in TE's order:
 * 1 / (block scale * (1 / global_encode)), at most FLT_MAX (a zero block scale gives FLT_MAX) */
static inline LUTRA_CODEC_HD float fp4_block_encode(uint8_t scale_code, float global_encode) {
  const float dec = FP4_DIV(1.0f, global_encode);
  return fminf(FP4_DIV(1.0f, FP4_MUL(e4m3_to_f32(scale_code), dec)), FLT_MAX);
}

/* the parity of the bits of v (0..15): the sign of the Sylvester Hadamard matrix's (i, j) entry
 * is odd(i & j) */
static inline LUTRA_CODEC_HD int fp4_odd(int v) {
  v ^= v >> 2;
  v ^= v >> 1;
  return v & 1;
}

/* the 16-point transform of lutra/nvfp4.h: y_j = (sum_i (s_i x_i) H_ij) / 4, i in order */
static inline LUTRA_CODEC_HD void fp4_rht16(const float *x, float *y, uint32_t signs) {
  float t[FP4_BLOCK];
  for (int i = 0; i < FP4_BLOCK; i++)
    t[i] = (signs >> i & 1u) ? -x[i] : x[i];
  for (int j = 0; j < FP4_BLOCK; j++) {
    float acc = 0.0f;
    for (int i = 0; i < FP4_BLOCK; i++)
      acc = fp4_odd(i & j) ? FP4_SUB(acc, t[i]) : FP4_ADD(acc, t[i]);
    y[j] = FP4_MUL(acc, 0.25f);
  }
}

/* its inverse: x_i = s_i (sum_j H_ij y_j) / 4 */
static inline LUTRA_CODEC_HD void fp4_rht16_inverse(const float *y, float *x, uint32_t signs) {
  float t[FP4_BLOCK];
  for (int i = 0; i < FP4_BLOCK; i++) {
    float acc = 0.0f;
    for (int j = 0; j < FP4_BLOCK; j++)
      acc = fp4_odd(i & j) ? FP4_SUB(acc, y[j]) : FP4_ADD(acc, y[j]);
    t[i] = FP4_MUL(acc, 0.25f);
  }
  for (int i = 0; i < FP4_BLOCK; i++)
    x[i] = (signs >> i & 1u) ? -t[i] : t[i];
}

#endif
