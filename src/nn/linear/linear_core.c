/* The Linear core's GEMM sequence (see nn/linear/linear_core.h). The forward holds a reference to
 * its input until the next forward or the module's release, so that the garbage collector cannot
 * free it before the backward reads it; a tensor freed explicitly, or replaced by its owner,
 * is then refused by the backward with an error. */
#include "nn/linear/linear_core.h"
#include "backend/device.h"
#include "core/error.h"
#include "fp8/autocast.h"
#include "fp8/quantizer.h"
#include "fp8/recipe.h"
#include "gemm/gemm.h"
#include "nn/linear/linear_pack.h"
#include "nn/linear/linear_shared.h"
#include "nn/module.h"
#include "parallel/group.h"
#include "runtime/skip_flag.h"
#include "runtime/tensor.h"

#include <math.h>
#include <string.h>

/* Builds the quantizers for a recipe; the old ones are replaced only once all new ones exist. */
static int ensure_quantizers(lutra_linear_core *c, const lutra_recipe *r,
                             const lutra_quantizer_spec *roles, const char *fn) {
  if (c->quantized_for_recipe && c->qkey == r->key) return LUTRA_OK;
  lutra_quantizer *fresh[LUTRA_NUM_ROLES], *fresh_col[LUTRA_NUM_ROLES];
  TRY(lutra_linear_core_build_quantizers(c, roles, fresh, fresh_col, fn));
  lutra_linear_core_install_quantizers(c, r, fresh, fresh_col);
  return LUTRA_OK;
}

static inline int check_input(const lutra_linear_core *c, const lutra_tensor *x, const char *fn) {
  return lutra_linear_check_input(x, c->dtype, c->in, c->device, fn);
}

static int check_fp8_dims(const lutra_quantizer_spec *roles, const lutra_tensor *x,
                          const lutra_linear_core *c, const char *fn) {
  TRY(lutra_quantizer_check_input(&roles[LUTRA_ROLE_INPUT], x, fn));
  TRY(lutra_quantizer_check_input(&roles[LUTRA_ROLE_WEIGHT], c->weight, fn));
  return LUTRA_OK;
}

static int note_forward(lutra_quantizer *q, const lutra_linear_core *c, const char *fn) {
  lutra_scale_meta *meta = q ? lutra_quantizer_meta(q) : NULL;
  return meta ? lutra_autocast_note_forward(meta, c->device, fn) : LUTRA_OK;
}

/* The GEMM's epilogue for a forward ending in act (NULL: none). */
static const lutra_gemm_epilogue *forward_epilogue(lutra_linear_core *c, int act, bool grad,
                                                   lutra_gemm_epilogue *epi) {
  if (act == LUTRA_ACT_NONE) return NULL;
  /* an inference forward keeps no pre-activation: the plain GELU epilogue */
  *epi = grad ? (lutra_gemm_epilogue){.kind = LUTRA_EPILOGUE_GELU_AUX, .aux = c->pre}
              : (lutra_gemm_epilogue){.kind = LUTRA_EPILOGUE_GELU};
  return epi;
}

/* xop: the input's quantization (x itself, or an activation's output formed inside the cast).
 * Out of line: inlined, its FP8 work (hybrid copies included) cost the high-precision forward
 * instructions. */
