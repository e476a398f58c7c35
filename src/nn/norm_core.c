/* The norm core (nn/norm_core.h). */
#include "nn/norm_core.h"
#include "backend/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "runtime/tensor.h"

#include <math.h>
#include <string.h>

static int make_param(lutra_norm_core *c, float value, lutra_tensor **t, const char *fn) {
  lutra_tensor_spec spec = *PLAIN_TENSOR(c->d.dtype, 1, &c->d.hidden, c->d.device);
  spec.flags = LUTRA_TENSOR_BORROWED;
  TRY(lutra_tensor_make(&spec, t, fn));
  return lutra_tensor_fill(*t, value);
}

int lutra_norm_core_init(lutra_norm_core *c, const lutra_norm_desc *d, const char *fn) {
  CHECK_ARG(d->hidden > 0, "hidden must be positive (got %lld)", (long long)d->hidden);
  CHECK_ARG(isfinite(d->eps) && d->eps >= 0.0f, "eps must be finite and >= 0 (got %g)",
            (double)d->eps);
  CHECK_ARG(d->dtype == LUTRA_F32 || d->dtype == LUTRA_BF16, "dtype must be f32 or bf16, got %s",
            lutra_dtype_name(d->dtype));
  const lutra_backend *be;
  TRY(lutra_backend_get(d->device, &be, fn));
  CHECK_ARG(be->layernorm_forward && be->layernorm_backward, "the %s backend has no norm kernels",
            be->name);
  memset(c, 0, sizeof *c);
  c->d = *d;
  c->d.rms = d->rms != 0;
  c->d.zero_centered_gamma = d->zero_centered_gamma != 0;
  c->be = be;
  /* gamma = 1 (stored as 0 when zero-centered), beta = 0, as torch and TE initialise them */
  int st = make_param(c, c->d.zero_centered_gamma ? 0.0f : 1.0f, &c->weight, fn);
  if (st == LUTRA_OK) st = make_param(c, 0.0f, &c->wgrad, fn);
  if (st == LUTRA_OK && !c->d.rms) st = make_param(c, 0.0f, &c->bias, fn);
  if (st == LUTRA_OK && !c->d.rms) st = make_param(c, 0.0f, &c->bgrad, fn);
  if (st != LUTRA_OK) lutra_norm_core_release(c);
  return st;
}

void lutra_norm_core_release(lutra_norm_core *c) {
  lutra_tensor *owned[] = {c->weight, c->bias, c->wgrad, c->bgrad};
  for (size_t i = 0; i < sizeof owned / sizeof *owned; i++)
    lutra_tensor_owner_drop(owned[i]);
  lutra_tensor_cache *caches[] = {&c->y_cache, &c->dx_cache, &c->mean_cache, &c->rstd_cache};
  for (size_t i = 0; i < sizeof caches / sizeof *caches; i++)
    lutra_tensor_cache_release(caches[i]);
  c->weight = c->bias = c->wgrad = c->bgrad = c->y = c->dx = c->mean = c->rstd = NULL;
  lutra_tensor_hold(&c->x, NULL);
  c->forward_done = false;
}

/* stats: size the row statistics too (a forward that keeps nothing for a backward needs none) */
static int prepare(lutra_norm_core *c, const lutra_tensor *x, bool stats, const char *fn) {
  CHECK_ARG(x->scaling == LUTRA_SCALING_NONE, "input is quantized (FP8); a norm takes f32/bf16");
  CHECK_ARG(x->dtype == c->d.dtype, "input dtype %s does not match the module's %s",
            lutra_dtype_name(x->dtype), lutra_dtype_name(c->d.dtype));
  CHECK_ARG(x->ndim >= 1 && lutra_cols(x) == c->d.hidden,
            "input has %lld features in its last dim, the module expects %lld",
            (long long)lutra_cols(x), (long long)c->d.hidden);
  CHECK_ARG(x->device == c->d.device, "input is on another device than the module");
  int64_t rows = lutra_rows(x);
  TRY(lutra_tensor_cache_get(&c->y_cache, PLAIN_TENSOR(x->dtype, x->ndim, x->shape, x->device),
                             &c->y, fn));
  if (stats)
    TRY(lutra_tensor_cache_get(&c->rstd_cache, PLAIN_TENSOR(LUTRA_F32, 1, &rows, x->device),
                               &c->rstd, fn));
  if (stats && !c->d.rms)
    TRY(lutra_tensor_cache_get(&c->mean_cache, PLAIN_TENSOR(LUTRA_F32, 1, &rows, x->device),
                               &c->mean, fn));
  return LUTRA_OK;
}

