/* Device helpers shared by lutra's CUDA kernels: element loads and stores by dtype, the exact
 * FP8 / E8M0 / bf16 / f16 conversions of src/core/codec.h, the f32 rules of
 * src/backend/cpu/quantize_cpu.c, reductions and launch plumbing.
 *
 * Bit-exactness with the CPU backend
 * - Conversions follow src/core/codec.h bit for bit, NaN included: codec.h gives what the
 *   hardware gives (one positive NaN per format: 0x7F for E4M3 and E5M2, 0x7FFF for bf16 and
 *   f16; 0x7FFFFFFF when a NaN code is widened), so the results of the hardware's RNE conversions
 *   (cvt.rn.satfinite.e4m3x2/e5m2x2.f32, cvt.rn.f16.f32, cvt.rn.f16x2.e4m3x2/e5m2x2) are stored
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
 * Everything that can run on the host is __host__ __device__, so that the conversions can be
 * checked against src/core/codec.h on the CPU. */
#ifndef LUTRA_KERNELS_COMMON_CUH
#define LUTRA_KERNELS_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <stdint.h>
#include <string.h>
#include <type_traits>

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

/* ---- bf16 / f16 (src/core/codec.h) ----------------------------------------------------------- */

LKC_HD uint32_t bf16_bits(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFFu; /* cvt.rn.bf16.f32's NaN */
  u += 0x7FFFu + ((u >> 16) & 1u);
  return u >> 16;
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
  const uint32_t sign = (h & 0x8000u) << 16, em = h & 0x7FFFu;
  if (em > 0x7C00u) return bits_f32(0x7FFFFFFFu);
  if (em == 0x7C00u) return bits_f32(sign | 0x7F800000u);
  /* em << 13 is the f32 pattern of value * 2^-112 (normal or subnormal): rescale exactly */
  const float v = bits_f32(em << 13) * 0x1p112f;
  return bits_f32(f32_bits(v) | sign);
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

/* ---- f32 scale rules (src/backend/cpu/quantize_cpu.c) ---------------------------------------- */

/* TransformerEngine's compute_scale_from_amax (value_for_inf = FLT_MAX) */
LKC_HD float scale_rule(float amax, float fp8_max, int power_2_scale, float epsilon) {
  float a = amax;
  if (a < epsilon) a = epsilon;
  float scale = 1.0f;
  if (is_inf(a) || a == 0.0f) return scale;
  scale = div_x86(fp8_max, a);
  if (is_inf(scale)) scale = FLT_MAX_F;
  if (power_2_scale) scale = bits_f32(f32_bits(scale) & 0xFF800000u);
  return scale;
}

/* exp2f(e) for an integer e, exactly as a correctly rounded exp2f gives it */
LKC_HD float exp2_int(int32_t e) {
  if (e >= 128) return bits_f32(0x7F800000u);
  if (e >= -126) return bits_f32((uint32_t)(e + 127) << 23);
  if (e >= -149) return bits_f32(1u << (e + 149));
  return 0.0f;
}

/* ---- element access by dtype ----------------------------------------------------------------- */

template <int DT> struct elem_size { static constexpr int value = DT == LUTRA_F32 ? 4 : 2; };

/* one element as f32 */
template <int DT> LKC_HD float load1(const void *p, int64_t i) {
  if (DT == LUTRA_F32) return static_cast<const float *>(p)[i];
  const uint32_t h = static_cast<const uint16_t *>(p)[i];
  return DT == LUTRA_BF16 ? bf16_value(h) : f16_value(h);
}

template <int DT> LKC_HD uint32_t half_bits(float v) {
  return DT == LUTRA_BF16 ? bf16_bits(v) : f16_bits(v);
}

template <int DT> LKC_HD float half_value(uint32_t h) {
  return DT == LUTRA_BF16 ? bf16_value(h) : f16_value(h);
}

template <int DT> LKC_HD void store1(void *p, int64_t i, float v) {
  if (DT == LUTRA_F32)
    static_cast<float *>(p)[i] = v;
  else
    static_cast<uint16_t *>(p)[i] = (uint16_t)half_bits<DT>(v);
}

/* 16 consecutive elements from element i (p + i 16-byte aligned) */
template <int DT> LKC_HD void load16(const void *p, int64_t i, float (&v)[16]) {
  if (DT == LUTRA_F32) {
    const float4 *q = reinterpret_cast<const float4 *>(static_cast<const float *>(p) + i);
    LKC_UNROLL
    for (int k = 0; k < 4; k++) {
      const float4 f = q[k];
      v[4 * k] = f.x;
      v[4 * k + 1] = f.y;
      v[4 * k + 2] = f.z;
      v[4 * k + 3] = f.w;
    }
  } else {
    const uint4 *q = reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(p) + i);
    LKC_UNROLL
    for (int k = 0; k < 2; k++) {
      const uint4 w = q[k];
      const uint32_t a[4] = {w.x, w.y, w.z, w.w};
      LKC_UNROLL
      for (int j = 0; j < 4; j++) {
        v[8 * k + 2 * j] = half_value<DT>(a[j] & 0xFFFFu);
        v[8 * k + 2 * j + 1] = half_value<DT>(a[j] >> 16);
      }
    }
  }
}

