/* Element formulas of the activations beside the tanh GELU (ops_common.cuh has that one), for
 * kernels/activation/activation.cu: src/backend/cpu/activation_cpu.c operation for operation, through
 * fadd/fmul/fdiv (no FMA contraction). ReLU and SquaredReLU (and ReGLU) are bit for bit the
 * CPU's; the sigmoid kinds round expf and the erf GELU erff, which CUDA may compute a few ulps
 * off libm, so the GPU specs compare those by a bound. Each kind is a struct with f (the
 * element function, the gate's for gated kinds) and df (its derivative). */
#ifndef LUTRA_KERNELS_ACTIVATION_MATH_CUH
#define LUTRA_KERNELS_ACTIVATION_MATH_CUH

#include "ops_common.cuh"

namespace lkops {

constexpr float kQgeluK = 1.702f;
constexpr float kQgeluMK = -1.702f;                 /* the CPU's -k * x with k = 1.702f */
constexpr float kSqrt1_2 = 0.70710678118654752f;    /* 1 / sqrt 2 */
constexpr float kInvSqrt2Pi = 0.39894228040143268f; /* 1 / sqrt(2 pi) */

struct ActGeluTanh {
  static LKOPS_HD float f(float x) { return gelu(x); }
  static LKOPS_HD float df(float x) { return gelu_grad(x); }
};

struct ActRelu {
  static LKOPS_HD float f(float x) { return x > 0.0f ? x : 0.0f; }
  static LKOPS_HD float df(float x) { return x > 0.0f ? 1.0f : 0.0f; }
};

/* x / (1 + e), e = exp(-k x); d/dx = s + k x e s^2 with the tails of gelu_grad */
template <bool QUICK> struct ActSig {
  static LKOPS_HD float e_of(float x) {
    /* SiLU's -1 * x is exactly -x, as the CPU's -k * x with k = 1 */
    return expf(QUICK ? fmul(kQgeluMK, x) : -x);
  }
  static LKOPS_HD float f(float x) { return fdiv(x, fadd(1.0f, e_of(x))); }
  static LKOPS_HD float df(float x) {
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
  static LKOPS_HD float f(float x) { return x > 0.0f ? fmul(x, x) : 0.0f; }
  static LKOPS_HD float df(float x) { return x > 0.0f ? fmul(2.0f, x) : 0.0f; }
};

struct ActGeluErf {
  static LKOPS_HD float f(float x) {
    return fmul(fmul(0.5f, x), fadd(1.0f, erff(fmul(x, kSqrt1_2))));
  }
  static LKOPS_HD float df(float x) {
    const float phi = fmul(kInvSqrt2Pi, expf(fmul(fmul(-0.5f, x), x)));
    return fadd(fmul(0.5f, fadd(1.0f, erff(fmul(x, kSqrt1_2)))), fmul(x, phi));
  }
};

/* Calls f(Kind()) for LUTRA_ACT_* act (gated kinds: their gate's function), unknown() for any
 * other act: on the host (with_act) and in the kernels (act_cast.cuh's act_f, act_df). */
#pragma nv_exec_check_disable
template <class F, class U> LKOPS_HD auto act_dispatch(int act, F &&f, U &&unknown) {
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
  default:
    return unknown();
  }
}

/* f(Kind()) for LUTRA_ACT_* act; cudaErrorInvalidValue for any other */
template <class F> inline cudaError_t with_act(int act, F &&f) {
  return act_dispatch(act, f, [] { return cudaErrorInvalidValue; });
}

} // namespace lkops

#endif