static __attribute__((noinline)) int forward_fp8(lutra_linear_core *c, const lutra_quantize_op *xop,
                                                 int first_microbatch,
                                                 const lutra_gemm_epilogue *epi, lutra_tensor *d,
                                                 const lutra_tensor *add, const char *fn) {
  /* an inference forward (xop->rowwise_only) quantizes no columnwise copies: only the dgrad and
   * wgrad GEMMs read them. Not under the device flag, whose skipped casts keep the codes of the
   * tensor quantized last, which must then be the full one. */
  const bool w_rowwise_only =
      xop->rowwise_only && first_microbatch != LUTRA_FIRST_MICROBATCH_DEVICE;
  lutra_quantizer *qi = c->q[LUTRA_ROLE_INPUT], *qw = c->q[LUTRA_ROLE_WEIGHT];
  /* DEVICE: the weight is quantized on every call, skipped on the device while the
   * skip-weight-update flag is set: the weight quantizer's output then keeps the codes of its
   * last quantization. Delayed scaling notes the meta either way (a skipped cast records no
   * amax: the update rolls a zero into the history, as for a step without this weight). */
  const int32_t *skip = NULL;
  /* a weight loaded since its cast: the cache holds another run's weight, never reused */
  const bool loaded = (c->weight->flags & LUTRA_TENSOR_LOADED) != 0;
  if (first_microbatch == LUTRA_FIRST_MICROBATCH_DEVICE) {
    bool host_skip;
    TRY(lutra_skip_weight_flag(c->device, &skip, &host_skip, fn));
    CHECK_STATE(c->weight_cached || !host_skip,
                "the skip-weight-update flag is set but this Linear has no quantized weight yet "
                "(first FP8 forward, or the recipe changed): run it with the flag 0 first");
    CHECK_STATE(!loaded || !host_skip,
                "the skip-weight-update flag is set but this Linear's weight was loaded from a "
                "checkpoint since it was quantized: run it with the flag 0 first");
  }
  if (c->given_xq)
    c->xq = c->given_xq;
  else
    TRY(lutra_quantize_run(qi, xop, &c->xq, fn));
  TRY(note_forward(qi, c, fn));
  /* a hybrid input: its columnwise copy (the wgrad's) from a second cast, for a training
   * forward only */
  lutra_quantizer *qic = c->qc[LUTRA_ROLE_INPUT], *qwc = c->qc[LUTRA_ROLE_WEIGHT];
  if (qic && !xop->rowwise_only) {
    CHECK_STATE(!c->given_xq, "a hybrid input quantizer cannot take an FP8 input written for it");
    lutra_quantize_op cop = *xop;
    cop.act_out = NULL; /* the rowwise cast wrote it */
    TRY(lutra_quantize_run(qic, &cop, &c->xqc, fn));
    TRY(note_forward(qic, c, fn));
  }
  if (c->gather_rows > 1) {
    CHECK_STATE(!qic, "sequence-parallel FP8 gathers one copy of the input: a hybrid input "
                      "quantizer (columnwise_format) is not supported there");
    TRY(c->gather_fp8(c->gather_ctx, c->xq, lutra_quantizer_meta(qi)->scale, &c->xq, fn));
  }
  const bool has_columnwise = qwc ? c->wqc != NULL : c->wq && c->wq->col_data;
  bool reuse =
      first_microbatch == 0 && c->weight_cached && !loaded && (w_rowwise_only || has_columnwise);
  if (!reuse) {
    TRY(lutra_quantize_run(
        qw,
        &(lutra_quantize_op){
            .x = c->weight, .record_amax = true, .skip = skip, .rowwise_only = w_rowwise_only},
        &c->wq, fn));
    TRY(note_forward(qw, c, fn));
    if (qwc && !w_rowwise_only) {
      TRY(lutra_quantize_run(
          qwc, &(lutra_quantize_op){.x = c->weight, .record_amax = true, .skip = skip}, &c->wqc,
          fn));
      TRY(note_forward(qwc, c, fn));
    } else if (qwc) {
      c->wqc = NULL; /* not of this weight: a later training forward quantizes it */
    }
    c->weight_cached = true;
    c->cache_opens_window = first_microbatch == 1;
    c->weight->flags &= ~(uint32_t)(LUTRA_TENSOR_UPDATED | LUTRA_TENSOR_LOADED);
  }
  return lutra_gemm_run(
      &(lutra_gemm_op){.a = c->wq,
                       .b = c->xq,
                       .d = d,
                       .bias = c->skip_forward_bias ? NULL : c->bias,
                       .c = add,
                       .epilogue = epi,
                       .transa = true,
                       .fast_accum = !c->forward_options.use_split_accumulator[LUTRA_GEMM_FPROP]},
      fn);
}

