/* Shared helpers of the activation, loss, bias and optimizer kernels (kernels/activation/activation.cu,
 * loss.cu, optim.cu): dtype loads and stores (F32, BF16, F16; stores round to nearest even as
 * src/core/codec.h does), the CPU backend's element formulas, and warp/block reductions.
 *
 * The element formulas are __host__ __device__ so that they can be checked on the host
 * against src/backend/cpu/activation_cpu.c and optim_cpu.c. Their f32 arithmetic goes through
 * fadd/fsub/fmul/fdiv/fsqrt, which on the device are the _rn intrinsics: nvcc never contracts those
 * into FMAs, so every rounding happens where the CPU's (ISO C, no contraction) code rounds, and the
 * optimizer updates are bit for bit the CPU's. Only expf (CUDA's, at most 2 ulp off) and the order
 * of long reductions differ. The narrowing stores write the hardware's one NaN (0x7FFF), which is
 * also src/core/codec.h's. */
#ifndef LUTRA_KERNELS_OPS_COMMON_CUH
#define LUTRA_KERNELS_OPS_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "kernels.h"

#define LKOPS_HD __host__ __device__ __forceinline__

namespace lkops {

inline bool float_dtype(int dt) {
  return dt == LUTRA_F32 || dt == LUTRA_BF16 || dt == LUTRA_F16;
}

inline bool aligned(const void *p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

template <int DT> constexpr int elem_size() {
  return DT == LUTRA_F32 ? 4 : 2;
}

/* elements per 16-byte access */
template <int DT> constexpr int vec16() {
  return 16 / elem_size<DT>();
}

template <class T> LKOPS_HD constexpr T cdiv(T a, T b) {
  return (a + b - 1) / b;
}
template <class T> LKOPS_HD constexpr T imin(T a, T b) {
  return a < b ? a : b;
}
template <class T> LKOPS_HD constexpr T imax(T a, T b) {
  return a > b ? a : b;
}

/* Calls f(std::integral_constant<int, DT>) for a float dtype; other dtypes are refused. */
template <class F> inline cudaError_t with_dtype(int dt, F &&f) {
  switch (dt) {
  case LUTRA_F32:
    return f(std::integral_constant<int, LUTRA_F32>());
  case LUTRA_BF16:
    return f(std::integral_constant<int, LUTRA_BF16>());
  case LUTRA_F16:
    return f(std::integral_constant<int, LUTRA_F16>());
  default:
    return cudaErrorInvalidValue;
  }
}

/* ---- f32 arithmetic rounded where the CPU rounds (no FMA contraction) -------------------- */

LKOPS_HD float fadd(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
LKOPS_HD float fsub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
LKOPS_HD float fmul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LKOPS_HD float fdiv(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
LKOPS_HD float fsqrt(float a) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(a);
#else
  return sqrtf(a);
#endif
}

/* ---- scalar element access --------------------------------------------------------------- */

template <int DT> LKOPS_HD float ld(const void *p, int64_t i) {
  if constexpr (DT == LUTRA_F32) {
    return static_cast<const float *>(p)[i];
  } else if constexpr (DT == LUTRA_BF16) {
    return __bfloat162float(__ushort_as_bfloat16(static_cast<const unsigned short *>(p)[i]));
  } else {
    return __half2float(__ushort_as_half(static_cast<const unsigned short *>(p)[i]));
  }
}

template <int DT> LKOPS_HD void st(void *p, int64_t i, float v) {
  if constexpr (DT == LUTRA_F32) {
    static_cast<float *>(p)[i] = v;
  } else if constexpr (DT == LUTRA_BF16) {
    static_cast<unsigned short *>(p)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  } else {
    static_cast<unsigned short *>(p)[i] = __half_as_ushort(__float2half_rn(v));
  }
}

/* run-time dtype (for the few places where a template per dtype is not worth it) */
LKOPS_HD float ld_rt(const void *p, int dt, int64_t i) {
  return dt == LUTRA_F32    ? ld<LUTRA_F32>(p, i)
         : dt == LUTRA_BF16 ? ld<LUTRA_BF16>(p, i)
                            : ld<LUTRA_F16>(p, i);
}
LKOPS_HD void st_rt(void *p, int dt, int64_t i, float v) {
  if (dt == LUTRA_F32)
    st<LUTRA_F32>(p, i, v);
  else if (dt == LUTRA_BF16)
    st<LUTRA_BF16>(p, i, v);
  else
    st<LUTRA_F16>(p, i, v);
}

/* ---- vector element access: N consecutive elements from index i ----------------------------
 * N == 1 is the scalar access. Otherwise N is a multiple of 4 and p + i must be aligned to
 * N * elem_size bytes (16 for N == vec16<DT>(); 8 for 16-bit values with N == 4). */

template <int DT> __device__ __forceinline__ void unpack2(uint32_t w, float &lo, float &hi) {
  if constexpr (DT == LUTRA_BF16) {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xFFFF0000u);
  } else {
    lo = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xFFFFu)));
    hi = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  }
}

