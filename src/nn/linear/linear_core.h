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
#include "fp8/recipe.h"
#include "lutra.h"
#include "runtime/tensor_cache.h"

#include <stdbool.h>

typedef struct lutra_linear_core {
  int64_t in, out;
  int32_t dtype, device;
  bool has_bias, accumulate_main_grad;
  const lutra_backend *be;
  lutra_tensor *weight, *bias, *wgrad, *bgrad, *weight_main_grad, *bias_main_grad;
  lutra_tensor *y, *dx;
  lutra_tensor *pre; /* y's pre-activation when the forward ended in an activation */
  /* the output of the activation before this module, when the forward started from it
   * (lutra_linear_core_forward_from_act): written only where a backward reads it */
  lutra_tensor *act_y;
  /* the buffers behind y, dx, pre and act_y, one per shape seen (runtime/tensor_cache.h) */
  lutra_tensor_cache y_cache, dx_cache, pre_cache, act_y_cache;
  lutra_quantizer *q[LUTRA_NUM_ROLES];
  bool quantized_for_recipe; /* q[] were built for qkey */
  uint64_t qkey;
  /* what the last forward did, for backward */
  const lutra_tensor *x;
  lutra_tensor *xq, *wq;
  int32_t forward_act; /* LUTRA_ACT_* the last forward ended in */
  bool forward_done, forward_grad, forward_fp8, weight_cached, backward_trigger;
  bool backward_done; /* a backward ran since the last forward */
  /* set by a producer that wrote the next forward's FP8 input itself (LayerNormLinear's norm,
   * through lutra_linear_core_input_quantizer's quantizer): that forward uses it as it is */
  lutra_tensor *given_xq;
  /* the forward GEMM adds no bias (a row-parallel shard off rank 0: the bias goes in once, before
   * the output's reduction); its gradient is computed as always */
  bool skip_forward_bias;
  /* sequence parallelism in FP8 (nn/tp.h): when gather_rows > 1 for an FP8 forward, the input is
   * this rank's rows and gather_fp8 replaces its quantized codes by every rank's, gathered (TE's
   * FP8 all-gather: one byte per element on the wire); the output, and the dgrad before its
   * reduce-scatter, have gather_rows times the input's leading dim. Set per forward by the
   * caller; scale is the input quantizer's (the gathered codes' columnwise copy needs it). */
  int (*gather_fp8)(void *ctx, const lutra_tensor *xq, const float *scale, lutra_tensor **full,
                    const char *fn);
  void *gather_ctx;
  int32_t gather_rows;
  bool forward_gathered;                /* the last forward gathered its input's codes */
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
/* Checkpoints (lutra_checkpoint_ops.quantizers): the core's quantizers appended to out, role i
 * named names[i] (NULL: "input", "weight", "grad_output"), slot = role; a hybrid role's
 * columnwise quantizer follows as "<role>_columnwise", slot LUTRA_NUM_ROLES + role (refused
 * with names). With build_for and none built yet, fresh ones for it (a factory recipe: the
 * module's choice, which its first forward made), not installed (out->fresh) until adopt. */
struct lutra_module_quantizers;
int lutra_linear_core_quantizers(lutra_linear_core *c, const lutra_recipe *build_for,
                                 const char *const *names, struct lutra_module_quantizers *out,
                                 const char *fn);
void lutra_linear_core_adopt_quantizers(lutra_linear_core *c, const lutra_recipe *r,
                                        const struct lutra_module_quantizers *q);

/* The specs a module uses under r: r's, or (a factory recipe, resolved first) its own choice. */
static inline const lutra_quantizer_spec *lutra_linear_core_roles(const lutra_linear_core *c,
                                                                  const lutra_recipe *r) {
  return r->kind == LUTRA_RECIPE_FACTORY ? c->choice.roles : r->roles;
}
/* Quantizers for the specs roles (nn/linear/linear_core_quantizers.c), not installed yet: fresh[]
 * the rowwise (or only) one of each role, fresh_col[] a hybrid role's columnwise one; install
 * replaces the core's (freeing them) and forgets its cached FP8 operands. */
int lutra_linear_core_build_quantizers(const lutra_linear_core *c,
                                       const lutra_quantizer_spec *roles,
                                       lutra_quantizer *fresh[LUTRA_NUM_ROLES],
                                       lutra_quantizer *fresh_col[LUTRA_NUM_ROLES], const char *fn);
void lutra_linear_core_install_quantizers(lutra_linear_core *c, const lutra_recipe *r,
                                          lutra_quantizer *fresh[LUTRA_NUM_ROLES],
                                          lutra_quantizer *fresh_col[LUTRA_NUM_ROLES]);
void lutra_linear_core_free_quantizers(lutra_quantizer *q[LUTRA_NUM_ROLES]);

/* Parameters (nn/linear/linear_core_params.c) */
int lutra_linear_core_num_params(const lutra_linear_core *c);
void lutra_linear_core_param(const lutra_linear_core *c, int i, lutra_param *out);

#endif