/* Calibration: record amaxes for delayed scaling, compute in high precision. */
static int observe(lutra_linear_core *c, const lutra_tensor *x, const char *fn) {
  lutra_quantizer *qi = c->q[LUTRA_ROLE_INPUT], *qw = c->q[LUTRA_ROLE_WEIGHT];
  if (qi) {
    TRY(lutra_quantize_run(qi, &(lutra_quantize_op){.x = x, .observe = true}, NULL, fn));
    TRY(note_forward(qi, c, fn));
  }
  if (qw) {
    TRY(lutra_quantize_run(qw, &(lutra_quantize_op){.x = c->weight, .observe = true}, NULL, fn));
    TRY(note_forward(qw, c, fn));
  }
  /* hybrid roles: their columnwise quantizers observe too */
  for (int i = LUTRA_ROLE_INPUT; i <= LUTRA_ROLE_WEIGHT; i++) {
    lutra_quantizer *q = c->qc[i];
    if (!q) continue;
    const lutra_tensor *t = i == LUTRA_ROLE_INPUT ? x : c->weight;
    TRY(lutra_quantize_run(q, &(lutra_quantize_op){.x = t, .observe = true}, NULL, fn));
    TRY(note_forward(q, c, fn));
  }
  return LUTRA_OK;
}

/* A factory recipe's module without its choice yet: LUTRA_FACTORY_PENDING, nothing done. Out of
 * line (the callers test r->kind first): the forward without a factory recipe costs what it did. */
static __attribute__((noinline)) int resolve_roles(lutra_linear_core *c, const lutra_tls_state *s,
                                                   const char *fn) {
  if (!(s->enabled || s->calibrating)) return LUTRA_OK;
  const lutra_quantizer_spec *chosen;
  return lutra_factory_roles(s->recipe, &c->choice, &chosen, fn);
}

static bool uses_delayed(const lutra_quantizer_spec *roles) {
  for (int i = 0; i < LUTRA_NUM_ROLES; i++)
    if (roles[i].kind == LUTRA_QUANT_DELAYED) return true;
  return false;
}

bool lutra_linear_core_ends_in(int act) {
  return act == LUTRA_ACT_GELU_TANH; /* cuBLASLt's GELU epilogues are the tanh form */
}

/* whether a GEMM can add the residual r into out: r and out of x's shape with its last dim
 * width (the forward's output: out; the dgrad's: in) and the module's dtype, apart, and no
 * gathered rows */
static bool takes_residual(const lutra_linear_core *c, const lutra_tensor *x, const lutra_tensor *r,
                           const lutra_tensor *out, int64_t width) {
  if (!r || c->gather_rows > 1 || r->device != c->device || r->data == out->data) return false;
  const lutra_tensor *t[2] = {r, out};
  for (int i = 0; i < 2; i++) {
    if (t[i]->dtype != c->dtype || t[i]->ndim != x->ndim || t[i]->scaling != LUTRA_SCALING_NONE)
      return false;
    for (int d = 0; d < x->ndim; d++)
      if (t[i]->shape[d] != (d == x->ndim - 1 ? width : x->shape[d])) return false;
  }
  return true;
}

/* The forward of x (the module's input), or, when pre is not NULL, of act_in(pre): x is then
 * c->act_y, the activation's output, written here unless the FP8 input cast forms it (*fused).
 * An armed residual (c->residual) is taken: the GEMM writes x W^T + b + residual into
 * c->residual_out where takes_residual says it can, else the output goes to c->y as always.
 * Inlined into its two callers: every forward runs it. */
