/* The Linear core's state (see nn/linear/linear_core.h for what it does): the struct that the
 * core's files share, below all of them, so that the GEMM sequence (linear_core.c) calls down
 * into its quantizers (linear_core_quantizers.c) and nothing calls back up. */
#ifndef LUTRA_NN_LINEAR_CORE_STATE_H
#define LUTRA_NN_LINEAR_CORE_STATE_H

#include "backend/backend.h"
#include "fp8/factory.h"
#include "fp8/recipe.h"
#include "lutra.h"
#include "nn/tie.h"
#include "runtime/tensor_cache.h"

#include <stdbool.h>

typedef struct lutra_linear_core {
  int64_t in, out;
  int32_t dtype, device;
  bool has_bias, accumulate_main_grad;
  const lutra_backend *be;
  lutra_tensor *weight, *bias, *wgrad, *bgrad, *weight_main_grad, *bias_main_grad;
  /* weight tying (nn/tie.h): the module whose weight, wgrad and weight_main_grad these are
   * (held; NULL: they are this core's own), the weight's tie state (tie_owner's, else own_tie)
   * and the stamp of the last forward that a backward follows */
  lutra_module *tie_owner;
  lutra_tie *tie;
  lutra_tie own_tie;
  uint64_t forward_at;
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
  /* the weight was last quantized by a forward with is_first_microbatch true: the cache opens a
   * gradient-accumulation window (lutra_linear_core_in_accumulation_window) */
  bool cache_opens_window;
  /* set by a producer that wrote the next forward's FP8 input itself (LayerNormLinear's norm,
   * through lutra_linear_core_input_quantizer's quantizer): that forward uses it as it is */
  lutra_tensor *given_xq;
  /* armed by a Residual around the module for its next forward (lutra_fusion_ops.arm_residual):
   * the forward GEMM adds residual (its epilogue's C) and writes residual_out; taken (cleared)
   * by that forward */
  const lutra_tensor *residual;
  lutra_tensor *residual_out;
  /* and for its next backward: the dgrad GEMM adds grad_residual into grad_residual_out */
  const lutra_tensor *grad_residual;
  lutra_tensor *grad_residual_out;
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
  /* the CPU inference forward's weight, transposed (nn/linear/linear_pack.h), and the weight it
   * was made from; NULL until the switch is on and such a forward ran */
  lutra_tensor *packed;
  const lutra_tensor *packed_from;
} lutra_linear_core;

/* The specs a module uses under r: r's, or (a factory recipe, resolved first) its own choice. */
static inline const lutra_quantizer_spec *lutra_linear_core_roles(const lutra_linear_core *c,
                                                                  const lutra_recipe *r) {
  return r->kind == LUTRA_RECIPE_FACTORY ? c->choice.roles : r->roles;
}

#endif
