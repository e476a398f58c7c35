/* The Linear core's parameters and buffers (see nn/linear/linear_core.h): made and initialised as
 * torch does, shown to optimizers, and released. */
#include "core/error.h"
#include "fp8/quantizer.h"
#include "nn/linear/linear_core.h"
#include "nn/linear/linear_shared.h"
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
  lutra_tensor *owned[] = {c->weight,           c->bias,           c->wgrad, c->bgrad,
                           c->weight_main_grad, c->bias_main_grad, c->xdq,   c->wdq};
  for (size_t i = 0; i < sizeof owned / sizeof *owned; i++)
    lutra_tensor_owner_drop(owned[i]);
  lutra_tensor_cache *caches[] = {&c->y_cache, &c->dx_cache, &c->pre_cache, &c->act_y_cache};
  for (size_t i = 0; i < sizeof caches / sizeof *caches; i++)
    lutra_tensor_cache_release(caches[i]);
  c->weight = c->bias = c->wgrad = c->bgrad = NULL;
  c->weight_main_grad = c->bias_main_grad = c->y = c->dx = c->pre = c->act_y = NULL;
  c->xdq = c->wdq = NULL;
  c->xq = c->wq = NULL;
  c->forward_done = false;
}

static int make_param(const lutra_linear_core *c, int64_t n0, int64_t n1, int dtype,
                      lutra_tensor **t, const char *fn) {
  return lutra_linear_make_param(c->device, n0, n1, dtype, t, fn);
}

static int zero_grads(lutra_linear_core *c) {
  lutra_tensor *grads[] = {c->wgrad, c->bgrad, c->weight_main_grad, c->bias_main_grad};
  for (size_t i = 0; i < sizeof grads / sizeof *grads; i++)
    if (grads[i]) TRY(lutra_tensor_fill(grads[i], 0.0f));
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
  int st = make_param(c, c->out, c->in, c->dtype, &c->weight, fn);
  if (st == LUTRA_OK) st = make_param(c, c->out, c->in, c->dtype, &c->wgrad, fn);
  if (st == LUTRA_OK && c->has_bias) st = make_param(c, c->out, 0, c->dtype, &c->bias, fn);
  if (st == LUTRA_OK && c->has_bias) st = make_param(c, c->out, 0, c->dtype, &c->bgrad, fn);
  if (st == LUTRA_OK && c->accumulate_main_grad) {
    st = make_param(c, c->out, c->in, LUTRA_F32, &c->weight_main_grad, fn);
    if (st == LUTRA_OK && c->has_bias)
      st = make_param(c, c->out, 0, LUTRA_F32, &c->bias_main_grad, fn);
  }
  if (st == LUTRA_OK) st = lutra_linear_init_params(c->weight, c->bias, d->seed, c->in);
  if (st == LUTRA_OK) st = zero_grads(c);
  if (st != LUTRA_OK) lutra_linear_core_release(c);
  return st;
}
