/* DotProductAttention's FP8 path (nn/attention_fp8.h). As TransformerEngine's fp8_dpa with
 * delayed scaling: one meta per tensor role (QKV, S, O forward; dO, dP, dQKV backward), their
 * scales applied by the casts here and by cuDNN inside its kernels (read from device memory, so
 * a replayed CUDA graph picks up each update), their amaxes max-accumulated into history[0]
 * where the scope's one update reads them. The forward's scales are copied aside after it: the
 * scope's exit updates them before the backward runs, and the backward must descale the codes
 * the forward wrote with the scales that wrote them (TE keeps them on its Float8Tensors). */
#include "nn/attention_fp8.h"
#include "core/capture.h"
#include "core/dtype.h"
#include "core/error.h"
#include "fp8/autocast.h"
#include "fp8/quantizer.h"
#include "fp8/recipe.h"
#include "nn/module.h"

#include <stdlib.h>
#include <string.h>

enum { FWD_METAS = 3 }; /* QKV, S, O; dO, dP, dQKV follow */

static int64_t state_floats(int history_len) {
  return LUTRA_ATTN_FP8_HISTORY + (int64_t)LUTRA_ATTENTION_FP8_TENSORS * history_len;
}

static void free_state(attention_fp8 *f) {
  for (int t = 0; t < LUTRA_ATTENTION_FP8_TENSORS; t++)
    lutra_autocast_forget(&f->metas[t]);
  if (f->state) f->be->free(f->state);
  f->state = NULL;
  f->history_len = 0;
  memset(f->metas, 0, sizeof f->metas);
}

/* the state for recipe r: scales 1, histories 0 (a fresh Linear's quantizers start there) */
static int build_state(attention_fp8 *f, const lutra_recipe *r, const char *fn) {
  const lutra_quantizer_spec *in = &r->roles[LUTRA_ROLE_INPUT];
  const lutra_quantizer_spec *grad = &r->roles[LUTRA_ROLE_GRAD_OUTPUT];
  CHECK_ARG(in->amax_history_len == grad->amax_history_len,
            "FP8 attention keeps one amax history length: the recipe's input role has %d, its "
            "grad_output role %d",
            (int)in->amax_history_len, (int)grad->amax_history_len);
  const int len = in->amax_history_len;
  const int64_t n = state_floats(len);
  float *host = calloc((size_t)n, sizeof *host);
  if (!host) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate FP8 attention's state");
  for (int t = 0; t < LUTRA_ATTENTION_FP8_TENSORS; t++)
    for (int saved = 0; saved <= (t < FWD_METAS); saved++)
      *lutra_attention_scale(host, t, saved) = *lutra_attention_scale_inv(host, t, saved) = 1.0f;
  float *state = NULL;
  int st = f->be->alloc((size_t)n * sizeof *host, (void **)&state);
  if (st == LUTRA_OK) st = f->be->from_host(state, host, (size_t)n * sizeof *host);
  free(host);
  if (st != LUTRA_OK) {
    if (state) f->be->free(state);
    return lutra_error_wrap(st, fn);
  }
  free_state(f);
  f->state = state;
  f->history_len = len;
  for (int t = 0; t < LUTRA_ATTENTION_FP8_TENSORS; t++) {
    const lutra_quantizer_spec *s = t < FWD_METAS ? in : grad;
    f->metas[t] = (lutra_scale_meta){.scale = lutra_attention_scale(state, t, 0),
                                     .scale_inv = lutra_attention_scale_inv(state, t, 0),
                                     .amax_history = state + LUTRA_ATTN_FP8_HISTORY + t * len,
                                     .history_len = len,
                                     .amax_compute_algo = s->amax_compute_algo,
                                     .fp8_max = lutra_dtype_max(s->dtype),
                                     .margin = s->margin,
                                     .rule = s->rule};
  }
  f->fwd_dtype = in->dtype;
  f->grad_dtype = grad->dtype;
  f->recipe_key = r->key;
  return LUTRA_OK;
}

