/* The fused softmax + top-k router (lutra/moe.h): one backend call per forward and per
 * backward. It owns probs, indices and dlogits (reused while the token count stays) and holds
 * the logits of the last forward for the backward, as a module holds its input. */
#include "backend/backend.h"
#include "backend/device.h"
#include "core/capture.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/object.h"
#include "runtime/tensor.h"

#include <math.h>
#include <stdlib.h>

struct lutra_moe_router {
  lutra_object obj;
  lutra_moe_router_desc d;
  const lutra_backend *be;
  lutra_tensor *probs, *indices, *dlogits;
  const lutra_tensor *logits; /* held until the next forward */
};

void lutra_moe_router_defaults(lutra_moe_router_desc *d) {
  if (!d) return;
  *d = (lutra_moe_router_desc){
      .experts = 0, .k = 1, .renormalize = 1, .scaling_factor = 1.0f, .device = LUTRA_CPU};
}

int lutra_moe_router_new(const lutra_moe_router_desc *d, lutra_moe_router **out) {
  static const char fn[] = "lutra_moe_router_new";
  CHECK_ARG(d, "desc is NULL");
  CHECK_ARG(out, "out is NULL");
  CHECK_ARG(d->experts >= 1 && d->experts <= LUTRA_MOE_MAX_EXPERTS, "experts = %d is outside 1..%d",
            (int)d->experts, LUTRA_MOE_MAX_EXPERTS);
  CHECK_ARG(d->k >= 1 && d->k <= LUTRA_MOE_MAX_K, "k = %d is outside 1..%d", (int)d->k,
            LUTRA_MOE_MAX_K);
  CHECK_ARG(d->k <= d->experts, "k = %d is larger than the number of experts (%d)", (int)d->k,
            (int)d->experts);
  CHECK_ARG(isfinite(d->scaling_factor) && d->scaling_factor > 0.0f,
            "scaling_factor must be finite and > 0 (got %g)", (double)d->scaling_factor);
  const lutra_backend *be;
  TRY(lutra_backend_get(d->device, &be, fn));
  CHECK_ARG(be->moe_topk_forward && be->moe_topk_backward, "the %s backend has no router kernels",
            be->name);
  lutra_moe_router *r = calloc(1, sizeof *r);
  if (!r) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a router");
  r->obj.magic = LUTRA_MAGIC_MOE_ROUTER;
  r->obj.refs = 1;
  r->d = *d;
  r->d.renormalize = d->renormalize != 0;
  r->be = be;
  *out = r;
  return LUTRA_OK;
}

static void router_buffers_free(lutra_moe_router *r) {
  lutra_tensor_owner_drop(r->probs);
  lutra_tensor_owner_drop(r->indices);
  lutra_tensor_owner_drop(r->dlogits);
  r->probs = r->indices = r->dlogits = NULL;
  lutra_tensor_hold(&r->logits, NULL);
}

int lutra_moe_router_unref(lutra_moe_router *r) {
  if (!r || --r->obj.refs > 0) return LUTRA_OK; /* a captured graph still holds it */
  router_buffers_free(r);
  free(r);
  return LUTRA_OK;
}

int lutra_moe_router_destroy(lutra_moe_router *r) {
  static const char fn[] = "lutra_moe_router_destroy";
  TRY(lutra_check_object(r, LUTRA_MAGIC_MOE_ROUTER, fn, "router"));
  router_buffers_free(r);
  r->obj.flags |= LUTRA_OBJ_FREED;
  return LUTRA_OK;
}

static lutra_topk_args router_args(const lutra_moe_router *r, const lutra_tensor *logits) {
  return (lutra_topk_args){.logits = logits->data,
                           .dtype = logits->dtype,
                           .k = r->d.k,
                           .tokens = lutra_rows(logits),
                           .experts = r->d.experts,
                           .renormalize = r->d.renormalize,
                           .scaling_factor = r->d.scaling_factor};
}

/* a captured graph drops its reference to the router through this */
static int release_router(void *p) {
  return lutra_moe_router_unref(p);
}

