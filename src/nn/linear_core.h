/* The Linear core: what every linear-like module (Linear, and the norm-fused and grouped modules
 * built on it) shares: parameters and their gradients, the quantizers of a recipe, the buffers,
 * and the forward / backward GEMM sequence, as TransformerEngine runs it:
 *   forward  y  = q(x) q(W)^T        TN, fast accumulation, bias in the epilogue
 *   dgrad    dx = q(dy) q(W)         NN -> TN through W's columnwise copy
 *   wgrad    dW = q(dy)^T q(x)       NT -> TN through the columnwise copies of dy and x
 * in FP8 under an enabled autocast scope, in the parameters' dtype otherwise. The quantizers are
 * built once per recipe (key compared per call, rebuilt only when the recipe changes) and every
 * buffer is reused while the input shape stays, so a steady loop allocates nothing. */
#ifndef LUTRA_NN_LINEAR_CORE_H
#define LUTRA_NN_LINEAR_CORE_H

#include "backend/backend.h"
#include "fp8/factory.h"
#include "lutra.h"

#include <stdbool.h>

typedef struct lutra_linear_core {
  int64_t in, out;
  int32_t dtype, device;
  bool has_bias, accumulate_main_grad;
  const lutra_backend *be;
  lutra_tensor *weight, *bias, *wgrad, *bgrad, *weight_main_grad, *bias_main_grad;
  lutra_tensor *y, *dx;
  lutra_tensor *pre; /* y's pre-activation when the forward ended in an activation */
  lutra_quantizer *q[LUTRA_NUM_ROLES];
  bool quantized_for_recipe; /* q[] were built for qkey */
  uint64_t qkey;
  /* what the last forward did, for backward */
  const lutra_tensor *x;
  lutra_tensor *xq, *wq;
  int32_t forward_act; /* LUTRA_ACT_* the last forward ended in */
  bool forward_done, forward_grad, forward_fp8, weight_cached, backward_trigger;
  bool backward_done;                   /* a backward ran since the last forward */
  lutra_module_choice choice;           /* name, kind, and the quantizers a factory recipe chose */
  lutra_recipe_options forward_options; /* the recipe's GEMM options at the last FP8 forward */
  lutra_tensor *xdq, *wdq; /* backward_override "dequantized": the FP8 x and W dequantized */
  /* hybrid roles (rowwise and columnwise in two formats): q[] writes the rowwise copy, qc[] the
   * columnwise one into xqc / wqc (and the gradient's, which backward keeps locally) */
  lutra_quantizer *qc[LUTRA_NUM_ROLES];
  lutra_tensor *xqc, *wqc;
} lutra_linear_core;

/* Parameters as the desc says (checked), initialised as torch does. On failure nothing is kept. */
int lutra_linear_core_init(lutra_linear_core *c, const lutra_linear_desc *d, const char *fn);
void lutra_linear_core_release(lutra_linear_core *c);

/* whether the forward can end in activation act (a GEMM epilogue) */
bool lutra_linear_core_ends_in(int act);
/* *y = act(x W^T + b) (act LUTRA_ACT_NONE: no activation; else c->pre keeps x W^T + b) */
int lutra_linear_core_forward(lutra_linear_core *c, const lutra_tensor *x,
                              const lutra_forward_args *a, int act, lutra_tensor **y,
                              const char *fn);

/* The backward of the last forward, from dy = the gradient of its output. dx NULL: the input's
 * gradient is not wanted (no dgrad GEMM). Fusions:
 *   dact_act, dact_pre  the input of this core's forward was an activation's output, pre that
 *                       activation's input: dx is multiplied by act'(pre) in the dgrad GEMM's
 *                       epilogue where that GEMM can (*dact_fused says), so *dx is the gradient
 *                       of the activation's input
 *   from_act_grad       the last forward ended in an activation and dy is the gradient of its
 *                       output: act' goes into the grad_output cast (lutra_linear_core_starts_
 *                       from_act_grad said it can) */
typedef struct lutra_linear_backward_op {
  const lutra_tensor *dy;
  int dact_act;
  const lutra_tensor *dact_pre;
  bool from_act_grad;
} lutra_linear_backward_op;
int lutra_linear_core_backward(lutra_linear_core *c, const lutra_linear_backward_op *op,
                               lutra_tensor **dx, bool *dact_fused, const char *fn);
bool lutra_linear_core_starts_from_act_grad(const lutra_linear_core *c, int act);

int lutra_linear_core_num_params(const lutra_linear_core *c);
void lutra_linear_core_param(const lutra_linear_core *c, int i, lutra_param *out);

#endif