int attention_fp8_begin(attention_fp8 *f, const lutra_attention_desc *d, bool *on, const char *fn) {
  const lutra_tls_state *s = lutra_autocast_current();
  const lutra_recipe *r = s->recipe;
  *on = d->fp8 && r && s->enabled;
  if (!*on) return LUTRA_OK;
  const lutra_quantizer_spec *in = &r->roles[LUTRA_ROLE_INPUT];
  const lutra_quantizer_spec *grad = &r->roles[LUTRA_ROLE_GRAD_OUTPUT];
  CHECK_ARG(r->kind != LUTRA_RECIPE_FACTORY && in->kind == LUTRA_QUANT_DELAYED &&
                grad->kind == LUTRA_QUANT_DELAYED,
            "FP8 attention (fp8 = true) runs under delayed scaling: the scope's recipe must scale "
            "its input and grad_output roles per tensor by delayed scaling (a DelayedScaling "
            "recipe), not as this one does");
  CHECK_ARG(in->dtype == LUTRA_E4M3,
            "FP8 attention quantizes q, k, v and the softmax to E4M3 (the recipe's input role "
            "is %s)",
            lutra_dtype_name(in->dtype));
  if (f->history_len && f->recipe_key == r->key) return LUTRA_OK;
  CHECK_STATE(!LUTRA_CAPTURING(),
              "FP8 attention's scaling state would be built while capturing a CUDA graph (a "
              "first FP8 forward or a new recipe): run the step once eagerly first");
  return build_state(f, r, fn);
}

/* where p (inside from's data) lies in to, an FP8 copy of the same shape (1-byte elements) */
static const void *rebase(const void *p, const lutra_tensor *from, const lutra_tensor *to) {
  const size_t offset = (size_t)((const char *)p - (const char *)from->data);
  return (const char *)to->data + offset / lutra_dtype_size(from->dtype);
}

static int copy_of(attention_fp8 *f, lutra_tensor_cache *c, const lutra_tensor *like, int dtype,
                   lutra_tensor **out, const char *fn) {
  return lutra_tensor_cache_get(c, PLAIN_TENSOR(dtype, (int)like->ndim, like->shape, f->device),
                                out, fn);
}

/* x cast into out (its FP8 copy) with meta t's scale, the amax recorded */
static int cast(attention_fp8 *f, const lutra_tensor *x, lutra_tensor *out, int t, const char *fn) {
  const lutra_scale_meta *m = &f->metas[t];
  int st = f->be->cast(&(lutra_quant_args){.x = x->data,
                                           .x_dtype = x->dtype,
                                           .out_dtype = out->dtype,
                                           .rows = lutra_rows(x),
                                           .cols = lutra_cols(x),
                                           .data = out->data,
                                           .scale = m->scale,
                                           .scale_inv = m->scale_inv,
                                           .amax = m->amax_history});
  return st == LUTRA_OK ? LUTRA_OK : lutra_error_wrap(st, fn);
}

/* the FP8 copy q dequantized into out with meta t's scale_inv */
static int dequantize(attention_fp8 *f, const lutra_tensor *q, lutra_tensor *out, int t,
                      const char *fn) {
  int st = f->be->dequantize(&(lutra_dequant_args){.data = q->data,
                                                   .scale_inv = f->metas[t].scale_inv,
                                                   .dtype = q->dtype,
                                                   .scaling = LUTRA_SCALING_TENSOR,
                                                   .rows = lutra_rows(q),
                                                   .cols = lutra_cols(q),
                                                   .out = out->data,
                                                   .out_dtype = out->dtype});
  return st == LUTRA_OK ? LUTRA_OK : lutra_error_wrap(st, fn);
}

/* max(history[0], the n floats at the amax slot) into meta t's history[0] */
static int record(attention_fp8 *f, int slot, int64_t n, int t, const char *fn) {
  int st =
      f->be->amax(lutra_attention_amax(f->state, slot), LUTRA_F32, n, f->metas[t].amax_history);
  return st == LUTRA_OK ? LUTRA_OK : lutra_error_wrap(st, fn);
}

