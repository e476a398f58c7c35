/* LayerNorm and RMSNorm over the last dim (TransformerEngine's LayerNorm / RMSNorm), one module
 * for both kinds: weight (and, for LayerNorm, bias) [hidden] in the module's dtype, the input of
 * that dtype. The forward keeps the row statistics (mean, rstd; f32 [rows]) and holds its input
 * until the next forward for the backward; a grad = false forward keeps nothing. Owned output,
 * statistics and gradient buffers are reused while the input shape stays. */
#include "backend/backend.h"
#include "backend/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/object.h"
#include "nn/module.h"
#include "runtime/tensor.h"
#include "runtime/tensor_cache.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

typedef struct norm {
  lutra_module base;
  lutra_norm_desc d;
  const lutra_backend *be;
  lutra_tensor *weight, *bias, *wgrad, *bgrad; /* bias, bgrad NULL for RMSNorm */
  lutra_tensor *y, *dx, *mean, *rstd;
  const lutra_tensor *x; /* held (lutra_tensor_hold) until the next forward */
  bool forward_grad;     /* the last forward kept its input and statistics */
  /* behind y, dx, mean and rstd: one per shape seen (a training and an evaluation batch size
   * alternate without reallocating) */
  lutra_tensor_cache y_cache, dx_cache, mean_cache, rstd_cache;
} norm;

static const char *fwd_name(const norm *n) {
  return n->d.rms ? "lutra_rmsnorm_forward" : "lutra_layernorm_forward";
}
static const char *bwd_name(const norm *n) {
  return n->d.rms ? "lutra_rmsnorm_backward" : "lutra_layernorm_backward";
}

static lutra_norm_args base_args(const norm *n, const lutra_tensor *x) {
  return (lutra_norm_args){.x = x->data,
                           .gamma = n->weight->data,
                           .beta = n->bias ? n->bias->data : NULL,
                           .dtype = x->dtype,
                           .param_dtype = n->d.dtype,
                           .rows = lutra_rows(x),
                           .hidden = n->d.hidden,
                           .eps = n->d.eps,
                           .rms = n->d.rms,
                           .zero_centered_gamma = n->d.zero_centered_gamma,
                           .mean = n->mean ? n->mean->data : NULL,
                           .rstd = n->rstd ? n->rstd->data : NULL};
}

static int norm_forward(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *a,
                        lutra_tensor **y) {
  norm *n = (norm *)m;
  const char *fn = fwd_name(n);
  CHECK_ARG(x->dtype == n->d.dtype, "input dtype %s does not match the module's %s",
            lutra_dtype_name(x->dtype), lutra_dtype_name(n->d.dtype));
  CHECK_ARG(x->ndim >= 1 && lutra_cols(x) == n->d.hidden,
            "input has %lld features in its last dim, the module expects %lld",
            (long long)lutra_cols(x), (long long)n->d.hidden);
  CHECK_ARG(x->device == n->d.device, "input is on another device than the module");
  CHECK_ARG(x->scaling == LUTRA_SCALING_NONE, "input is quantized (FP8); a norm takes f32/bf16");
  int64_t rows = lutra_rows(x);
  const bool grad = a->grad != 0;
  TRY(lutra_tensor_cache_get(&n->y_cache, PLAIN_TENSOR(x->dtype, x->ndim, x->shape, x->device),
                             &n->y, fn));
  /* the row statistics are for the backward only: an inference forward writes none */
  if (grad)
    TRY(lutra_tensor_cache_get(&n->rstd_cache, PLAIN_TENSOR(LUTRA_F32, 1, &rows, x->device),
                               &n->rstd, fn));
  if (grad && !n->d.rms)
    TRY(lutra_tensor_cache_get(&n->mean_cache, PLAIN_TENSOR(LUTRA_F32, 1, &rows, x->device),
                               &n->mean, fn));
  lutra_norm_args na = base_args(n, x);
  na.y = n->y->data;
  if (!grad) na.mean = na.rstd = NULL;
  TRY(n->be->layernorm_forward(&na));
  n->forward_grad = grad;
  /* an inference forward is never backpropagated: it lets go of the last input too */
  lutra_tensor_hold(&n->x, n->forward_grad ? x : NULL);
  *y = n->y;
  return LUTRA_OK;
}

static int norm_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  norm *n = (norm *)m;
  const char *fn = bwd_name(n);
  CHECK_STATE(n->x, n->y ? "the last forward ran with grad = false (inference): it kept nothing "
                           "for a backward"
                         : "backward called before forward");
  CHECK_STATE(!(n->x->flags & LUTRA_TENSOR_FREED), "the input saved by forward was freed");
  CHECK_ARG(dy->dtype == n->d.dtype, "grad_output dtype %s does not match the module's %s",
            lutra_dtype_name(dy->dtype), lutra_dtype_name(n->d.dtype));
  CHECK_ARG(lutra_same_shape(dy, n->y), "grad_output shape does not match the forward output");
  CHECK_ARG(dy->device == n->d.device, "grad_output is on another device than the module");
  if (dx)
    TRY(lutra_tensor_cache_get(
        &n->dx_cache, PLAIN_TENSOR(dy->dtype, dy->ndim, dy->shape, dy->device), &n->dx, fn));
  lutra_norm_args na = base_args(n, n->x);
  na.dy = dy->data;
  na.dx = dx ? n->dx->data : NULL;
  na.dgamma = n->wgrad->data;
  na.dbeta = n->bgrad ? n->bgrad->data : NULL;
  TRY(n->be->layernorm_backward(&na));
  if (dx) *dx = n->dx;
  return LUTRA_OK;
}

