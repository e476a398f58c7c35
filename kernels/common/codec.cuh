/* The bf16 / f16 / FP8 / E8M0 conversions of src/core/codec.h, bit for bit (NaN included; see
 * base.cuh), and the FP8 encoding of products 16 at a time (kernels/common/). The 16-bit
 * conversions are CUDA's (cvt.rn.bf16.f32, cvt.rn.f16.f32, cvt.f32.f16 on the device; cuda_bf16.h
 * and cuda_fp16.h's host code elsewhere), which give codec.h's results
 * (spec/native/check_codecs.cu checks the host code against codec.h). */
#ifndef LUTRA_KERNELS_COMMON_CODEC_CUH
#define LUTRA_KERNELS_COMMON_CODEC_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/f32.cuh"

namespace lkc {

/* ---- bf16 / f16 (src/core/codec.h) ----------------------------------------------------------- */

/* f32 -> bf16 bits: RNE (overflow to inf, NaN 0x7FFF) */
LKC_HD uint32_t bf16_bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

LKC_HD float bf16_value(uint32_t h) {
  return bits_f32((h & 0xFFFFu) << 16);
}

/* f32 -> f16 bits: IEEE RNE (overflow to inf, exact subnormals, NaN 0x7FFF) */
LKC_HD uint32_t f16_bits(float f) {
  __half_raw r = __float2half_rn(f);
  return r.x;
}

/* f16 bits -> f32, exact; NaN 0x7FFFFFFF as cvt.f32.f16 and src/core/codec.h give it */
LKC_HD float f16_value(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}

/* ---- FP8 (src/core/codec.h) ------------------------------------------------------------------ */

/* the integer mirror of src/core/codec.h's narrow_rne (finite |x| only, sign cleared) */
LKC_HD uint32_t narrow_rne(uint32_t mag, int mbits, int bias) {
  int e = (int)(mag >> 23);
  uint32_t m24;
  int e_unb;
  if (e == 0) {
    if (mag == 0) return 0;
    m24 = mag;
    e_unb = -126;
  } else {
    m24 = (mag & 0x7FFFFFu) | 0x800000u;
    e_unb = e - 127;
  }
  int te = e_unb > 1 - bias ? e_unb : 1 - bias;
  int shift = te - mbits - (e_unb - 23);
  uint32_t k;
  if (shift > 25) {
    k = 0;
  } else {
    k = m24 >> shift;
    uint32_t rem = m24 & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (k & 1u))) k++;
  }
  return ((uint32_t)(te + bias - 1) << mbits) + k;
}

LKC_HD uint32_t e4m3_soft(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 24) & 0x80u;
  uint32_t mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return 0x7Fu;
  if (mag > 0x43E00000u) return sign | 0x7Eu;
  uint32_t c = narrow_rne(mag, 3, 7);
  if (c > 0x7Eu) c = 0x7Eu;
  return sign | c;
}

LKC_HD uint32_t e5m2_soft(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 24) & 0x80u;
  uint32_t mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return 0x7Fu;
  if (mag > 0x47600000u) return sign | 0x7Bu;
  uint32_t c = narrow_rne(mag, 2, 15);
  if (c > 0x7Bu) c = 0x7Bu;
  return sign | c;
}

template <int OD> LKC_HD uint32_t fp8_soft(float f) {
  return OD == LUTRA_E4M3 ? e4m3_soft(f) : e5m2_soft(f);
}

/* Two FP8 codes (lo in bits 0..7, hi in bits 8..15), as lutra_encode gives them */
template <int OD> LKC_HD uint32_t fp8x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && !defined(LKC_SOFT_FP8)
  unsigned short r;
  if (OD == LUTRA_E4M3)
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return fp8_soft<OD>(lo) | (fp8_soft<OD>(hi) << 8);
#endif
}

/* FP8 code -> f32, exact, as lutra_decode (NaN codes give 0x7FFFFFFF) */
LKC_HD float fp8_value_soft(uint32_t c, int mbits, int bias) {
  uint32_t sign = (c & 0x80u) << 24;
  uint32_t e = (c & 0x7Fu) >> mbits;
  uint32_t m = c & ((1u << mbits) - 1u);
  if (e == 0) {
    float v = bits_f32((uint32_t)(127 + 1 - bias - mbits) << 23) * (float)m;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((e + (uint32_t)(127 - bias)) << 23) | (m << (23 - mbits)));
}