int attention_fp8_forward_in(attention_fp8 *f, const lutra_tensor *const *x, int n,
                             const lutra_tensor *out, lutra_attention_args *a, const char *fn) {
  lutra_tensor *in8[3] = {0}, *out8;
  for (int i = 0; i < n; i++)
    TRY(copy_of(f, &f->in_cache[i], x[i], f->fwd_dtype, &in8[i], fn));
  TRY(copy_of(f, &f->out_cache, out, f->fwd_dtype, &out8, fn));
  for (int i = 0; i < n; i++)
    TRY(cast(f, x[i], in8[i], LUTRA_ATTENTION_FP8_QKV, fn));
  a->q = rebase(a->q, x[0], in8[0]);
  a->k = rebase(a->k, x[n == 3 ? 1 : 0], in8[n == 3 ? 1 : 0]);
  a->v = rebase(a->v, x[n == 3 ? 2 : 0], in8[n == 3 ? 2 : 0]);
  a->out = out8->data;
  a->fp8 = 1;
  a->grad_dtype = f->grad_dtype;
  a->fp8_state = f->state;
  for (int i = 0; i < 3; i++)
    lutra_tensor_hold(&f->in[i], in8[i]);
  lutra_tensor_hold(&f->out, out8);
  f->inputs = n;
  return LUTRA_OK;
}

int attention_fp8_forward_out(attention_fp8 *f, lutra_tensor *out, bool grad, const char *fn) {
  TRY(record(f, LUTRA_ATTN_AMAX_S, 1, LUTRA_ATTENTION_FP8_S, fn));
  TRY(record(f, LUTRA_ATTN_AMAX_O, 1, LUTRA_ATTENTION_FP8_O, fn));
  int st = f->be->copy(f->state + LUTRA_ATTN_FP8_SAVED, f->state,
                       (size_t)(8 * FWD_METAS) * sizeof(float));
  if (st != LUTRA_OK) return lutra_error_wrap(st, fn);
  TRY(dequantize(f, f->out, out, LUTRA_ATTENTION_FP8_O, fn));
  TRY(lutra_autocast_note_forward_n(f->metas, FWD_METAS, f->device, fn));
  f->last = true;
  /* an inference forward is never backpropagated, so it cannot be the scope's backward trigger */
  f->trigger = grad && lutra_autocast_claim_backward_trigger();
  return LUTRA_OK;
}

int attention_fp8_backward_in(attention_fp8 *f, const lutra_tensor *dout, lutra_tensor *const *g,
                              int n, lutra_attention_args *a, const char *fn) {
  lutra_tensor *dout8, *g8[3] = {0};
  TRY(copy_of(f, &f->dout_cache, dout, f->grad_dtype, &dout8, fn));
  for (int i = 0; i < n; i++)
    TRY(copy_of(f, &f->grad_cache[i], g[i], f->grad_dtype, &g8[i], fn));
  TRY(cast(f, dout, dout8, LUTRA_ATTENTION_FP8_DO, fn));
  a->dout = dout8->data;
  a->dq = (void *)rebase(a->dq, g[0], g8[0]);
  a->dk = (void *)rebase(a->dk, g[n == 3 ? 1 : 0], g8[n == 3 ? 1 : 0]);
  a->dv = (void *)rebase(a->dv, g[n == 3 ? 2 : 0], g8[n == 3 ? 2 : 0]);
  return LUTRA_OK;
}

/* the FP8 copy of gradient i (what backward_in pointed a at) */
static lutra_tensor *grad_copy(attention_fp8 *f, int i) {
  return f->grad_cache[i].slot[f->grad_cache[i].recent];
}

int attention_fp8_backward_out(attention_fp8 *f, lutra_tensor *const *g, int n, const char *fn) {
  /* dQ's, dK's and dV's slots are adjacent, the floats between them 0: one max takes all three */
  TRY(record(f, LUTRA_ATTN_AMAX_DQ, 9, LUTRA_ATTENTION_FP8_DQKV, fn));
  TRY(record(f, LUTRA_ATTN_AMAX_DP, 1, LUTRA_ATTENTION_FP8_DP, fn));
  for (int i = 0; i < n; i++)
    TRY(dequantize(f, grad_copy(f, i), g[i], LUTRA_ATTENTION_FP8_DQKV, fn));
  TRY(lutra_autocast_note_backward_n(f->metas + FWD_METAS, LUTRA_ATTENTION_FP8_TENSORS - FWD_METAS,
                                     f->device, fn));
  if (f->trigger) {
    TRY(lutra_autocast_backward_done(fn));
    f->trigger = false;
  }
  return LUTRA_OK;
}