template <int DT> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
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

template <int DT, int N>
__device__ __forceinline__ void ldv(const void *p, int64_t i, float (&f)[N]) {
  static_assert(N == 1 || N % 4 == 0, "vector width");
  if constexpr (N == 1) {
    f[0] = ld<DT>(p, i);
  } else if constexpr (DT == LUTRA_F32) {
    const float4 *q = reinterpret_cast<const float4 *>(static_cast<const float *>(p) + i);
#pragma unroll
    for (int k = 0; k < N / 4; k++) {
      const float4 v = q[k];
      f[4 * k] = v.x;
      f[4 * k + 1] = v.y;
      f[4 * k + 2] = v.z;
      f[4 * k + 3] = v.w;
    }
  } else if constexpr (N % 8 == 0) {
    const uint4 *q = reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(p) + i);
#pragma unroll
    for (int k = 0; k < N / 8; k++) {
      const uint4 v = q[k];
      unpack2<DT>(v.x, f[8 * k], f[8 * k + 1]);
      unpack2<DT>(v.y, f[8 * k + 2], f[8 * k + 3]);
      unpack2<DT>(v.z, f[8 * k + 4], f[8 * k + 5]);
      unpack2<DT>(v.w, f[8 * k + 6], f[8 * k + 7]);
    }
  } else {
    const uint2 *q = reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(p) + i);
#pragma unroll
    for (int k = 0; k < N / 4; k++) {
      const uint2 v = q[k];
      unpack2<DT>(v.x, f[4 * k], f[4 * k + 1]);
      unpack2<DT>(v.y, f[4 * k + 2], f[4 * k + 3]);
    }
  }
}

template <int DT, int N>
__device__ __forceinline__ void stv(void *p, int64_t i, const float (&f)[N]) {
  static_assert(N == 1 || N % 4 == 0, "vector width");
  if constexpr (N == 1) {
    st<DT>(p, i, f[0]);
  } else if constexpr (DT == LUTRA_F32) {
    float4 *q = reinterpret_cast<float4 *>(static_cast<float *>(p) + i);
#pragma unroll
    for (int k = 0; k < N / 4; k++)
      q[k] = make_float4(f[4 * k], f[4 * k + 1], f[4 * k + 2], f[4 * k + 3]);
  } else if constexpr (N % 8 == 0) {
    uint4 *q = reinterpret_cast<uint4 *>(static_cast<uint16_t *>(p) + i);
#pragma unroll
    for (int k = 0; k < N / 8; k++)
      q[k] =
          make_uint4(pack2<DT>(f[8 * k], f[8 * k + 1]), pack2<DT>(f[8 * k + 2], f[8 * k + 3]),
                     pack2<DT>(f[8 * k + 4], f[8 * k + 5]), pack2<DT>(f[8 * k + 6], f[8 * k + 7]));
  } else {
    uint2 *q = reinterpret_cast<uint2 *>(static_cast<uint16_t *>(p) + i);
#pragma unroll
    for (int k = 0; k < N / 4; k++)
      q[k] = make_uint2(pack2<DT>(f[4 * k], f[4 * k + 1]), pack2<DT>(f[4 * k + 2], f[4 * k + 3]));
  }
}

/* ---- element formulas (src/backend/cpu/activation_cpu.c, optim_cpu.c, operation for operation) */

