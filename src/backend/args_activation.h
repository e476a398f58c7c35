/* The backend's activation arguments (backend/backend.h's activation_forward / _backward and
 * bias_grad entries): the activation kinds, one activation, one bias gradient. */
#ifndef LUTRA_BACKEND_ARGS_ACTIVATION_H
#define LUTRA_BACKEND_ARGS_ACTIVATION_H

#include "backend/args_common.h"

LUTRA_ARGS_NO_PADDING_BEGIN
/* Activation kinds (lutra_act_args.act). Internal to the backends and modules, so that kinds
 * can be added (relu, silu, swiglu, erf GELU, tanh) without touching the public API; a backend
 * refuses a kind it does not implement with LUTRA_EUNSUPPORTED. */
enum {
  LUTRA_ACT_NONE = 0, /* no activation (modules and fusions; no backend entry takes it) */
  /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), TransformerEngine's and cuBLASLt's GELU */
  LUTRA_ACT_GELU_TANH = 1,
  /* ---- activations beside the tanh GELU (TransformerEngine's set); the values are the public
   * LUTRA_ACTIVATION_* of lutra.h, which src/nn/activation.c asserts ---- */
  LUTRA_ACT_RELU = 2,     /* max(x, 0) */
  LUTRA_ACT_SILU = 3,     /* x sigmoid(x) */
  LUTRA_ACT_QGELU = 4,    /* x sigmoid(1.702 x) */
  LUTRA_ACT_SRELU = 5,    /* relu(x)^2 */
  LUTRA_ACT_GELU_ERF = 6, /* 0.5 x (1 + erf(x / sqrt 2)) */
  /* gated: x [rows, cols], cols = 2h even, gate a = x[:, :h], linear b = x[:, h:] (TE's order);
   * y [rows, h] = f(a) b */
  LUTRA_ACT_SWIGLU = 7, /* silu(a) b */
  LUTRA_ACT_GEGLU = 8,  /* gelu_tanh(a) b */
  LUTRA_ACT_REGLU = 9,  /* relu(a) b */
  LUTRA_ACT_TANH = 10,  /* tanh(x), element-wise (after the gated kinds: the values are public) */
  LUTRA_ACT_COUNT = 11, /* one past the last kind */
};

/* whether kind act is gated (its input's last dim is split in two halves) */
static inline bool lutra_act_is_gated(int act) {
  return act == LUTRA_ACT_SWIGLU || act == LUTRA_ACT_GEGLU || act == LUTRA_ACT_REGLU;
}

/* An element-wise activation over n elements (F32/BF16/F16, all three buffers of one dtype):
 * forward out = act(x), backward out = dy * act'(x) in f32, rounded once. out may be x or dy
 * (each element is read before it is written).
 * Gated kinds read rows and cols (x [rows, cols], cols even, h = cols / 2) instead of n:
 * forward out [rows, h] = f(a) b; backward dy [rows, h], out = dx [rows, cols] with
 * da = dy b f'(a), db = dy f(a), each in f32 and rounded once; out must not alias x or dy. */
typedef struct lutra_act_args {
  const void *x;  /* the activation's input */
  const void *dy; /* backward: the gradient of its output; forward ignores it */
  void *out;      /* forward: y; backward: dx */
  int32_t dtype;
  int32_t act; /* LUTRA_ACT_* */
  int64_t n;
  int64_t rows, cols; /* gated kinds: the input's shape as a matrix (n is ignored) */
} lutra_act_args;

/* db[c] (+= when accumulate) sum_r dy[r, c], summed in double and rounded once into db_dtype. */
typedef struct lutra_bias_grad_args {
  const void *dy; /* [rows, cols] */
  int32_t dtype;
  int32_t pad;
  int64_t rows, cols;
  void *db; /* [cols] */
  int32_t db_dtype;
  int32_t accumulate;
  /* when not NULL and *skip != 0 at the time the work runs, nothing is written: a
   * quantization's skip flag (lutra_quant_args.skip), backend memory */
  const int32_t *skip;
} lutra_bias_grad_args;
LUTRA_ARGS_NO_PADDING_END

#endif