int attention_fp8_capture_hold(const attention_fp8 *f, bool backward, const char *fn) {
  const lutra_tensor *held[] = {f->in[0], f->in[1], f->in[2], f->out, NULL, NULL, NULL, NULL};
  if (backward) {
    held[4] = f->dout_cache.slot[f->dout_cache.recent];
    for (int i = 0; i < f->inputs; i++)
      held[5 + i] = f->grad_cache[i].slot[f->grad_cache[i].recent];
  }
  for (size_t i = 0; i < sizeof held / sizeof *held; i++)
    if (held[i]) TRY(lutra_capture_hold_tensor(held[i], fn));
  return LUTRA_OK;
}

void attention_fp8_release(attention_fp8 *f) {
  for (int i = 0; i < 3; i++)
    lutra_tensor_hold(&f->in[i], NULL);
  lutra_tensor_hold(&f->out, NULL);
  lutra_tensor_cache *caches[] = {&f->in_cache[0],   &f->in_cache[1],  &f->in_cache[2],
                                  &f->out_cache,     &f->dout_cache,   &f->grad_cache[0],
                                  &f->grad_cache[1], &f->grad_cache[2]};
  for (size_t i = 0; i < sizeof caches / sizeof *caches; i++)
    lutra_tensor_cache_release(caches[i]);
  if (f->be) free_state(f);
  f->last = f->trigger = false;
}

/* ---- checkpoints ------------------------------------------------------------------------------
 */
static const char *const state_names[LUTRA_ATTENTION_FP8_TENSORS] = {"qkv", "s",  "o",
                                                                     "do",  "dp", "dqkv"};

static int report_state(const attention_fp8 *f, const lutra_fp8_state_sink *sink, const char *fn) {
  for (int t = 0; t < LUTRA_ATTENTION_FP8_TENSORS; t++) {
    const lutra_scale_meta *m = &f->metas[t];
    lutra_quantizer_state_view v = {.scale = m->scale,
                                    .scale_inv = m->scale_inv,
                                    .amax_history = m->amax_history,
                                    .history_len = m->history_len,
                                    .be = f->be};
    TRY(sink->add(sink->ctx, state_names[t], &v, fn));
  }
  return LUTRA_OK;
}

int attention_fp8_checkpoint(attention_fp8 *f, const lutra_recipe *build_for,
                             const lutra_fp8_state_sink *sink, void **fresh, const char *fn) {
  *fresh = NULL;
  if (f->history_len) {
    CHECK_STATE(!build_for || f->recipe_key == build_for->key,
                "FP8 attention's state was built for another recipe than the one given");
    return report_state(f, sink, fn);
  }
  /* a state for build_for, as the first FP8 forward under it would build it; only a
   * delayed-scaling recipe runs FP8 attention (attention_fp8_begin refuses the others) */
  if (!build_for || build_for->kind == LUTRA_RECIPE_FACTORY ||
      build_for->roles[LUTRA_ROLE_INPUT].kind != LUTRA_QUANT_DELAYED ||
      build_for->roles[LUTRA_ROLE_GRAD_OUTPUT].kind != LUTRA_QUANT_DELAYED)
    return LUTRA_OK;
  attention_fp8 *n = calloc(1, sizeof *n);
  if (!n) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate FP8 attention's state");
  n->be = f->be;
  n->device = f->device;
  int st = build_state(n, build_for, fn);
  if (st == LUTRA_OK) st = report_state(n, sink, fn);
  if (st != LUTRA_OK) {
    attention_fp8_drop(n);
    return st;
  }
  *fresh = n;
  return LUTRA_OK;
}

void attention_fp8_adopt(attention_fp8 *f, void *fresh) {
  attention_fp8 *n = fresh;
  if (!n) return;
  free_state(f);
  f->state = n->state;
  f->history_len = n->history_len;
  memcpy(f->metas, n->metas, sizeof f->metas);
  f->fwd_dtype = n->fwd_dtype;
  f->grad_dtype = n->grad_dtype;
  f->recipe_key = n->recipe_key;
  free(n); /* its state now f's */
}

void attention_fp8_drop(void *fresh) {
  attention_fp8 *n = fresh;
  if (!n) return;
  free_state(n);
  free(n);
}