int lutra_moe_router_forward(lutra_moe_router *r, const lutra_tensor *logits, lutra_tensor **probs,
                             lutra_tensor **indices) {
  static const char fn[] = "lutra_moe_router_forward";
  TRY(lutra_check_object(r, LUTRA_MAGIC_MOE_ROUTER, fn, "router"));
  TRY(lutra_check_tensor(logits, fn, "logits"));
  CHECK_ARG(probs && indices, "probs and indices must not be NULL");
  CHECK_ARG(logits->scaling == LUTRA_SCALING_NONE && lutra_dtype_is_float(logits->dtype),
            "logits dtype %s is not f32, bf16 or f16", lutra_dtype_name(logits->dtype));
  CHECK_ARG(logits->ndim >= 2 && lutra_cols(logits) == r->d.experts,
            "logits must be [tokens, %d] (one column per expert; more dims: tokens are the "
            "leading ones), got %d dims with %lld columns",
            (int)r->d.experts, (int)logits->ndim, (long long)lutra_cols(logits));
  CHECK_ARG(logits->device == r->d.device, "logits are on another device than the router");
  const int64_t shape[2] = {lutra_rows(logits), r->d.k};
  lutra_tensor *p, *idx;
  TRY(lutra_tensor_prepare(r->probs, PLAIN_TENSOR(LUTRA_F32, 2, shape, r->d.device), &p, fn));
  int st =
      lutra_tensor_prepare(r->indices, PLAIN_TENSOR(LUTRA_I32, 2, shape, r->d.device), &idx, fn);
  if (st == LUTRA_OK) {
    lutra_topk_args a = router_args(r, logits);
    a.probs = p->data;
    a.indices = idx->data;
    st = r->be->moe_topk_forward(&a);
    if (st != LUTRA_OK) {
      lutra_error_wrap(st, fn);
      lutra_tensor_discard(r->indices, idx);
    }
  }
  if (st != LUTRA_OK) {
    lutra_tensor_discard(r->probs, p);
    return st;
  }
  lutra_tensor_commit(&r->probs, p);
  lutra_tensor_commit(&r->indices, idx);
  lutra_tensor_hold(&r->logits, logits);
  if (LUTRA_CAPTURING()) {
    TRY(lutra_capture_hold_object(r, release_router, fn));
    TRY(lutra_capture_hold_tensor(logits, fn));
  }
  *probs = r->probs;
  *indices = r->indices;
  return LUTRA_OK;
}

int lutra_moe_router_backward(lutra_moe_router *r, const lutra_tensor *dprobs,
                              lutra_tensor **dlogits) {
  static const char fn[] = "lutra_moe_router_backward";
  TRY(lutra_check_object(r, LUTRA_MAGIC_MOE_ROUTER, fn, "router"));
  TRY(lutra_check_tensor(dprobs, fn, "dprobs"));
  CHECK_ARG(dlogits, "dlogits is NULL");
  CHECK_STATE(r->logits, "backward called before forward");
  CHECK_STATE(!(r->logits->flags & LUTRA_TENSOR_FREED), "the logits saved by forward were freed");
  CHECK_ARG(dprobs->dtype == LUTRA_F32 && dprobs->scaling == LUTRA_SCALING_NONE,
            "dprobs must be f32 (the probabilities' dtype), got %s",
            lutra_dtype_name(dprobs->dtype));
  CHECK_ARG(lutra_same_shape(dprobs, r->probs), "dprobs must be [%lld, %d] like the probabilities",
            (long long)r->probs->shape[0], (int)r->d.k);
  CHECK_ARG(dprobs->device == r->d.device, "dprobs are on another device than the router");
  const lutra_tensor *logits = r->logits;
  TRY(lutra_tensor_ensure(
      &r->dlogits, PLAIN_TENSOR(logits->dtype, logits->ndim, logits->shape, r->d.device), fn));
  lutra_topk_args a = router_args(r, logits);
  a.indices = r->indices->data;
  a.dprobs = dprobs->data;
  a.dlogits = r->dlogits->data;
  int st = r->be->moe_topk_backward(&a);
  if (st != LUTRA_OK) return lutra_error_wrap(st, fn);
  if (LUTRA_CAPTURING()) TRY(lutra_capture_hold_tensor(dprobs, fn));
  *dlogits = r->dlogits;
  return LUTRA_OK;
}