static int norm_num_params(const lutra_module *m) {
  return ((const norm *)m)->d.rms ? 1 : 2;
}

static int norm_param(const lutra_module *m, int i, lutra_param *out) {
  const norm *n = (const norm *)m;
  *out = i == 0 ? (lutra_param){n->weight, n->wgrad, NULL} : (lutra_param){n->bias, n->bgrad, NULL};
  return LUTRA_OK;
}

static void norm_release(lutra_module *m) {
  norm *n = (norm *)m;
  lutra_tensor_hold(&n->x, NULL);
  lutra_tensor *owned[] = {n->weight, n->bias, n->wgrad, n->bgrad};
  for (size_t i = 0; i < sizeof owned / sizeof *owned; i++)
    lutra_tensor_destroy(owned[i]);
  lutra_tensor_cache *caches[] = {&n->y_cache, &n->dx_cache, &n->mean_cache, &n->rstd_cache};
  for (size_t i = 0; i < sizeof caches / sizeof *caches; i++)
    lutra_tensor_cache_release(caches[i]);
  n->weight = n->bias = n->wgrad = n->bgrad = n->y = n->dx = n->mean = n->rstd = NULL;
}

static const lutra_module_ops layernorm_ops = {
    .kind = "layernorm",
    .forward = norm_forward,
    .backward = norm_backward,
    .num_params = norm_num_params,
    .param = norm_param,
    .release = norm_release,
};

static const lutra_module_ops rmsnorm_ops = {
    .kind = "rmsnorm",
    .forward = norm_forward,
    .backward = norm_backward,
    .num_params = norm_num_params,
    .param = norm_param,
    .release = norm_release,
};

void lutra_norm_defaults(lutra_norm_desc *d) {
  if (!d) return;
  *d = (lutra_norm_desc){.eps = 1e-5f, .dtype = LUTRA_F32, .device = LUTRA_CPU};
}

static int make_param(norm *n, float value, lutra_tensor **t, const char *fn) {
  lutra_tensor_spec spec = *PLAIN_TENSOR(n->d.dtype, 1, &n->d.hidden, n->d.device);
  spec.flags = LUTRA_TENSOR_BORROWED;
  TRY(lutra_tensor_make(&spec, t, fn));
  return lutra_tensor_fill(*t, value);
}

int lutra_layernorm_new(const lutra_norm_desc *d, lutra_module **out) {
  static const char fn[] = "lutra_layernorm_new";
  CHECK_ARG(d, "desc is NULL");
  CHECK_ARG(out, "out is NULL");
  CHECK_ARG(d->hidden > 0, "hidden must be positive (got %lld)", (long long)d->hidden);
  CHECK_ARG(isfinite(d->eps) && d->eps >= 0.0f, "eps must be finite and >= 0 (got %g)",
            (double)d->eps);
  CHECK_ARG(d->dtype == LUTRA_F32 || d->dtype == LUTRA_BF16, "dtype must be f32 or bf16, got %s",
            lutra_dtype_name(d->dtype));
  const lutra_backend *be;
  TRY(lutra_backend_get(d->device, &be, fn));
  CHECK_ARG(be->layernorm_forward && be->layernorm_backward, "the %s backend has no norm kernels",
            be->name);
  norm *n = calloc(1, sizeof *n);
  if (!n) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  n->d = *d;
  n->d.rms = d->rms != 0;
  n->d.zero_centered_gamma = d->zero_centered_gamma != 0;
  n->be = be;
  /* gamma = 1 (stored as 0 when zero-centered), beta = 0, as torch and TE initialise them */
  int st = make_param(n, n->d.zero_centered_gamma ? 0.0f : 1.0f, &n->weight, fn);
  if (st == LUTRA_OK) st = make_param(n, 0.0f, &n->wgrad, fn);
  if (st == LUTRA_OK && !n->d.rms) st = make_param(n, 0.0f, &n->bias, fn);
  if (st == LUTRA_OK && !n->d.rms) st = make_param(n, 0.0f, &n->bgrad, fn);
  if (st != LUTRA_OK) {
    norm_release(&n->base);
    free(n);
    return st;
  }
  lutra_module_init(&n->base, n->d.rms ? &rmsnorm_ops : &layernorm_ops);
  *out = &n->base;
  return LUTRA_OK;
}