int lutra_norm_core_prepare(lutra_norm_core *c, const lutra_tensor *x, const char *fn) {
  return prepare(c, x, true, fn);
}

lutra_norm_args lutra_norm_core_args(const lutra_norm_core *c, const lutra_tensor *x) {
  return (lutra_norm_args){.x = x->data,
                           .gamma = c->weight->data,
                           .beta = c->bias ? c->bias->data : NULL,
                           .dtype = x->dtype,
                           .param_dtype = c->d.dtype,
                           .rows = lutra_rows(x),
                           .hidden = c->d.hidden,
                           .eps = c->d.eps,
                           .rms = c->d.rms,
                           .zero_centered_gamma = c->d.zero_centered_gamma,
                           .mean = c->mean ? c->mean->data : NULL,
                           .rstd = c->rstd ? c->rstd->data : NULL};
}

int lutra_norm_core_forward(lutra_norm_core *c, const lutra_tensor *x, const char *fn) {
  (void)fn;
  lutra_norm_args na = lutra_norm_core_args(c, x);
  na.y = c->y->data;
  return c->be->layernorm_forward(&na);
}

void lutra_norm_core_done(lutra_norm_core *c, const lutra_tensor *x, bool grad) {
  /* an inference forward is never backpropagated: it lets go of the last input too */
  lutra_tensor_hold(&c->x, grad ? x : NULL);
  c->forward_done = true;
}

int lutra_norm_core_run(lutra_norm_core *c, const lutra_tensor *x, bool grad, const char *fn) {
  TRY(prepare(c, x, grad, fn));
  lutra_norm_args na = lutra_norm_core_args(c, x);
  na.y = c->y->data;
  if (!grad) na.mean = na.rstd = NULL;
  TRY(c->be->layernorm_forward(&na));
  lutra_norm_core_done(c, x, grad);
  return LUTRA_OK;
}

int lutra_norm_core_check_saved(const lutra_norm_core *c, const char *fn) {
  CHECK_STATE(c->x, c->forward_done ? "the last forward ran with grad = false (inference): it "
                                      "kept nothing for a backward"
                                    : "backward called before forward");
  CHECK_STATE(!(c->x->flags & LUTRA_TENSOR_FREED), "the input saved by forward was freed");
  return LUTRA_OK;
}

/* whether the backward can write dx + r into out: both of the input's shape and dtype, apart */
static bool takes_residual(const lutra_norm_core *c, const lutra_tensor *r,
                           const lutra_tensor *out) {
  const lutra_tensor *t[2] = {r, out};
  for (int i = 0; i < 2; i++)
    if (t[i]->dtype != c->x->dtype || t[i]->device != c->d.device ||
        t[i]->scaling != LUTRA_SCALING_NONE || !lutra_same_shape(t[i], c->x))
      return false;
  return r->data != out->data || r->numel == 0;
}

int lutra_norm_core_backward(lutra_norm_core *c, const lutra_tensor *dy, lutra_tensor **dx,
                             const char *fn) {
  const lutra_tensor *r = c->residual;
  lutra_tensor *out = c->residual_out;
  c->residual = NULL;
  c->residual_out = NULL;
  TRY(lutra_norm_core_check_saved(c, fn));
  CHECK_ARG(dy->dtype == c->d.dtype && dy->numel == c->x->numel && dy->device == c->d.device,
            "the norm's output gradient does not match its input");
  const bool adds = r && dx && takes_residual(c, r, out);
  if (dx && !adds)
    TRY(lutra_tensor_cache_get(
        &c->dx_cache, PLAIN_TENSOR(c->x->dtype, c->x->ndim, c->x->shape, c->d.device), &c->dx, fn));
  lutra_tensor *target = adds ? out : c->dx;
  lutra_norm_args na = lutra_norm_core_args(c, c->x);
  na.dy = dy->data;
  na.dx = dx ? target->data : NULL;
  na.dx_add = adds ? r->data : NULL;
  na.dgamma = c->wgrad->data;
  na.dbeta = c->bgrad ? c->bgrad->data : NULL;
  TRY(c->be->layernorm_backward(&na));
  if (dx) *dx = target;
  return LUTRA_OK;
}

int lutra_norm_core_num_params(const lutra_norm_core *c) {
  return c->d.rms ? 1 : 2;
}

void lutra_norm_core_param(const lutra_norm_core *c, int i, lutra_param *out) {
  *out = i == 0 ? (lutra_param){c->weight, c->wgrad, NULL} : (lutra_param){c->bias, c->bgrad, NULL};
}
