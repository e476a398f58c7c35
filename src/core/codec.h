/* Scalar conversions between f32 and the narrow formats: the bit-exact reference every backend
 * matches (src/core/dtype.c exports them; the CPU backend inlines them). All rounding is done on
 * the integer bit patterns (round to nearest, ties to even), so the results do not depend on the
 * floating-point environment.
 *
 * NaN follows NVIDIA's conversions (cvt.rn[.satfinite], and cuda_bf16.h / cuda_fp16.h /
 * cuda_fp8.h's host functions): every NaN, whatever its sign or payload, encodes to the format's
 * one canonical positive NaN, and a NaN code decodes to f32's canonical NaN 0x7FFFFFFF. The
 * kernels then store the hardware's result as it is, with nothing to patch, and
 * tools/check_codecs.cu (make check-codecs) compares every f32 pattern and every code with
 * CUDA's functions.
 *
 *   bf16  f32's top 16 bits, RNE; NaN gives 0x7FFF; decoding is exact (NaN bits kept, as
 *         __bfloat162float keeps them)
 *   f16   IEEE binary16, RNE, overflow to inf, exact subnormals; NaN gives 0x7FFF
 *   e4m3  "fn": bias 7, 3 mantissa bits, no inf, S.1111.111 is NaN, max 448;
 *         encoding saturates (+-inf and |x| > 448 give +-448), NaN gives 0x7F
 *   e5m2  bias 15, 2 mantissa bits, IEEE-like inf/NaN, max 57344;
 *         encoding saturates (+-inf and |x| > 57344 give +-57344), NaN gives 0x7F
 *   e8m0  2^(e-127), 0xFF is NaN; encoding rounds up (TransformerEngine's float_to_e8m0, which
 *         is also CUDA's cvt.rp.satfinite.ue8m0x2) */
#ifndef LUTRA_CORE_CODEC_H
#define LUTRA_CORE_CODEC_H

#include "lutra.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* the NaN every NaN code decodes to (what the hardware's widening conversions give) */
#define LUTRA_F32_NAN_BITS 0x7FFFFFFFu

/* The few functions the kernels share with the CPU (core/fp4.h's, through
 * kernels/nvfp4_math.cuh) are host and device functions under nvcc. */
#ifdef __CUDACC__
#define LUTRA_CODEC_HD __host__ __device__
#else
#define LUTRA_CODEC_HD
#endif

/* f32 bit patterns, for the exact conversions */
static inline LUTRA_CODEC_HD uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static inline LUTRA_CODEC_HD float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* ---- bf16 ------------------------------------------------------------------------------ */

static inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFFu;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float bf16_to_f32(uint16_t h) {
  return bits_f32((uint32_t)h << 16);
}

/* ---- generic RNE narrowing of a finite |x| ------------------------------------------------
 * Returns the magnitude code ((biased exponent << mbits) | mantissa) of the nearest value of
 * a format with `mbits` mantissa bits and exponent bias `bias`, without any overflow handling
 * (the caller saturates or maps to inf). `mag` is the f32 bit pattern with the sign cleared
 * and must be finite. Subnormals of both f32 and the target are exact. */
static inline uint32_t narrow_rne(uint32_t mag, int mbits, int bias) {
  int e = (int)(mag >> 23);
  uint32_t m24;
  int e_unb;
  if (e == 0) {
    if (mag == 0) return 0;
    m24 = mag; /* f32 subnormal: value = m24 * 2^(-126 - 23) */
    e_unb = -126;
  } else {
    m24 = (mag & 0x7FFFFFu) | 0x800000u;
    e_unb = e - 127;
  }
  /* value = m24 * 2^(e_unb - 23), and for normal f32 it lies in [2^e_unb, 2^(e_unb+1)). The
   * target exponent is e_unb, or the format's minimum normal exponent when below it (that
   * also covers f32 subnormals); its quantum is 2^(te - mbits). */
  int te = e_unb > 1 - bias ? e_unb : 1 - bias;
  int shift = te - mbits - (e_unb - 23); /* >= 23 - mbits > 0 */
  uint32_t k;
  if (shift > 25) {
    k = 0; /* below a quarter of the smallest subnormal */
  } else {
    k = m24 >> shift;
    uint32_t rem = m24 & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (k & 1u))) k++;
  }
  /* k is in [2^mbits, 2^(mbits+1)] for normals (2^(mbits+1) carries into the exponent) and in
   * [0, 2^mbits] for subnormals; both give the code ((te + bias - 1) << mbits) + k. */
  return ((uint32_t)(te + bias - 1) << mbits) + k;
}

/* ---- f16 ------------------------------------------------------------------------------- */