/* 16 consecutive elements from element i (p + i 16-byte aligned) */
template <int DT> LKC_HD void store16(void *p, int64_t i, const float (&v)[16]) {
  if (DT == LUTRA_F32) {
    float4 *q = reinterpret_cast<float4 *>(static_cast<float *>(p) + i);
    LKC_UNROLL
    for (int k = 0; k < 4; k++)
      q[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
  } else {
    uint4 *q = reinterpret_cast<uint4 *>(static_cast<uint16_t *>(p) + i);
    LKC_UNROLL
    for (int k = 0; k < 2; k++) {
      uint32_t a[4];
      LKC_UNROLL
      for (int j = 0; j < 4; j++)
        a[j] = half_bits<DT>(v[8 * k + 2 * j]) | (half_bits<DT>(v[8 * k + 2 * j + 1]) << 16);
      q[k] = make_uint4(a[0], a[1], a[2], a[3]);
    }
  }
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

/* ---- reductions ------------------------------------------------------------------------------ */

#if defined(__CUDACC__) || defined(LKC_SIM)
#ifndef LKC_SIM
/* the block's dynamic shared memory */
LKC_D unsigned char *dyn_smem() {
  extern __shared__ __align__(16) unsigned char lkc_dyn_smem[];
  return lkc_dyn_smem;
}
#endif

LKC_D float warp_max(float m) {
  LKC_UNROLL
  for (int o = 16; o > 0; o >>= 1)
    m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, o));
  return m;
}

/* max over the block (fmaxf: NaNs ignored); every thread gets it. red: >= 32 floats of shared
 * memory, not in use by anyone else until the next __syncthreads after this returns */
LKC_D float block_max(float m, float *red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  m = warp_max(m);
  __syncthreads(); /* red may still be read from an earlier call */
  if (lane == 0) red[warp] = m;
  __syncthreads();
  m = red[0];
  for (int k = 1; k < nw; k++)
    m = fmaxf(m, red[k]);
  return m;
}

/* *addr = fmaxf(*addr, v) for v >= 0 (not NaN), atomically. The integer maximum of the bit
 * patterns is the float maximum for non-negative values and replaces negative ones (a negative
 * NaN included, which fmaxf also drops); a positive NaN in *addr needs the CAS loop. */
LKC_D void atomic_fmax(float *addr, float v) {
  int old = atomicMax(reinterpret_cast<int *>(addr), (int)f32_bits(v));
  if (old > 0x7F800000) {
    int cur = old;
    for (;;) {
      const float nv = fmaxf(bits_f32((uint32_t)cur), v);
      const int nb = (int)f32_bits(nv);
      if (nb == cur) break;
      const int prev = atomicCAS(reinterpret_cast<int *>(addr), cur, nb);
      if (prev == cur) break;
      cur = prev;
    }
  }
}
#endif

/* ---- host-side launch helpers ---------------------------------------------------------------- */

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

inline bool aligned16(const void *p) {
  return ((uintptr_t)p & 15u) == 0;
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

/* ---- the tiled quantizers (kernels/quantize/cast_transpose.cu) --------------------------------------- */

/* Per-tensor cast with a columnwise (transposed) output, through shared-memory tiles (k_cast16's
 * 128x128 or k_tile64's 64x64); lk_cast uses it when col_data is set. Arguments are checked by
 * the caller. */
cudaError_t cast_transpose(const lutra_quant_args *a, cudaStream_t s);

} // namespace lkc

#endif
