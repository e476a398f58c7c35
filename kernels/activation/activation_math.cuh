/* Element formulas of the activations, for kernels/activation/activation.cu and the GEMM
 * epilogues (kernels/gemm/epilogue.cu): src/backend/cpu/activation_cpu.c operation for operation,
 * through fadd/fmul/fdiv (no FMA contraction). ReLU and SquaredReLU (and ReGLU) are bit for bit the
 * CPU's; the sigmoid kinds round expf, Tanh tanhf and expf, and the erf GELU erff, which CUDA may
 * compute a few ulps off libm, so the GPU specs compare those by a bound (the CPU's Tanh forward
 * is glibc's four-lane libmvec tanhf where present, itself within 4 ulp of libm's). Each kind is a struct
 * with f (the element function, the gate's for gated kinds) and df (its derivative). */
#ifndef LUTRA_KERNELS_ACTIVATION_MATH_CUH
#define LUTRA_KERNELS_ACTIVATION_MATH_CUH

#include <math.h>

#include "common/f32.cuh"

namespace lkc {

constexpr float kGeluC = 0.7978845608028654f; /* sqrt(2/pi) */
constexpr float kGeluA = 0.044715f;
constexpr float kGeluM2C = -2.0f * kGeluC; /* the CPU's -2.0f * GELU_C, folded in f32 */
constexpr float kGeluA3 = 3.0f * kGeluA;   /* the CPU's 3.0f * GELU_A, folded in f32 */

/* e = exp(-2u), u = c (x + a x^3) */
LKC_HD float gelu_exp(float x) {
  return expf(fmul(kGeluM2C, fadd(x, fmul(fmul(fmul(kGeluA, x), x), x))));
}

/* 0.5 x (1 + tanh(u)) = x / (1 + e) */
LKC_HD float gelu(float x) {
  return fdiv(x, fadd(1.0f, gelu_exp(x)));
}

/* s + 2 e s^2 x c (1 + 3 a x^2), s = 1 / (1 + e), with the CPU's tail cases */
LKC_HD float gelu_grad(float x) {
  const float e = gelu_exp(x);
  if (e == INFINITY) return 0.0f; /* far negative tail (e >= 0, so isinf(e) is e == +inf) */
  const float s = fdiv(1.0f, fadd(1.0f, e));
  const float k = fmul(fmul(e, s), s);
  if (k == 0.0f) return s; /* far positive tail */
  return fadd(s, fmul(fmul(fmul(fmul(2.0f, k), x), kGeluC), fadd(1.0f, fmul(fmul(kGeluA3, x), x))));
}

constexpr float kQgeluK = 1.702f;
constexpr float kQgeluMK = -1.702f;                 /* the CPU's -k * x with k = 1.702f */
constexpr float kSqrt1_2 = 0.70710678118654752f;    /* 1 / sqrt 2 */
constexpr float kInvSqrt2Pi = 0.39894228040143268f; /* 1 / sqrt(2 pi) */

struct ActGeluTanh {
  static LKC_HD float f(float x) { return gelu(x); }
  static LKC_HD float df(float x) { return gelu_grad(x); }
};

struct ActRelu {
  static LKC_HD float f(float x) { return x > 0.0f ? x : 0.0f; }
  static LKC_HD float df(float x) { return x > 0.0f ? 1.0f : 0.0f; }
};

/* x / (1 + e), e = exp(-k x); d/dx = s + k x e s^2 with the tails of gelu_grad */
template <bool QUICK> struct ActSig {
  static LKC_HD float e_of(float x) {
    /* SiLU's -1 * x is exactly -x, as the CPU's -k * x with k = 1 */
    return expf(QUICK ? fmul(kQgeluMK, x) : -x);
  }
  static LKC_HD float f(float x) { return fdiv(x, fadd(1.0f, e_of(x))); }
  static LKC_HD float df(float x) {
    const float e = e_of(x);
    if (e == INFINITY) return 0.0f;
    const float s = fdiv(1.0f, fadd(1.0f, e));
    const float q = fmul(fmul(e, s), s);
    if (q == 0.0f) return s;
    /* the CPU's k * x * q; with k = 1, 1 * x is x */
    return fadd(s, fmul(QUICK ? fmul(kQgeluK, x) : x, q));
  }
};

struct ActSrelu {
  static LKC_HD float f(float x) { return x > 0.0f ? fmul(x, x) : 0.0f; }
  static LKC_HD float df(float x) { return x > 0.0f ? fmul(2.0f, x) : 0.0f; }
};

/* tanhf(x); d/dx = 1 - tanh(x)^2 = 4 e s^2, e = exp(-2 |x|), s = 1 / (1 + e) (the CPU's, whose
 * comment says why) */
struct ActTanh {
  static LKC_HD float f(float x) { return tanhf(x); }
  static LKC_HD float df(float x) {
    /* -2 |x| is exact: the CPU's -2.0f * fabsf(x) */
    const float e = expf(fmul(-2.0f, fabsf(x)));
    const float s = fdiv(1.0f, fadd(1.0f, e));
    return fmul(fmul(fmul(4.0f, e), s), s);
  }
};

struct ActGeluErf {
  static LKC_HD float f(float x) {
    return fmul(fmul(0.5f, x), fadd(1.0f, erff(fmul(x, kSqrt1_2))));
  }
  static LKC_HD float df(float x) {
    const float phi = fmul(kInvSqrt2Pi, expf(fmul(fmul(-0.5f, x), x)));
    return fadd(fmul(0.5f, fadd(1.0f, erff(fmul(x, kSqrt1_2)))), fmul(x, phi));
  }
};

/* Calls f(Kind()) for LUTRA_ACT_* act (gated kinds: their gate's function), unknown() for any
 * other act: on the host (with_act) and in the kernels (act_cast.cuh's act_f, act_df). */
#pragma nv_exec_check_disable
template <class F, class U> LKC_HD auto act_dispatch(int act, F &&f, U &&unknown) {
  switch (act) {
  case LUTRA_ACT_GELU_TANH:
  case LUTRA_ACT_GEGLU:
    return f(ActGeluTanh());
  case LUTRA_ACT_RELU:
  case LUTRA_ACT_REGLU:
    return f(ActRelu());
  case LUTRA_ACT_SILU:
  case LUTRA_ACT_SWIGLU:
    return f(ActSig<false>());
  case LUTRA_ACT_QGELU:
    return f(ActSig<true>());
  case LUTRA_ACT_SRELU:
    return f(ActSrelu());
  case LUTRA_ACT_GELU_ERF:
    return f(ActGeluErf());
  case LUTRA_ACT_TANH:
    return f(ActTanh());
  default:
    return unknown();
  }
}

/* f(Kind()) for LUTRA_ACT_* act; cudaErrorInvalidValue for any other */
template <class F> inline cudaError_t with_act(int act, F &&f) {
  return act_dispatch(act, f, [] { return cudaErrorInvalidValue; });
}

} // namespace lkc

#endif