static inline uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return 0x7FFFu;
  if (mag == 0x7F800000u) return (uint16_t)(sign | 0x7C00u);
  if (mag >= 0x47800000u) return (uint16_t)(sign | 0x7C00u); /* >= 65536: overflow */
  uint32_t c = narrow_rne(mag, 10, 15);
  if (c > 0x7C00u) c = 0x7C00u; /* cannot happen below 65536, kept for safety */
  return (uint16_t)(sign | c);
}

static inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1Fu;
  uint32_t m = h & 0x3FFu;
  if (e == 0x1F) return m ? bits_f32(LUTRA_F32_NAN_BITS) : bits_f32(sign | 0x7F800000u);
  if (e == 0) {
    float v = (float)m * 0x1p-24f; /* exact */
    return sign ? -v : v;
  }
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* ---- FP8 ------------------------------------------------------------------------------- */

/* Saturating RNE encode of a format with mbits mantissa bits and exponent bias: |x| above
 * max_bits (the largest finite value's f32 bits), inf included, gives max_code; NaN the hardware's
 * one positive NaN (0x7F for both E4M3 and E5M2). */
static inline uint8_t f32_to_fp8(float f, int mbits, int bias, uint32_t max_bits,
                                 uint32_t max_code) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 24) & 0x80u;
  uint32_t mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return 0x7Fu;
  if (mag > max_bits) return (uint8_t)(sign | max_code);
  uint32_t c = narrow_rne(mag, mbits, bias);
  if (c > max_code) c = max_code;
  return (uint8_t)(sign | c);
}

static inline uint8_t f32_to_e4m3(float f) {
  return f32_to_fp8(f, 3, 7, 0x43E00000u /* 448 */, 0x7Eu);
}

static inline uint8_t f32_to_e5m2(float f) {
  return f32_to_fp8(f, 2, 15, 0x47600000u /* 57344 */, 0x7Bu);
}

static inline LUTRA_CODEC_HD float fp8_to_f32(uint32_t c, int mbits, int bias) {
  uint32_t sign = (c & 0x80u) << 24;
  uint32_t e = (c & 0x7Fu) >> mbits;
  uint32_t m = c & ((1u << mbits) - 1u);
  if (e == 0) {
    /* m * 2^(1 - bias - mbits), exact */
    float v = bits_f32((uint32_t)(127 + 1 - bias - mbits) << 23) * (float)m;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((e + (uint32_t)(127 - bias)) << 23) | (m << (23 - mbits)));
}

static inline LUTRA_CODEC_HD float e4m3_to_f32(uint32_t c) {
  c &= 0xFFu;
  if ((c & 0x7Fu) == 0x7Fu) return bits_f32(LUTRA_F32_NAN_BITS);
  return fp8_to_f32(c, 3, 7);
}

static inline float e5m2_to_f32(uint32_t c) {
  c &= 0xFFu;
  if ((c & 0x7Cu) == 0x7Cu) {
    if ((c & 0x03u) == 0) return (c & 0x80u) ? -INFINITY : INFINITY;
    return bits_f32(LUTRA_F32_NAN_BITS);
  }
  return fp8_to_f32(c, 2, 15);
}

/* ---- E8M0 ------------------------------------------------------------------------------ */

static inline uint8_t f32_to_e8m0(float f) {
  if (isnan(f)) return 0xFF;
  if (isinf(f)) return 0xFE;
  if (f == 0.0f) return 0x00;
  uint32_t u = f32_bits(f);
  uint32_t exponent = (u >> 23) & 0xFFu;
  uint32_t mantissa = u & 0x7FFFFFu;
  if ((mantissa > 0 && exponent != 0xFE) && !(exponent == 0 && mantissa <= 0x400000u)) exponent++;
  return (uint8_t)exponent;
}

static inline float e8m0_to_f32(uint32_t e) {
  e &= 0xFFu;
  if (e == 0xFF) return bits_f32(LUTRA_F32_NAN_BITS);
  if (e == 0) return bits_f32(0x00400000u); /* 2^-127, an f32 subnormal */
  return bits_f32(e << 23);
}

/* ---- public scalar helpers ------------------------------------------------------------- */
/* ---- element access for F32, BF16, F16 (values widened to / rounded from f32, RNE) -------- */

static inline float lutra_elem_load(const void *p, int dtype, int64_t i) {
  switch (dtype) {
  case LUTRA_F32:
    return ((const float *)p)[i];
  case LUTRA_BF16:
    return bf16_to_f32(((const uint16_t *)p)[i]);
  case LUTRA_F16:
    return f16_to_f32(((const uint16_t *)p)[i]);
  default:
    return NAN;
  }
}

static inline void lutra_elem_store(void *p, int dtype, int64_t i, float v) {
  switch (dtype) {
  case LUTRA_F32:
    ((float *)p)[i] = v;
    break;
  case LUTRA_BF16:
    ((uint16_t *)p)[i] = f32_to_bf16(v);
    break;
  case LUTRA_F16:
    ((uint16_t *)p)[i] = f32_to_f16(v);
    break;
  default:
    break;
  }
}

#endif
