/* The MoE dispatcher (lutra/moe.h): permute tokens into expert-contiguous rows, give the
 * device m_splits, and combine the experts' rows back with the router's probabilities; the
 * backward of both. The row map of the last permute is what every other call reads. Owned
 * buffers keep their size while tokens, k and the widths stay (so their addresses do, for
 * CUDA graphs); none of these calls reads device memory on the host. */
#include "backend/backend.h"
#include "backend/device.h"
#include "core/capture.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/object.h"
#include "runtime/tensor.h"

#include <stdbool.h>
#include <stdlib.h>

enum { PERMUTED, ROW_MAP, M_SPLITS, SCRATCH, DX, Y, DEXPERT, DPROBS, NUM_BUFFERS };

struct lutra_moe_dispatch {
  lutra_object obj;
  int32_t experts, device;
  const lutra_backend *be;
  lutra_tensor *buf[NUM_BUFFERS];
  lutra_tensor *bad_index; /* device flag (lutra_permute_args.bad_index); NULL on the CPU */
  /* the last permute: tokens, k, x's shape (y and dx take its leading dims) and whether one
   * ran; the last unpermute's inputs, held */
  int64_t tokens;
  int32_t k;
  int32_t x_ndim;
  int64_t x_shape[4];
  bool permuted;
  const lutra_tensor *expert_out, *probs;
};

static void dispatch_buffers_free(lutra_moe_dispatch *d) {
  for (int i = 0; i < NUM_BUFFERS; i++) {
    lutra_tensor_owner_drop(d->buf[i]);
    d->buf[i] = NULL;
  }
  lutra_tensor_owner_drop(d->bad_index);
  d->bad_index = NULL;
  lutra_tensor_hold(&d->expert_out, NULL);
  lutra_tensor_hold(&d->probs, NULL);
  d->permuted = false;
}

int lutra_moe_dispatch_new(int experts, int device, lutra_moe_dispatch **out) {
  static const char fn[] = "lutra_moe_dispatch_new";
  CHECK_ARG(out, "out is NULL");
  CHECK_ARG(experts >= 1 && experts <= LUTRA_MOE_MAX_EXPERTS, "experts = %d is outside 1..%d",
            experts, LUTRA_MOE_MAX_EXPERTS);
  const lutra_backend *be;
  TRY(lutra_backend_get(device, &be, fn));
  CHECK_ARG(be->moe_permute && be->moe_permute_backward && be->moe_unpermute &&
                be->moe_unpermute_backward,
            "the %s backend has no permutation kernels", be->name);
  lutra_moe_dispatch *d = calloc(1, sizeof *d);
  if (!d) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a dispatcher");
  d->obj.magic = LUTRA_MAGIC_MOE_DISPATCH;
  d->obj.refs = 1;
  d->experts = experts;
  d->device = device;
  d->be = be;
  if (device != LUTRA_CPU) {
    int64_t one = 1;
    lutra_tensor_spec spec = *PLAIN_TENSOR(LUTRA_I32, 1, &one, device);
    spec.flags = LUTRA_TENSOR_BORROWED;
    int st = lutra_tensor_make(&spec, &d->bad_index, fn);
    if (st == LUTRA_OK) st = be->memset(d->bad_index->data, 0, sizeof(int32_t));
    if (st != LUTRA_OK) {
      lutra_tensor_owner_drop(d->bad_index);
      free(d);
      return lutra_error_wrap(st, fn);
    }
  }
  *out = d;
  return LUTRA_OK;
}

int lutra_moe_dispatch_unref(lutra_moe_dispatch *d) {
  if (!d || --d->obj.refs > 0) return LUTRA_OK; /* a captured graph still holds it */
  dispatch_buffers_free(d);
  free(d);
  return LUTRA_OK;
}

int lutra_moe_dispatch_destroy(lutra_moe_dispatch *d) {
  static const char fn[] = "lutra_moe_dispatch_destroy";
  TRY(lutra_check_object(d, LUTRA_MAGIC_MOE_DISPATCH, fn, "dispatcher"));
  dispatch_buffers_free(d);
  d->obj.flags |= LUTRA_OBJ_FREED;
  return LUTRA_OK;
}

/* Output buffers in two steps (runtime/tensor.h): all are prepared, then either all are
 * installed (the backend accepted the call) or all dropped, so that a failed call leaves the
 * dispatcher as it was. */
typedef struct staged {
  int n;
  int which[4];
  lutra_tensor *fresh[4];
} staged;

