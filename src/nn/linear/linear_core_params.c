/* The Linear core's parameters and buffers (see nn/linear/linear_core.h): made and initialised as
 * torch does, shown to optimizers, and released. */
#include "core/error.h"
#include "core/object.h"
#include "fp8/quantizer.h"
#include "nn/linear/linear_core.h"
#include "nn/linear/linear_shared.h"
#include "nn/module.h"
#include "runtime/tensor.h"

#include <string.h>

int lutra_linear_core_num_params(const lutra_linear_core *c) {
  return c->has_bias ? 2 : 1;
}

void lutra_linear_core_param(const lutra_linear_core *c, int i, lutra_param *out) {
  if (i == 0)
    *out = (lutra_param){c->weight, c->wgrad, c->weight_main_grad};
  else
    *out = (lutra_param){c->bias, c->bgrad, c->bias_main_grad};
}

void lutra_linear_core_release(lutra_linear_core *c) {
  lutra_factory_forget(&c->choice);
  lutra_linear_core_free_quantizers(c->q);
  lutra_linear_core_free_quantizers(c->qc);
  c->xqc = c->wqc = NULL;
  lutra_tensor_hold(&c->x, NULL); /* before the tensors: it may be act_y */
  if (c->tie_owner) {             /* a tied weight's tensors are its owner's */
    c->weight = c->wgrad = c->weight_main_grad = NULL;
    c->tie->tied--;
    lutra_module_unref(c->tie_owner);
    c->tie_owner = NULL;
  }
  c->tie = &c->own_tie;
  lutra_tensor *owned[] = {c->weight,         c->bias, c->wgrad, c->bgrad, c->weight_main_grad,
                           c->bias_main_grad, c->xdq,  c->wdq,   c->packed};
  for (size_t i = 0; i < sizeof owned / sizeof *owned; i++)
    lutra_tensor_owner_drop(owned[i]);
  lutra_tensor_cache *caches[] = {&c->y_cache, &c->dx_cache, &c->pre_cache, &c->act_y_cache};
  for (size_t i = 0; i < sizeof caches / sizeof *caches; i++)
    lutra_tensor_cache_release(caches[i]);
  c->weight = c->bias = c->wgrad = c->bgrad = NULL;
  c->weight_main_grad = c->bias_main_grad = c->y = c->dx = c->pre = c->act_y = NULL;
  c->xdq = c->wdq = c->packed = NULL;
  c->packed_from = NULL;
  c->xq = c->wq = NULL;
  c->forward_done = false;
}

static int make_param(const lutra_linear_core *c, int64_t n0, int64_t n1, int dtype,
                      lutra_tensor **t, const char *fn) {
  return lutra_linear_make_param(c->device, n0, n1, dtype, t, fn);
}

static int zero_grads(lutra_linear_core *c, bool weight_too) {
  lutra_tensor *grads[] = {weight_too ? c->wgrad : NULL, c->bgrad,
                           weight_too ? c->weight_main_grad : NULL, c->bias_main_grad};
  for (size_t i = 0; i < sizeof grads / sizeof *grads; i++)
    if (grads[i]) TRY(lutra_tensor_fill(grads[i], 0.0f));
  return LUTRA_OK;
}

/* The weight of d->tie as this core's (lutra_linear_desc.tie), checked; nothing kept on refusal. */
static int tie_weight(lutra_linear_core *c, const lutra_linear_desc *d, const char *fn) {
  lutra_module *o = d->tie;
  TRY(lutra_check_object(o, LUTRA_MAGIC_MODULE, fn, "tie"));
  const char *kind = o->ops->kind;
  const int n = o->ops->num_params(o);
  CHECK_ARG(d->tie_param >= 0 && d->tie_param < n,
            "tie_param %d is out of range: the %s tied to has %d parameters", (int)d->tie_param,
            kind, n);
  lutra_tie *t = o->ops->tie ? o->ops->tie(o, d->tie_param) : NULL;
  CHECK_ARG(t, "a %s's parameter %d cannot be tied to (an embedding's or a linear's weight can)",
            kind, (int)d->tie_param);
  lutra_param p;
  TRY(o->ops->param(o, d->tie_param, &p));
  const lutra_tensor *w = p.value;
  CHECK_STATE(!(w->flags & LUTRA_TENSOR_FREED), "the %s's weight was freed", kind);
  CHECK_ARG(w->ndim == 2 && w->shape[0] == c->out && w->shape[1] == c->in,
            "the %s's weight is [%lld, %lld]; this Linear's is [out_features, in_features] = "
            "[%lld, %lld]",
            kind, (long long)w->shape[0], (long long)(w->ndim == 2 ? w->shape[1] : 0),
            (long long)c->out, (long long)c->in);
  CHECK_ARG(w->dtype == c->dtype, "the %s's weight is %s; this Linear's dtype is %s", kind,
            lutra_dtype_name(w->dtype), lutra_dtype_name(c->dtype));
  CHECK_ARG(w->device == c->device, "the %s's weight is on another device than this Linear", kind);
  CHECK_ARG((p.main_grad != NULL) == c->accumulate_main_grad,
            "the %s's gradient %s into an f32 main_grad: set accumulate_main_grad = %d to match",
            kind, p.main_grad ? "accumulates" : "does not accumulate", p.main_grad != NULL);
  c->weight = p.value;
  c->wgrad = p.grad;
  c->weight_main_grad = p.main_grad;
  c->tie = t;
  c->tie_owner = o;
  t->tied++;
  lutra_module_retain(o);
  return LUTRA_OK;
}

int lutra_linear_core_init(lutra_linear_core *c, const lutra_linear_desc *d, const char *fn) {
  const lutra_backend *be;
  TRY(lutra_linear_check_desc(d->in_features, d->out_features, d->dtype, d->device, &be, fn));
  memset(c, 0, sizeof *c);
  c->in = d->in_features;
  c->out = d->out_features;
  c->dtype = d->dtype;
  c->device = d->device;
  c->has_bias = d->bias != 0;
  c->accumulate_main_grad = d->accumulate_main_grad != 0;
  c->be = be;
  c->tie = &c->own_tie;
  const bool tied = d->tie != NULL;
  int st = tied ? tie_weight(c, d, fn) : make_param(c, c->out, c->in, c->dtype, &c->weight, fn);
  if (st == LUTRA_OK && !tied) st = make_param(c, c->out, c->in, c->dtype, &c->wgrad, fn);
  if (st == LUTRA_OK && c->has_bias) st = make_param(c, c->out, 0, c->dtype, &c->bias, fn);
  if (st == LUTRA_OK && c->has_bias) st = make_param(c, c->out, 0, c->dtype, &c->bgrad, fn);
  if (st == LUTRA_OK && c->accumulate_main_grad) {
    if (!tied) st = make_param(c, c->out, c->in, LUTRA_F32, &c->weight_main_grad, fn);
    if (st == LUTRA_OK && c->has_bias)
      st = make_param(c, c->out, 0, LUTRA_F32, &c->bias_main_grad, fn);
  }
  /* a tied weight keeps its owner's values and gradients */
  if (st == LUTRA_OK)
    st = lutra_linear_init_params(tied ? NULL : c->weight, c->bias, d->seed, c->in);
  if (st == LUTRA_OK) st = zero_grads(c, !tied);
  if (st != LUTRA_OK) lutra_linear_core_release(c);
  return st;
}
