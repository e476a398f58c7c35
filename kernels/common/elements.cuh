/* Element loads and stores by dtype (F32, BF16, F16; kernels/common/, see base.cuh): one element
 * (ld, st; ld_rt, st_rt for a dtype known at run time only) or N consecutive ones (ldv, stv: a
 * 16-byte access for N == vec16<DT>()). Loads are exact; stores round to nearest even, writing
 * the one NaN 0x7FFF (codec.cuh's conversions, as src/core/codec.h). All __host__ __device__, so
 * that the CPU emulations (spec/native/) run the kernels' own accesses. */
#ifndef LUTRA_KERNELS_COMMON_ELEMENTS_CUH
#define LUTRA_KERNELS_COMMON_ELEMENTS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "common/codec.cuh"

namespace lkc {

template <int DT> LKC_HD constexpr int elem_size() {
  return DT == LUTRA_F32 ? 4 : 2;
}

/* elements per 16-byte access */
template <int DT> LKC_HD constexpr int vec16() {
  return 16 / elem_size<DT>();
}

/* ---- one element ----------------------------------------------------------------------------- */

/* the bits of v in a 16-bit dtype, and back */
template <int DT> LKC_HD uint32_t half_bits(float v) {
  return DT == LUTRA_BF16 ? bf16_bits(v) : f16_bits(v);
}

template <int DT> LKC_HD float half_value(uint32_t h) {
  return DT == LUTRA_BF16 ? bf16_value(h) : f16_value(h);
}

/* element i as f32 */
template <int DT> LKC_HD float ld(const void *p, int64_t i) {
  if constexpr (DT == LUTRA_F32)
    return static_cast<const float *>(p)[i];
  else
    return half_value<DT>(static_cast<const uint16_t *>(p)[i]);
}

template <int DT> LKC_HD void st(void *p, int64_t i, float v) {
  if constexpr (DT == LUTRA_F32)
    static_cast<float *>(p)[i] = v;
  else
    static_cast<uint16_t *>(p)[i] = static_cast<uint16_t>(half_bits<DT>(v));
}

/* run-time dtype (for the few places where a template per dtype is not worth it) */
LKC_HD float ld_rt(const void *p, int dt, int64_t i) {
  return dt == LUTRA_F32    ? ld<LUTRA_F32>(p, i)
         : dt == LUTRA_BF16 ? ld<LUTRA_BF16>(p, i)
                            : ld<LUTRA_F16>(p, i);
}
LKC_HD void st_rt(void *p, int dt, int64_t i, float v) {
  if (dt == LUTRA_F32)
    st<LUTRA_F32>(p, i, v);
  else if (dt == LUTRA_BF16)
    st<LUTRA_BF16>(p, i, v);
  else
    st<LUTRA_F16>(p, i, v);
}

/* ---- N consecutive elements from index i ------------------------------------------------------
 * N == 1 is the scalar access. Otherwise N is a multiple of 4 and p + i must be aligned to
 * N * elem_size bytes (16 for N == vec16<DT>(); 8 for 16-bit values with N == 4). */

/* the two 16-bit values of a word (lo in bits 0..15), and two values packed into one (the
 * paired conversions: cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32 on the device) */
template <int DT> LKC_HD void unpack2(uint32_t w, float &lo, float &hi) {
  if constexpr (DT == LUTRA_BF16) {
    lo = bits_f32(w << 16);
    hi = bits_f32(w & 0xFFFF0000u);
  } else {
    lo = half_value<DT>(w & 0xFFFFu);
    hi = half_value<DT>(w >> 16);
  }
}

template <int DT> LKC_HD uint32_t pack2(float lo, float hi) {
  if constexpr (DT == LUTRA_BF16) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return static_cast<uint32_t>(__bfloat16_as_ushort(h.x)) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(h.y)) << 16);
  } else {
    __half2 h = __floats2half2_rn(lo, hi);
    return static_cast<uint32_t>(__half_as_ushort(h.x)) |
           (static_cast<uint32_t>(__half_as_ushort(h.y)) << 16);
  }
}

template <int DT, int N> LKC_HD void ldv(const void *p, int64_t i, float (&f)[N]) {
  static_assert(N == 1 || N % 4 == 0, "vector width");
  if constexpr (N == 1) {
    f[0] = ld<DT>(p, i);
  } else if constexpr (DT == LUTRA_F32) {
    const float4 *q = reinterpret_cast<const float4 *>(static_cast<const float *>(p) + i);
    LKC_UNROLL
    for (int k = 0; k < N / 4; k++) {
      const float4 v = q[k];
      f[4 * k] = v.x;
      f[4 * k + 1] = v.y;
      f[4 * k + 2] = v.z;
      f[4 * k + 3] = v.w;
    }
  } else if constexpr (N % 8 == 0) {
    const uint4 *q = reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(p) + i);
    LKC_UNROLL
    for (int k = 0; k < N / 8; k++) {
      const uint4 v = q[k];
      unpack2<DT>(v.x, f[8 * k], f[8 * k + 1]);
      unpack2<DT>(v.y, f[8 * k + 2], f[8 * k + 3]);
      unpack2<DT>(v.z, f[8 * k + 4], f[8 * k + 5]);
      unpack2<DT>(v.w, f[8 * k + 6], f[8 * k + 7]);
    }
  } else {
    const uint2 *q = reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(p) + i);
    LKC_UNROLL
    for (int k = 0; k < N / 4; k++) {
      const uint2 v = q[k];
      unpack2<DT>(v.x, f[4 * k], f[4 * k + 1]);
      unpack2<DT>(v.y, f[4 * k + 2], f[4 * k + 3]);
    }
  }
}

template <int DT, int N> LKC_HD void stv(void *p, int64_t i, const float (&f)[N]) {
  static_assert(N == 1 || N % 4 == 0, "vector width");
  if constexpr (N == 1) {
    st<DT>(p, i, f[0]);
  } else if constexpr (DT == LUTRA_F32) {
    float4 *q = reinterpret_cast<float4 *>(static_cast<float *>(p) + i);
    LKC_UNROLL
    for (int k = 0; k < N / 4; k++)
      q[k] = make_float4(f[4 * k], f[4 * k + 1], f[4 * k + 2], f[4 * k + 3]);
  } else if constexpr (N % 8 == 0) {
    uint4 *q = reinterpret_cast<uint4 *>(static_cast<uint16_t *>(p) + i);
    LKC_UNROLL
    for (int k = 0; k < N / 8; k++)
      q[k] =
          make_uint4(pack2<DT>(f[8 * k], f[8 * k + 1]), pack2<DT>(f[8 * k + 2], f[8 * k + 3]),
                     pack2<DT>(f[8 * k + 4], f[8 * k + 5]), pack2<DT>(f[8 * k + 6], f[8 * k + 7]));
  } else {
    uint2 *q = reinterpret_cast<uint2 *>(static_cast<uint16_t *>(p) + i);
    LKC_UNROLL
    for (int k = 0; k < N / 4; k++)
      q[k] = make_uint2(pack2<DT>(f[4 * k], f[4 * k + 1]), pack2<DT>(f[4 * k + 2], f[4 * k + 3]));
  }
}

} // namespace lkc

#endif
