/* The tensor operations of lutra/tensor_ops.h: the checks every backend shares, then one backend
 * call. The row operations read a tensor as rows of its last dim. */
#include "backend/backend.h"
#include "backend/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/object.h"
#include "runtime/tensor.h"
#include "runtime/tensor_view.h"

#include <stdlib.h>
#include <string.h>

/* a live high-precision float tensor with its data */
static int check_float(const lutra_tensor *t, const char *fn, const char *what) {
  TRY(lutra_check_tensor(t, fn, what));
  if (!lutra_dtype_is_float(t->dtype) || !t->data)
    return lutra_error(LUTRA_EINVAL, fn, "%s dtype %s is not f32, bf16 or f16", what,
                       lutra_dtype_name(t->dtype));
  return LUTRA_OK;
}

/* a live high-precision float or i32 tensor with its data (views and selections take ids too) */
static int check_plain(const lutra_tensor *t, const char *fn, const char *what) {
  TRY(lutra_check_tensor(t, fn, what));
  if ((!lutra_dtype_is_float(t->dtype) && t->dtype != LUTRA_I32) || !t->data ||
      t->scaling != LUTRA_SCALING_NONE)
    return lutra_error(LUTRA_EINVAL, fn, "%s dtype %s is not f32, bf16, f16 or i32", what,
                       lutra_dtype_name(t->dtype));
  return LUTRA_OK;
}

static int check_same(const lutra_tensor *a, const lutra_tensor *b, const char *fn, const char *an,
                      const char *bn) {
  if (a->device != b->device)
    return lutra_error(LUTRA_EINVAL, fn, "%s and %s are on different devices", an, bn);
  if (!lutra_same_shape(a, b))
    return lutra_error(LUTRA_EINVAL, fn, "%s and %s have different shapes (%lld and %lld elements)",
                       an, bn, (long long)a->numel, (long long)b->numel);
  return LUTRA_OK;
}

int lutra_add_scaled(const lutra_tensor *a, const lutra_tensor *b, float alpha, lutra_tensor *out) {
  static const char fn[] = "lutra_add_scaled";
  TRY(check_float(a, fn, "a"));
  TRY(check_float(b, fn, "b"));
  TRY(check_float(out, fn, "out"));
  TRY(check_same(a, b, fn, "a", "b"));
  TRY(check_same(a, out, fn, "a", "out"));
  CHECK_ARG(a->dtype == b->dtype && a->dtype == out->dtype, "dtypes differ: a %s, b %s, out %s",
            lutra_dtype_name(a->dtype), lutra_dtype_name(b->dtype), lutra_dtype_name(out->dtype));
  const lutra_backend *be;
  TRY(lutra_backend_get(a->device, &be, fn));
  return lutra_tensor_mark_written(
      out, be->axpby(a->data, 1.0f, b->data, alpha, out->data, a->dtype, a->numel));
}

int lutra_tensor_scale(lutra_tensor *t, float s) {
  static const char fn[] = "lutra_tensor_scale";
  TRY(check_float(t, fn, "tensor"));
  const lutra_backend *be;
  TRY(lutra_backend_get(t->device, &be, fn));
  return lutra_tensor_mark_written(t,
                                   be->axpby(t->data, s, NULL, 0.0f, t->data, t->dtype, t->numel));
}

/* ---- views and selections -------------------------------------------------------------- */

static int check_rows(const lutra_tensor *t, int64_t first, int64_t count, const char *fn) {
  TRY(check_plain(t, fn, "tensor"));
  CHECK_ARG(first >= 0 && count >= 1 && first <= t->shape[0] - count,
            "rows [%lld, %lld) are outside the tensor's %lld rows (first >= 0, count >= 1)",
            (long long)first, (long long)first + (long long)count, (long long)t->shape[0]);
  return LUTRA_OK;
}

/* points v at rows [first, first + count) of t (checked), taking a reference to the root base */
static void point_view(lutra_tensor *v, lutra_tensor *t, int64_t first, int64_t count) {
  lutra_tensor *root = t->base ? t->base : t;
  const int64_t row = t->numel / t->shape[0];
  const size_t esize = lutra_dtype_size(t->dtype);
  lutra_tensor_take_ref(root);
  root->views++;
  v->base = root;
  v->data = (char *)t->data + (size_t)(first * row) * esize;
  v->ndim = t->ndim;
  memmove(v->shape, t->shape, sizeof v->shape); /* v may be t (a view re-pointed at itself) */
  v->shape[0] = count;
  v->numel = count * row;
  v->dtype = t->dtype;
  v->device = t->device;
  v->scaling = LUTRA_SCALING_NONE;
}

int lutra_tensor_view_rows(lutra_tensor *t, int64_t first, int64_t count, lutra_tensor **out) {
  static const char fn[] = "lutra_tensor_view_rows";
  CHECK_ARG(out, "out is NULL");
  TRY(check_rows(t, first, count, fn));
  lutra_tensor *v = calloc(1, sizeof *v);
  if (!v) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a tensor");
  v->refs = 1;
  point_view(v, t, first, count);
  *out = v;
  return LUTRA_OK;
}

