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

#include "nn/linear/linear_core_quantizers.h"

#include <stdbool.h>

/* Parameters as the desc says (checked), initialised as torch does. On failure nothing is kept. */
int lutra_linear_core_init(lutra_linear_core *c, const lutra_linear_desc *d, const char *fn);
void lutra_linear_core_release(lutra_linear_core *c);

/* whether the forward can end in activation act (a GEMM epilogue) */
bool lutra_linear_core_ends_in(int act);
/* *y = act(x W^T + b) (act LUTRA_ACT_NONE: no activation; else c->pre keeps x W^T + b) */
int lutra_linear_core_forward(lutra_linear_core *c, const lutra_tensor *x,
                              const lutra_forward_args *a, int act, lutra_tensor **y,
                              const char *fn);

/* The forward of the module right after activation act, from pre, the activation's input:
 * *y = act(pre) W^T + b. Under FP8 with a recipe whose input cast takes an activation
 * (lutra_quantizer_takes_act), act runs inside that cast (*fused true); otherwise the
 * activation's kernel writes c->act_y first and the forward runs from it. *act_y is the
 * activation's output (c->act_y), its data written unless only the fused cast needed it. */
bool lutra_linear_core_starts_with_act(int act);
int lutra_linear_core_forward_from_act(lutra_linear_core *c, const lutra_tensor *pre,
                                       const lutra_forward_args *a, int act, lutra_tensor **y,
                                       const lutra_tensor **act_y, bool *fused, const char *fn);

/* The backward of the last forward, from dy = the gradient of its output. dx NULL: the input's
 * gradient is not wanted (no dgrad GEMM). Fusions:
 *   dact_act, dact_pre  the input of this core's forward was an activation's output, pre that
 *                       activation's input: dx is multiplied by act'(pre) in the dgrad GEMM's
 *                       epilogue where that GEMM can (*dact_fused says), so *dx is the gradient
 *                       of the activation's input
 *   from_act_grad       dy is the gradient of the output of activation act_grad_act (0: the
 *                       one the last forward ended in), whose input was this core's output (or
 *                       its pre-activation when the forward ended in it): act' goes into the
 *                       grad_output cast (lutra_linear_core_starts_from_act_grad said it can) */
typedef struct lutra_linear_backward_op {
  const lutra_tensor *dy;
  int dact_act;
  const lutra_tensor *dact_pre;
  bool from_act_grad;
  int act_grad_act;
} lutra_linear_backward_op;
int lutra_linear_core_backward(lutra_linear_core *c, const lutra_linear_backward_op *op,
                               lutra_tensor **dx, bool *dact_fused, const char *fn);
bool lutra_linear_core_starts_from_act_grad(const lutra_linear_core *c, int act);

/* The input quantizer of the next forward of x under the current scope when that forward is FP8
 * (built for the recipe; x checked as the forward checks it), else *q = NULL. */
int lutra_linear_core_input_quantizer(lutra_linear_core *c, const lutra_tensor *x,
                                      lutra_quantizer **q, const char *fn);
/* Checkpoints: whether c is inside a gradient-accumulation window under delayed scaling
 * (lutra_checkpoint_ops.in_accumulation_window). */
bool lutra_linear_core_in_accumulation_window(const lutra_linear_core *c);
/* Parameters (nn/linear/linear_core_params.c) */
/* the FP8 weight the last forward quantized (rowwise), NULL when it ran in high precision */
static inline const lutra_tensor *lutra_linear_core_fp8_weight(const lutra_linear_core *c) {
  return c->forward_done && c->forward_fp8 ? c->wq : NULL;
}
int lutra_linear_core_num_params(const lutra_linear_core *c);
void lutra_linear_core_param(const lutra_linear_core *c, int i, lutra_param *out);

#endif