static int stage_shape(lutra_moe_dispatch *d, staged *s, int which, int dtype, int ndim,
                       const int64_t *shape, const char *fn) {
  int st = lutra_tensor_prepare(d->buf[which], PLAIN_TENSOR(dtype, ndim, shape, d->device),
                                &s->fresh[s->n], fn);
  if (st != LUTRA_OK) {
    for (int i = 0; i < s->n; i++)
      lutra_tensor_discard(d->buf[s->which[i]], s->fresh[i]);
    return st;
  }
  s->which[s->n++] = which;
  return LUTRA_OK;
}

/* a [rows, cols] buffer ([rows] when cols is 0) */
static int stage(lutra_moe_dispatch *d, staged *s, int which, int dtype, int64_t rows, int64_t cols,
                 const char *fn) {
  const int64_t shape[2] = {rows, cols};
  return stage_shape(d, s, which, dtype, cols > 0 ? 2 : 1, shape, fn);
}

/* a buffer of one row per token, in the leading dims of the last permute's x, cols wide */
static int stage_tokens(lutra_moe_dispatch *d, staged *s, int which, int dtype, int64_t cols,
                        const char *fn) {
  int64_t shape[4];
  for (int i = 0; i < d->x_ndim; i++)
    shape[i] = d->x_shape[i];
  shape[d->x_ndim - 1] = cols;
  return stage_shape(d, s, which, dtype, d->x_ndim, shape, fn);
}

static int finish(lutra_moe_dispatch *d, staged *s, int st, const char *fn) {
  for (int i = 0; i < s->n; i++) {
    if (st == LUTRA_OK)
      lutra_tensor_commit(&d->buf[s->which[i]], s->fresh[i]);
    else
      lutra_tensor_discard(d->buf[s->which[i]], s->fresh[i]);
  }
  return st == LUTRA_OK ? LUTRA_OK : lutra_error_wrap(st, fn);
}

static void *data_of(const staged *s, int which) {
  for (int i = 0; i < s->n; i++)
    if (s->which[i] == which) return s->fresh[i]->data;
  return NULL;
}

/* t a float tensor on d's device: [rows, hidden] (slots: the permuted rows) or, tokens,
 * [.., hidden] (2 to 4 dims, tokens the product of the leading ones) */
static int check_rows(const lutra_moe_dispatch *d, const lutra_tensor *t, bool tokens,
                      const char *what, const char *fn) {
  TRY(lutra_check_tensor(t, fn, what));
  CHECK_ARG(t->scaling == LUTRA_SCALING_NONE && lutra_dtype_is_float(t->dtype),
            "%s dtype %s is not f32, bf16 or f16", what, lutra_dtype_name(t->dtype));
  CHECK_ARG(t->ndim == 2 || (tokens && t->ndim > 2),
            tokens ? "%s must be [.., hidden] with 2 or more dims (got %d)"
                   : "%s must be a matrix [rows, hidden] (got %d dims)",
            what, (int)t->ndim);
  CHECK_ARG(t->device == d->device, "%s is on another device than the dispatcher", what);
  return LUTRA_OK;
}

static lutra_permute_args base_args(const lutra_moe_dispatch *d, int64_t hidden, int dtype) {
  return (lutra_permute_args){.tokens = d->tokens,
                              .k = d->k,
                              .experts = d->experts,
                              .hidden = hidden,
                              .dtype = dtype,
                              .probs_dtype = LUTRA_F32,
                              .row_map = d->buf[ROW_MAP] ? d->buf[ROW_MAP]->data : NULL,
                              .bad_index = d->bad_index ? d->bad_index->data : NULL};
}

/* a captured graph drops its reference to the dispatcher through this */
static int release_dispatch(void *p) {
  return lutra_moe_dispatch_unref(p);
}

static int hold_in_capture(lutra_moe_dispatch *d, const lutra_tensor *a, const lutra_tensor *b,
                           const char *fn) {
  if (!LUTRA_CAPTURING()) return LUTRA_OK;
  TRY(lutra_capture_hold_object(d, release_dispatch, fn));
  TRY(lutra_capture_hold_tensor(a, fn));
  if (b) TRY(lutra_capture_hold_tensor(b, fn));
  return LUTRA_OK;
}