int lutra_tensor_view_rows_into(lutra_tensor *view, lutra_tensor *t, int64_t first, int64_t count) {
  static const char fn[] = "lutra_tensor_view_rows_into";
  TRY(lutra_check_tensor(view, fn, "view"));
  CHECK_ARG(view->base && !(view->flags & LUTRA_TENSOR_BORROWED),
            "view is not a view (lutra_tensor_view_rows makes one)");
  TRY(check_rows(t, first, count, fn));
  lutra_tensor *old = view->base;
  point_view(view, t, first, count); /* the new reference first: old may be t's root */
  lutra_tensor_view_release(old);
  return LUTRA_OK;
}

int lutra_tensor_select(const lutra_tensor *t, int dim, int64_t index, lutra_tensor *out) {
  static const char fn[] = "lutra_tensor_select";
  TRY(check_plain(t, fn, "tensor"));
  TRY(check_plain(out, fn, "out"));
  CHECK_ARG(dim >= 0 && dim < t->ndim, "dim %d is not one of the tensor's dims 0..%d", dim,
            t->ndim - 1);
  CHECK_ARG(index >= 0 && index < t->shape[dim], "index %lld is outside dim %d of size %lld",
            (long long)index, dim, (long long)t->shape[dim]);
  CHECK_ARG(out->dtype == t->dtype && out->device == t->device,
            "out must have the tensor's dtype (%s) and device", lutra_dtype_name(t->dtype));
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; i++)
    outer *= t->shape[i];
  for (int i = dim + 1; i < t->ndim; i++)
    inner *= t->shape[i];
  bool fits = out->numel == outer * inner && (t->ndim == 1 || out->ndim == t->ndim - 1);
  for (int i = 0, j = 0; fits && i < t->ndim && t->ndim > 1; i++)
    if (i != dim) fits = out->shape[j++] == t->shape[i];
  CHECK_ARG(fits, "out must have the tensor's shape without dim %d (%lld elements)", dim,
            (long long)(outer * inner));
  const lutra_backend *be;
  TRY(lutra_backend_get(t->device, &be, fn));
  const size_t esize = lutra_dtype_size(t->dtype);
  const size_t width = (size_t)inner * esize;
  const char *src = (const char *)t->data + (size_t)index * width;
  return lutra_tensor_mark_written(
      out, be->copy_2d(out->data, width, src, width * (size_t)t->shape[dim], width, outer));
}

/* ---- row reductions -------------------------------------------------------------------- */

/* ids: i32 with x's leading dims ({1} for a 1-dim x), on x's device */
static int check_ids(const lutra_tensor *x, const lutra_tensor *ids, const char *fn) {
  TRY(check_float(x, fn, "x"));
  TRY(lutra_check_tensor(ids, fn, "ids"));
  CHECK_ARG(ids->dtype == LUTRA_I32, "ids dtype %s is not i32", lutra_dtype_name(ids->dtype));
  CHECK_ARG(ids->device == x->device, "x and ids are on different devices");
  bool fits = ids->numel == lutra_rows(x) && (x->ndim == 1 || ids->ndim == x->ndim - 1);
  for (int i = 0; fits && i + 1 < x->ndim; i++)
    fits = ids->shape[i] == x->shape[i];
  CHECK_ARG(fits, "ids must have x's leading dims (%lld ids, one per row of x)",
            (long long)lutra_rows(x));
  return LUTRA_OK;
}

int lutra_argmax(const lutra_tensor *x, lutra_tensor *ids) {
  static const char fn[] = "lutra_argmax";
  TRY(check_ids(x, ids, fn));
  const lutra_backend *be;
  TRY(lutra_backend_get(x->device, &be, fn));
  return lutra_tensor_mark_written(
      ids, be->rows_argmax(x->data, x->dtype, lutra_rows(x), lutra_cols(x), ids->data));
}

static int check_temperature(float temperature, const char *fn) {
  CHECK_ARG(temperature > 0 && temperature <= 3.4e38f,
            "temperature must be a finite number > 0 (got %g; greedy decoding is lutra_argmax)",
            (double)temperature);
  return LUTRA_OK;
}

int lutra_softmax(const lutra_tensor *x, float temperature, lutra_tensor *out) {
  static const char fn[] = "lutra_softmax";
  TRY(check_float(x, fn, "x"));
  TRY(check_float(out, fn, "out"));
  TRY(check_same(x, out, fn, "x", "out"));
  TRY(check_temperature(temperature, fn));
  const lutra_backend *be;
  TRY(lutra_backend_get(x->device, &be, fn));
  return lutra_tensor_mark_written(out,
                                   be->rows_softmax(x->data, x->dtype, lutra_rows(x), lutra_cols(x),
                                                    temperature, out->data, out->dtype));
}

int lutra_sample(const lutra_tensor *x, float temperature, int top_k, uint64_t seed,
                 lutra_tensor *ids) {
  static const char fn[] = "lutra_sample";
  TRY(check_ids(x, ids, fn));
  TRY(check_temperature(temperature, fn));
  CHECK_ARG(top_k >= 0, "top_k must be >= 0 (0: every logit; got %d)", top_k);
  const lutra_backend *be;
  TRY(lutra_backend_get(x->device, &be, fn));
  return lutra_tensor_mark_written(ids,
                                   be->rows_sample(x->data, x->dtype, lutra_rows(x), lutra_cols(x),
                                                   temperature, top_k, seed, ids->data));
}