template <int DT> LKC_HD float fp8_value(uint32_t c) {
  c &= 0xFFu;
  if (DT == LUTRA_E4M3) {
    if ((c & 0x7Fu) == 0x7Fu) return bits_f32(0x7FFFFFFFu);
    return fp8_value_soft(c, 3, 7);
  }
  if ((c & 0x7Cu) == 0x7Cu) {
    if ((c & 0x03u) == 0) return bits_f32((c & 0x80u) ? 0xFF800000u : 0x7F800000u);
    return bits_f32(0x7FFFFFFFu);
  }
  return fp8_value_soft(c, 2, 15);
}

/* Two FP8 codes (bits 0..15 of c2) -> f32, as fp8_value (the f16 NaN 0x7FFF widens to
 * 0x7FFFFFFF) */
template <int DT> LKC_HD float2 fp8x2_values(uint32_t c2) {
#ifdef __CUDA_ARCH__
  unsigned int h2;
  const unsigned short in = (unsigned short)(c2 & 0xFFFFu);
  if (DT == LUTRA_E4M3)
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(in));
  else
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h2) : "h"(in));
  __half2_raw raw;
  raw.x = (unsigned short)(h2 & 0xFFFFu);
  raw.y = (unsigned short)(h2 >> 16);
  return __half22float2(__half2(raw));
#else
  return make_float2(fp8_value<DT>(c2), fp8_value<DT>(c2 >> 8));
#endif
}

/* ---- E8M0 (TransformerEngine's float_to_e8m0 and exp2f_rcp) ---------------------------------- */

LKC_HD uint32_t e8m0_bits(float f) {
  if (is_nan(f)) return 0xFFu;
  if (is_inf(f)) return 0xFEu;
  if (f == 0.0f) return 0x00u;
  uint32_t u = f32_bits(f);
  uint32_t exponent = (u >> 23) & 0xFFu;
  uint32_t mantissa = u & 0x7FFFFFu;
  if ((mantissa > 0 && exponent != 0xFEu) && !(exponent == 0 && mantissa <= 0x400000u)) exponent++;
  return exponent & 0xFFu;
}

LKC_HD float e8m0_value(uint32_t e) {
  e &= 0xFFu;
  if (e == 0xFFu) return bits_f32(0x7FFFFFFFu);
  if (e == 0) return bits_f32(0x00400000u);
  return bits_f32(e << 23);
}

/* 1 / 2^(e - 127) as quantize_cpu.c's mx_scale_rcp (1 for e = 0, 0 for e = 254) */
LKC_HD float mx_scale_rcp(uint32_t e) {
  if (e == 0) return 1.0f;
  if (e == 0xFFu) return bits_f32(0x7FC00000u);
  return bits_f32((254u - e) << 23);
}

/* ---- FP8 encoding of products, 16 at a time -------------------------------------------------- */

/* codes of v[k] * s for k = 0..15, as lutra_encode(od, v[k] * s) on the CPU (a NaN product's
 * bits differ between x86 and the GPU, but every NaN has the one code) */
template <int OD> LKC_HD uint4 encode16(const float (&v)[16], float s) {
  float p[16];
  LKC_UNROLL
  for (int k = 0; k < 16; k++)
    p[k] = v[k] * s;
  uint32_t w[4];
  LKC_UNROLL
  for (int j = 0; j < 4; j++)
    w[j] = fp8x2<OD>(p[4 * j], p[4 * j + 1]) | (fp8x2<OD>(p[4 * j + 2], p[4 * j + 3]) << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

template <int OD> LKC_HD uint32_t encode1(float v, float s) {
  return fp8x2<OD>(v * s, 0.0f) & 0xFFu;
}

LKC_HD uint32_t byte_of(const uint4 &w, int k) {
  const uint32_t a = k < 4 ? w.x : k < 8 ? w.y : k < 12 ? w.z : w.w;
  return (a >> (8 * (k & 3))) & 0xFFu;
}

} // namespace lkc

#endif