constexpr float kGeluC = 0.7978845608028654f; /* sqrt(2/pi) */
constexpr float kGeluA = 0.044715f;
constexpr float kGeluM2C = -2.0f * kGeluC; /* the CPU's -2.0f * GELU_C, folded in f32 */
constexpr float kGeluA3 = 3.0f * kGeluA;   /* the CPU's 3.0f * GELU_A, folded in f32 */

/* e = exp(-2u), u = c (x + a x^3) */
LKOPS_HD float gelu_exp(float x) {
  return expf(fmul(kGeluM2C, fadd(x, fmul(fmul(fmul(kGeluA, x), x), x))));
}

/* 0.5 x (1 + tanh(u)) = x / (1 + e) */
LKOPS_HD float gelu(float x) {
  return fdiv(x, fadd(1.0f, gelu_exp(x)));
}

/* s + 2 e s^2 x c (1 + 3 a x^2), s = 1 / (1 + e), with the CPU's tail cases */
LKOPS_HD float gelu_grad(float x) {
  const float e = gelu_exp(x);
  if (e == INFINITY) return 0.0f; /* far negative tail (e >= 0, so isinf(e) is e == +inf) */
  const float s = fdiv(1.0f, fadd(1.0f, e));
  const float k = fmul(fmul(e, s), s);
  if (k == 0.0f) return s; /* far positive tail */
  return fadd(s, fmul(fmul(fmul(fmul(2.0f, k), x), kGeluC), fadd(1.0f, fmul(fmul(kGeluA3, x), x))));
}

LKOPS_HD float gelu_backward(float x, float dy) {
  return fmul(dy, gelu_grad(x));
}

struct SgdHyper {
  float lr, mu, wd;
};

/* one SGD element: w from master or value, g the gradient; mom is read and written when
 * has_mom (the CPU's momentum != 0) */
LKOPS_HD float sgd_update(float w, float g, bool has_mom, float &mom, const SgdHyper &h) {
  g = fadd(g, fmul(h.wd, w));
  if (has_mom) {
    mom = fadd(fmul(h.mu, mom), g);
    g = mom;
  }
  return fsub(w, fmul(h.lr, g));
}

struct AdamHyper {
  float lr;
  float decay;      /* lr * weight_decay, f32 */
  float b1, b2;     /* betas */
  float omb1, omb2; /* 1 - beta, f32 */
  float bc1, bc2;   /* (float)(1 - pow(beta, step)), computed in double on the host */
  float eps;
};

LKOPS_HD float adamw_update(float w, float g, float &m, float &v, const AdamHyper &h) {
  w = fsub(w, fmul(h.decay, w));
  m = fadd(fmul(h.b1, m), fmul(h.omb1, g));
  v = fadd(fmul(h.b2, v), fmul(fmul(h.omb2, g), g));
  const float mhat = fdiv(m, h.bc1), vhat = fdiv(v, h.bc2);
  return fsub(w, fdiv(fmul(h.lr, mhat), fadd(fsqrt(vhat), h.eps)));
}

/* ---- reductions (fixed trees: the same inputs give the same bits every run) ----------------- */

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v = fadd(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

/* Sum over a block of THREADS threads (1-D); the result is valid in every thread. smem holds
 * THREADS / 32 doubles. Starts with a barrier, so smem may be reused right after a previous
 * call returns. */
template <int THREADS> __device__ __forceinline__ double block_sum(double v, double *smem) {
  static_assert(THREADS % 32 == 0 && THREADS <= 1024, "block size");
  constexpr int W = THREADS / 32;
  v = warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = v;
  __syncthreads();
  double r = 0.0;
#pragma unroll
  for (int w = 0; w < W; w++)
    r += smem[w];
  return r;
}

template <int THREADS> __device__ __forceinline__ float block_max(float v, float *smem) {
  static_assert(THREADS % 32 == 0 && THREADS <= 1024, "block size");
  constexpr int W = THREADS / 32;
  v = warp_max(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = -INFINITY;
#pragma unroll
  for (int w = 0; w < W; w++)
    r = fmaxf(r, smem[w]);
  return r;
}

} // namespace lkops

#endif