int lutra_moe_permute(lutra_moe_dispatch *d, const lutra_tensor *x, const lutra_tensor *indices,
                      lutra_tensor **permuted, lutra_tensor **m_splits) {
  static const char fn[] = "lutra_moe_permute";
  TRY(lutra_check_object(d, LUTRA_MAGIC_MOE_DISPATCH, fn, "dispatcher"));
  TRY(check_rows(d, x, true, "x", fn));
  TRY(lutra_check_tensor(indices, fn, "indices"));
  CHECK_ARG(permuted && m_splits, "permuted and m_splits must not be NULL");
  CHECK_ARG(indices->dtype == LUTRA_I32, "indices must be i32, not %s",
            lutra_dtype_name(indices->dtype));
  CHECK_ARG(indices->device == d->device, "indices are on another device than the dispatcher");
  const int64_t tokens = lutra_rows(x), hidden = lutra_cols(x);
  CHECK_ARG((indices->ndim == 2 && indices->shape[0] == tokens) ||
                (indices->ndim == 1 && indices->numel == tokens),
            "indices must be [tokens, k] with tokens = %lld (x's rows: its leading dims), got %d "
            "dims of %lld rows",
            (long long)tokens, (int)indices->ndim, (long long)indices->shape[0]);
  const int64_t k = indices->ndim == 2 ? indices->shape[1] : 1;
  CHECK_ARG(tokens * k <= 0x7FFFFFFF, "tokens * k = %lld exceeds 2^31-1 rows",
            (long long)(tokens * k));
  staged s = {0};
  TRY(stage(d, &s, ROW_MAP, LUTRA_I32, tokens, k, fn));
  TRY(stage(d, &s, M_SPLITS, LUTRA_I32, d->experts, 0, fn));
  TRY(stage(d, &s, SCRATCH, LUTRA_I32, lutra_moe_scratch_ints(tokens * k, d->experts), 0, fn));
  TRY(stage(d, &s, PERMUTED, x->dtype, tokens * k, hidden, fn));
  lutra_permute_args a = base_args(d, hidden, x->dtype);
  a.tokens = tokens;
  a.k = (int32_t)k;
  a.indices = indices->data;
  a.row_map = data_of(&s, ROW_MAP);
  a.m_splits = data_of(&s, M_SPLITS);
  a.scratch = data_of(&s, SCRATCH);
  a.x = x->data;
  a.out = data_of(&s, PERMUTED);
  TRY(finish(d, &s, d->be->moe_permute(&a), fn));
  d->tokens = tokens;
  d->k = (int32_t)k;
  d->x_ndim = x->ndim;
  for (int i = 0; i < x->ndim; i++)
    d->x_shape[i] = x->shape[i];
  d->permuted = true;
  TRY(hold_in_capture(d, x, indices, fn));
  *permuted = d->buf[PERMUTED];
  *m_splits = d->buf[M_SPLITS];
  return LUTRA_OK;
}

/* t has one row per slot of the last permute */
static int check_slot_rows(const lutra_moe_dispatch *d, const lutra_tensor *t, const char *what,
                           const char *fn) {
  CHECK_STATE(d->permuted, "no permute has run (the row map comes from it)");
  TRY(check_rows(d, t, false, what, fn));
  CHECK_ARG(t->shape[0] == d->tokens * d->k,
            "%s has %lld rows, the last permute made %lld (tokens %lld x k %d)", what,
            (long long)t->shape[0], (long long)(d->tokens * d->k), (long long)d->tokens, (int)d->k);
  return LUTRA_OK;
}

int lutra_moe_permute_backward(lutra_moe_dispatch *d, const lutra_tensor *dpermuted,
                               lutra_tensor **dx) {
  static const char fn[] = "lutra_moe_permute_backward";
  TRY(lutra_check_object(d, LUTRA_MAGIC_MOE_DISPATCH, fn, "dispatcher"));
  CHECK_ARG(dx, "dx is NULL");
  TRY(check_slot_rows(d, dpermuted, "dpermuted", fn));
  const int64_t hidden = dpermuted->shape[1];
  staged s = {0};
  TRY(stage_tokens(d, &s, DX, dpermuted->dtype, hidden, fn));
  lutra_permute_args a = base_args(d, hidden, dpermuted->dtype);
  a.x = dpermuted->data;
  a.out = data_of(&s, DX);
  TRY(finish(d, &s, d->be->moe_permute_backward(&a), fn));
  TRY(hold_in_capture(d, dpermuted, NULL, fn));
  *dx = d->buf[DX];
  return LUTRA_OK;
}

int lutra_moe_unpermute(lutra_moe_dispatch *d, const lutra_tensor *expert_out,
                        const lutra_tensor *probs, lutra_tensor **y) {
  static const char fn[] = "lutra_moe_unpermute";
  TRY(lutra_check_object(d, LUTRA_MAGIC_MOE_DISPATCH, fn, "dispatcher"));
  CHECK_ARG(y, "y is NULL");
  TRY(check_slot_rows(d, expert_out, "expert_out", fn));
  TRY(lutra_check_tensor(probs, fn, "probs"));
  CHECK_ARG(probs->scaling == LUTRA_SCALING_NONE && lutra_dtype_is_float(probs->dtype),
            "probs dtype %s is not f32, bf16 or f16", lutra_dtype_name(probs->dtype));
  CHECK_ARG(probs->numel == d->tokens * d->k && (probs->ndim == 1 || probs->shape[0] == d->tokens),
            "probs must be [tokens, k] = [%lld, %d] like the last permute's indices",
            (long long)d->tokens, (int)d->k);
  CHECK_ARG(probs->device == d->device, "probs are on another device than the dispatcher");
  const int64_t hidden = expert_out->shape[1];
  staged s = {0};
  TRY(stage_tokens(d, &s, Y, expert_out->dtype, hidden, fn));
  lutra_permute_args a = base_args(d, hidden, expert_out->dtype);
  a.x = expert_out->data;
  a.probs = probs->data;
  a.probs_dtype = probs->dtype;
  a.out = data_of(&s, Y);
  TRY(finish(d, &s, d->be->moe_unpermute(&a), fn));
  lutra_tensor_hold(&d->expert_out, expert_out);
  lutra_tensor_hold(&d->probs, probs);
  TRY(hold_in_capture(d, expert_out, probs, fn));
  *y = d->buf[Y];
  return LUTRA_OK;
}