static inline __attribute__((always_inline)) int
forward_impl(lutra_linear_core *c, const lutra_tensor *x, const lutra_tensor *pre, int act_in,
             const lutra_forward_args *a, int act, lutra_tensor **y, bool *fused, const char *fn) {
  const lutra_tensor *add = c->residual;
  lutra_tensor *into = c->residual_out;
  c->residual = NULL;
  c->residual_out = NULL;
  TRY(check_input(c, x, fn));
  CHECK_ARG(act == LUTRA_ACT_NONE || lutra_linear_core_ends_in(act),
            "the forward cannot end in activation %d", act);
  const lutra_tls_state *s = lutra_autocast_current();
  const lutra_recipe *r = s->recipe;
  if (r && r->kind == LUTRA_RECIPE_FACTORY) TRY(resolve_roles(c, s, fn));
  bool fp8 =
      r && s->enabled && lutra_linear_core_roles(c, r)[LUTRA_ROLE_INPUT].kind != LUTRA_QUANT_NONE;
  bool calibrate = r && !s->enabled && s->calibrating;
  if (fp8) TRY(check_fp8_dims(lutra_linear_core_roles(c, r), x, c, fn));
  if (fp8 || calibrate) TRY(ensure_quantizers(c, r, lutra_linear_core_roles(c, r), fn));
  /* act inside the input cast where the input quantizer takes it (the per-tensor scalings) */
  const bool fuse_in = pre && fp8 && lutra_quantizer_takes_act(c->q[LUTRA_ROLE_INPUT]);
  const bool grad = a->grad != 0;

  int64_t shape[LUTRA_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  shape[x->ndim - 1] = c->out;
  bool gathered = fp8 && c->gather_rows > 1;
  if (gathered) shape[0] *= c->gather_rows;
  TRY(lutra_tensor_cache_get(&c->y_cache, PLAIN_TENSOR(c->dtype, x->ndim, shape, c->device), &c->y,
                             fn));
  /* the pre-activation is kept for the backward only */
  if (act != LUTRA_ACT_NONE && grad)
    TRY(lutra_tensor_cache_get(&c->pre_cache, PLAIN_TENSOR(c->dtype, x->ndim, shape, c->device),
                               &c->pre, fn));
  if (pre && !fuse_in) TRY(lutra_linear_run_act(c->be, pre, act_in, c->act_y, fn));
  const bool adds = act == LUTRA_ACT_NONE && takes_residual(c, x, add, into, c->out);
  lutra_tensor *d = adds ? into : c->y;
  if (!adds) add = NULL;
  lutra_gemm_epilogue epi_store;
  const lutra_gemm_epilogue *epi = forward_epilogue(c, act, grad, &epi_store);
  if (fp8) {
    c->forward_options = r->options;
    lutra_quantize_op xop = {.x = x, .record_amax = true, .rowwise_only = !grad};
    if (fuse_in) {
      /* the activation's output in high precision only where a backward reads it: the plain
       * backward (no grad_output quantizer, or backward_override "high_precision") uses the
       * saved input */
      bool hp = grad && (!c->q[LUTRA_ROLE_GRAD_OUTPUT] ||
                         r->options.backward_override == LUTRA_BACKWARD_HIGH_PRECISION);
      xop = (lutra_quantize_op){.x = pre,
                                .record_amax = true,
                                .act_forward = true,
                                .act_kind = act_in,
                                .act_out = hp ? c->act_y : NULL,
                                .rowwise_only = !grad};
    }
    TRY(forward_fp8(c, &xop, a->is_first_microbatch, epi, d, add, fn));
  } else {
    if (calibrate) TRY(observe(c, x, fn));
    /* the CPU inference forward's packed weight, [in, out], multiplied untransposed */
    const bool packed = !grad && !calibrate && lutra_linear_pack_applies(c, x);
    if (packed) TRY(lutra_linear_pack(c, fn));
    TRY(lutra_gemm_run(&(lutra_gemm_op){.a = packed ? c->packed : c->weight,
                                        .b = x,
                                        .d = d,
                                        .bias = c->skip_forward_bias ? NULL : c->bias,
                                        .c = add,
                                        .epilogue = epi,
                                        .transa = !packed,
                                        .bias_first = packed},
                       fn));
  }
  /* an inference forward is never backpropagated: it lets go of the last input too */
  lutra_tensor_hold(&c->x, grad ? x : NULL);
  c->forward_act = act;
  c->forward_fp8 = fp8;
  c->forward_gathered = gathered;
  c->forward_grad = grad;
  c->forward_done = true;
  c->backward_done = false;
  if (grad) c->forward_at = lutra_tie_forward(c->tie);
  /* an inference forward is never backpropagated, so it cannot be the scope's backward trigger */
  c->backward_trigger = c->forward_grad && (fp8 || calibrate) &&
                        uses_delayed(lutra_linear_core_roles(c, r)) &&
                        lutra_autocast_claim_backward_trigger();
  if (fused) *fused = fuse_in;
  *y = d;
  return LUTRA_OK;
}

int lutra_linear_core_forward(lutra_linear_core *c, const lutra_tensor *x,
                              const lutra_forward_args *a, int act, lutra_tensor **y,
                              const char *fn) {
  return forward_impl(c, x, NULL, LUTRA_ACT_NONE, a, act, y, NULL, fn);
}

bool lutra_linear_core_starts_with_act(int act) {
  return lutra_linear_takes_act(act);
}

int lutra_linear_core_forward_from_act(lutra_linear_core *c, const lutra_tensor *pre,
                                       const lutra_forward_args *a, int act, lutra_tensor **y,
                                       const lutra_tensor **act_y, bool *fused, const char *fn) {
  int64_t shape[LUTRA_MAX_DIMS];
  TRY(lutra_linear_check_act_input(pre, act, c->dtype, c->device, shape, fn));
  TRY(lutra_tensor_cache_get(&c->act_y_cache, PLAIN_TENSOR(c->dtype, pre->ndim, shape, c->device),
                             &c->act_y, fn));
  TRY(forward_impl(c, c->act_y, pre, act, a, LUTRA_ACT_NONE, y, fused, fn));
  *act_y = c->act_y;
  return LUTRA_OK;
}

/* the input of activation act after this core: its pre-activation when the forward ended in
 * act, else its output */
static const lutra_tensor *act_input(const lutra_linear_core *c, int act) {
  return c->forward_act == act && c->pre ? c->pre : c->y;
}

static int backward_fp8(lutra_linear_core *c, const lutra_linear_backward_op *op, lutra_tensor *bg,
                        lutra_tensor *wgrad_out, bool wgrad_adds, lutra_tensor *dx_out,
                        const lutra_tensor *dx_add, bool *dact_fused, const char *fn) {
  lutra_quantizer *qg = c->q[LUTRA_ROLE_GRAD_OUTPUT];
  lutra_tensor *dyq;
  /* the bias gradient comes out of the grad_output cast, which reads dy anyway */
  const int act = op->act_grad_act ? op->act_grad_act : c->forward_act;
  TRY(lutra_quantize_run(qg,
                         &(lutra_quantize_op){.x = op->dy,
                                              .record_amax = true,
                                              .act = op->from_act_grad ? act_input(c, act) : NULL,
                                              .act_kind = act,
                                              .dbias = bg,
                                              .dbias_accumulate = c->accumulate_main_grad},
                         &dyq, fn));
  lutra_scale_meta *meta = lutra_quantizer_meta(qg);
  if (meta) TRY(lutra_autocast_note_backward(meta, c->device, fn));
  /* a hybrid gradient: its columnwise copy (wgrad's) from a second cast, the activation's
   * gradient in front of it too (the bias gradient came out of the first) */
  lutra_quantizer *qgc = c->qc[LUTRA_ROLE_GRAD_OUTPUT];
  lutra_tensor *dyqc = dyq;
  if (qgc) {
    TRY(lutra_quantize_run(qgc,
                           &(lutra_quantize_op){.x = op->dy,
                                                .record_amax = true,
                                                .act = op->from_act_grad ? act_input(c, act) : NULL,
                                                .act_kind = act},
                           &dyqc, fn));
    lutra_scale_meta *mc = lutra_quantizer_meta(qgc);
    if (mc) TRY(lutra_autocast_note_backward(mc, c->device, fn));
  }
  const int32_t *split = c->forward_options.use_split_accumulator;
  /* per-tensor scaling: the activation's derivative in the dgrad GEMM's epilogue where the GEMM
   * itself runs it (cuBLASLt's DGELU on FP8 operands); else the plain GEMM, and the producer
   * applies it in its grad_output cast (lutra_linear_core_starts_from_act_grad). Block-scaled
   * recipes keep the activation's own backward (their casts take no derivative). */
  const lutra_tensor *pre = op->dact_pre, *wq = c->wqc ? c->wqc : c->wq;
  bool fuse_dact = dx_out && pre && op->dact_act == LUTRA_ACT_GELU_TANH && pre->dtype == c->dtype &&
                   lutra_same_shape(pre, dx_out) && wq->scaling == LUTRA_SCALING_TENSOR &&
                   dyq->scaling == LUTRA_SCALING_TENSOR;
  lutra_gemm_epilogue dgelu = {.kind = LUTRA_EPILOGUE_DGELU, .aux = (lutra_tensor *)pre};
  lutra_gemm_op dgrad = {
      .a = wq, .b = dyq, .d = dx_out, .c = dx_add, .fast_accum = !split[LUTRA_GEMM_DGRAD]};
  if (fuse_dact) {
    bool declined;
    dgrad.epilogue = &dgelu;
    dgrad.epilogue_declined = &declined;
    TRY(lutra_gemm_run(&dgrad, fn));
    fuse_dact = !declined;
    dgrad.epilogue = NULL;
    dgrad.epilogue_declined = NULL;
  }
  if (dx_out && !fuse_dact) TRY(lutra_gemm_run(&dgrad, fn));
  if (dact_fused) *dact_fused = fuse_dact;
  return lutra_gemm_run(&(lutra_gemm_op){.a = c->xqc ? c->xqc : c->xq,
                                         .b = dyqc,
                                         .d = wgrad_out,
                                         .transb = true,
                                         .accumulate = wgrad_adds,
                                         .fast_accum = !split[LUTRA_GEMM_WGRAD]},
                        fn);
}

/* backward_override "dequantized": the backward's high-precision GEMMs read the forward's FP8 x
 * and W dequantized (rowwise copies) into buffers of the module's dtype. */
static int dequantized_operands(lutra_linear_core *c, const lutra_tensor **w,
                                const lutra_tensor **x, const char *fn) {
  CHECK_STATE(c->xq && c->wq, "the FP8 forward kept no quantized input and weight");
  CHECK_STATE(!c->forward_gathered, "backward_override \"dequantized\" does not take a "
                                    "sequence-parallel input gathered in FP8");
  TRY(lutra_tensor_ensure(&c->xdq, PLAIN_TENSOR(c->dtype, c->x->ndim, c->x->shape, c->device), fn));
  TRY(lutra_tensor_ensure(
      &c->wdq, PLAIN_TENSOR(c->dtype, c->weight->ndim, c->weight->shape, c->device), fn));
  TRY(lutra_dequantize(c->xq, 0, c->xdq));
  TRY(lutra_dequantize(c->wq, 0, c->wdq));
  *x = c->xdq;
  *w = c->wdq;
  return LUTRA_OK;
}

int lutra_linear_core_backward(lutra_linear_core *c, const lutra_linear_backward_op *op,
                               lutra_tensor **dx, bool *dact_fused, const char *fn) {
  const lutra_tensor *dy = op->dy;
  if (dact_fused) *dact_fused = false;
  const lutra_linear_step step = {c->forward_done, c->forward_grad, c->backward_done,
                                  c->accumulate_main_grad};
  TRY(lutra_linear_check_backward(c->x, dy, c->dtype, c->device, step, fn));
  if (op->from_act_grad) {
    const int act = op->act_grad_act ? op->act_grad_act : c->forward_act;
    CHECK_ARG(lutra_linear_core_starts_from_act_grad(c, act),
              "this backward cannot apply the activation's gradient in its grad_output cast");
    TRY(lutra_linear_check_act_grad(dy, act_input(c, act), act, fn));
  } else {
    CHECK_ARG(lutra_same_shape(dy, c->y), "grad_output shape does not match the forward output");
  }
  /* dx NULL: the input's gradient is not wanted (its dgrad GEMM is skipped) */
  if (dx) {
    int64_t xshape[LUTRA_MAX_DIMS];
    memcpy(xshape, c->x->shape, sizeof xshape);
    if (c->forward_gathered) xshape[0] *= c->gather_rows;
    TRY(lutra_tensor_cache_get(&c->dx_cache, PLAIN_TENSOR(c->dtype, c->x->ndim, xshape, c->device),
                               &c->dx, fn));
  }
  /* an armed residual's gradient: the dgrad GEMM adds it (its C) where it matches dx and no
   * activation's derivative is applied in that GEMM's epilogue */
  const lutra_tensor *dx_add =
      dx && !op->dact_pre && !c->forward_gathered &&
              takes_residual(c, c->x, c->grad_residual, c->grad_residual_out, c->in)
          ? c->grad_residual
          : NULL;
  lutra_tensor *dx_out = !dx ? NULL : dx_add ? c->grad_residual_out : c->dx;
  c->grad_residual = NULL;
  c->grad_residual_out = NULL;
  lutra_tensor *wgrad_out = c->accumulate_main_grad ? c->weight_main_grad : c->wgrad;
  const bool accumulate = c->accumulate_main_grad;
  lutra_tensor *bg = !c->has_bias ? NULL : accumulate ? c->bias_main_grad : c->bgrad;
  /* the weight gradient adds where it accumulates into main_grad, or where the module sharing
   * the weight wrote its part since this forward (nn/tie.h); the bias is this module's own */
  const bool tie_adds = lutra_tie_adds(c->tie, &c->forward_at);
  const bool wgrad_adds = accumulate || tie_adds;
  const int over = c->forward_fp8 ? c->forward_options.backward_override : LUTRA_BACKWARD_FP8;
  const lutra_tensor *w_src = c->weight, *x_src = c->x;
  if (over == LUTRA_BACKWARD_DEQUANTIZED) TRY(dequantized_operands(c, &w_src, &x_src, fn));
  if (c->forward_fp8 && c->q[LUTRA_ROLE_GRAD_OUTPUT] && over == LUTRA_BACKWARD_FP8) {
    TRY(backward_fp8(c, op, bg, wgrad_out, wgrad_adds, dx_out, dx_add, dact_fused, fn));
    bg = NULL;
  } else {
    const lutra_tensor *pre = op->dact_pre;
    bool fuse_dact = dx && pre && op->dact_act == LUTRA_ACT_GELU_TANH && pre->dtype == c->dtype &&
                     lutra_same_shape(pre, c->dx);
    lutra_gemm_epilogue dgelu = {.kind = LUTRA_EPILOGUE_DGELU, .aux = (lutra_tensor *)pre};
    if (dx)
      TRY(lutra_gemm_run(
          &(lutra_gemm_op){
              .a = w_src, .b = dy, .d = dx_out, .c = dx_add, .epilogue = fuse_dact ? &dgelu : NULL},
          fn));
    if (dact_fused) *dact_fused = fuse_dact;
    /* the wgrad GEMM reads dy already: its BGRADB epilogue sums it into the bias gradient
     * (it overwrites dbias, so not when gradients accumulate into main_grad) */
    lutra_gemm_epilogue bgradb = {.kind = LUTRA_EPILOGUE_BGRADB, .dbias = bg};
    bool fuse_bias = bg && !wgrad_adds;
    TRY(lutra_gemm_run(&(lutra_gemm_op){.a = x_src,
                                        .b = dy,
                                        .d = wgrad_out,
                                        .epilogue = fuse_bias ? &bgradb : NULL,
                                        .transb = true,
                                        .accumulate = wgrad_adds},
                       fn));
    if (fuse_bias) bg = NULL;
  }
  if (bg) {
    TRY(c->be->bias_grad(&(lutra_bias_grad_args){.dy = dy->data,
                                                 .dtype = dy->dtype,
                                                 .rows = lutra_rows(dy),
                                                 .cols = c->out,
                                                 .db = bg->data,
                                                 .db_dtype = bg->dtype,
                                                 .accumulate = accumulate}));
  }
  if (c->backward_trigger) {
    TRY(lutra_autocast_backward_done(fn));
    c->backward_trigger = false;
  }
  /* final for this backward: an armed data-parallel sync can start their bucket now (a tied
   * weight's once every module using it wrote its part) */
  if (lutra_tie_wrote(c->tie, &c->forward_at, tie_adds)) lutra_dist_grad_ready(wgrad_out);
  if (c->has_bias) lutra_dist_grad_ready(accumulate ? c->bias_main_grad : c->bgrad);
  c->backward_done = true;
  if (dx) *dx = dx_out;
  return LUTRA_OK;
}

bool lutra_linear_core_starts_from_act_grad(const lutra_linear_core *c, int act) {
  const lutra_quantizer *qg = c->q[LUTRA_ROLE_GRAD_OUTPUT];
  const bool input_known = (c->forward_act == act && c->pre) || c->forward_act == LUTRA_ACT_NONE;
  return lutra_linear_takes_act_grad(
      act, c->out, c->forward_done && c->forward_grad && c->forward_fp8,
      input_known && qg && lutra_quantizer_takes_act(qg) &&
          c->forward_options.backward_override == LUTRA_BACKWARD_FP8 &&
          /* a hybrid grad_output casts its columnwise copy with a quantizer of its own: the
           * rowwise cast has no columnwise output to fuse the bias gradient into (CUDA) */
          !c->qc[LUTRA_ROLE_GRAD_OUTPUT]);
}

int lutra_linear_core_input_quantizer(lutra_linear_core *c, const lutra_tensor *x,
                                      lutra_quantizer **q, const char *fn) {
  *q = NULL;
  TRY(check_input(c, x, fn));
  const lutra_tls_state *s = lutra_autocast_current();
  const lutra_recipe *r = s->recipe;
  if (r && r->kind == LUTRA_RECIPE_FACTORY) TRY(resolve_roles(c, s, fn));
  if (!(r && s->enabled &&
        lutra_linear_core_roles(c, r)[LUTRA_ROLE_INPUT].kind != LUTRA_QUANT_NONE))
    return LUTRA_OK;
  TRY(check_fp8_dims(lutra_linear_core_roles(c, r), x, c, fn));
  TRY(ensure_quantizers(c, r, lutra_linear_core_roles(c, r), fn));
  /* a producer writes one FP8 copy: a hybrid input (two casts in two formats) and a backward in
   * high precision (which reads the input in high precision) take the producer's plain output */
  if (c->qc[LUTRA_ROLE_INPUT] || r->options.backward_override == LUTRA_BACKWARD_HIGH_PRECISION)
    return LUTRA_OK;
  *q = c->q[LUTRA_ROLE_INPUT];
  return LUTRA_OK;
}