int lutra_moe_unpermute_backward(lutra_moe_dispatch *d, const lutra_tensor *dy,
                                 lutra_tensor **dexpert_out, lutra_tensor **dprobs) {
  static const char fn[] = "lutra_moe_unpermute_backward";
  TRY(lutra_check_object(d, LUTRA_MAGIC_MOE_DISPATCH, fn, "dispatcher"));
  CHECK_ARG(dexpert_out && dprobs, "dexpert_out and dprobs must not be NULL");
  CHECK_STATE(d->expert_out && d->probs, "backward called before unpermute");
  CHECK_STATE(!(d->expert_out->flags & LUTRA_TENSOR_FREED) &&
                  !(d->probs->flags & LUTRA_TENSOR_FREED),
              "the expert output or probabilities held by unpermute were freed");
  const lutra_tensor *xe = d->expert_out, *probs = d->probs;
  CHECK_STATE(xe->shape[0] == d->tokens * d->k,
              "a permute of another shape ran after the unpermute: run unpermute again");
  TRY(check_rows(d, dy, true, "dy", fn));
  CHECK_ARG(dy->dtype == xe->dtype, "dy dtype %s does not match the expert output's %s",
            lutra_dtype_name(dy->dtype), lutra_dtype_name(xe->dtype));
  CHECK_ARG(lutra_rows(dy) == d->tokens && lutra_cols(dy) == xe->shape[1],
            "dy must be [%lld, %lld] (its leading dims the tokens) like the unpermute's output",
            (long long)d->tokens, (long long)xe->shape[1]);
  const int64_t hidden = xe->shape[1];
  staged s = {0};
  TRY(stage(d, &s, DEXPERT, xe->dtype, d->tokens * d->k, hidden, fn));
  TRY(stage(d, &s, DPROBS, probs->dtype, d->tokens, d->k, fn));
  lutra_permute_args a = base_args(d, hidden, xe->dtype);
  a.x = xe->data;
  a.probs = probs->data;
  a.probs_dtype = probs->dtype;
  a.dy = dy->data;
  a.out = data_of(&s, DEXPERT);
  a.dprobs = data_of(&s, DPROBS);
  TRY(finish(d, &s, d->be->moe_unpermute_backward(&a), fn));
  TRY(hold_in_capture(d, dy, NULL, fn));
  *dexpert_out = d->buf[DEXPERT];
  *dprobs = d->buf[DPROBS];
  return LUTRA_OK;
}

int lutra_moe_row_map(const lutra_moe_dispatch *d, lutra_tensor **row_map) {
  static const char fn[] = "lutra_moe_row_map";
  TRY(lutra_check_object(d, LUTRA_MAGIC_MOE_DISPATCH, fn, "dispatcher"));
  CHECK_ARG(row_map, "row_map is NULL");
  CHECK_STATE(d->permuted, "no permute has run");
  *row_map = d->buf[ROW_MAP];
  return LUTRA_OK;
}

int lutra_moe_dispatch_check(lutra_moe_dispatch *d) {
  static const char fn[] = "lutra_moe_dispatch_check";
  TRY(lutra_check_object(d, LUTRA_MAGIC_MOE_DISPATCH, fn, "dispatcher"));
  if (!d->bad_index) return LUTRA_OK;
  int32_t bad = 0;
  int st = d->be->to_host(&bad, d->bad_index->data, sizeof bad);
  if (st != LUTRA_OK) return lutra_error_wrap(st, fn);
  if (!bad) return LUTRA_OK;
  st = d->be->memset(d->bad_index->data, 0, sizeof bad);
  if (st != LUTRA_OK) return lutra_error_wrap(st, fn);
  return lutra_error(LUTRA_EINVAL, fn,
                     "an expert index of a permute since the last check was outside [0, %d): "
                     "those slots were dropped (in no split, their rows not written)",
                     (int)d->experts);
}
