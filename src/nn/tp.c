/* Tensor-parallel collectives around the Linear core's GEMMs (see nn/tp.h). */
#include "nn/tp.h"
#include "backend/device.h"
#include "core/error.h"
#include "fp8/autocast.h"
#include "fp8/recipe.h"
#include "parallel/group.h"
#include "runtime/tensor.h"

#include <string.h>

int lutra_tp_init(lutra_tp *tp, const lutra_tp_desc *d, int64_t in, int64_t out, int dtype,
                  int device, int64_t *local_in, int64_t *local_out, const char *fn) {
  CHECK_ARG(d, "tp desc is NULL");
  CHECK_ARG(d->mode == LUTRA_TP_COLUMN || d->mode == LUTRA_TP_ROW,
            "parallel mode must be column (%d) or row (%d), got %d", LUTRA_TP_COLUMN, LUTRA_TP_ROW,
            (int)d->mode);
  TRY(lutra_group_check(d->group, fn));
  memset(tp, 0, sizeof *tp);
  tp->mode = d->mode;
  tp->sp = d->sequence_parallel != 0;
  tp->rank = lutra_group_rank_of(d->group);
  tp->size = lutra_group_size_of(d->group);
  tp->dtype = dtype;
  tp->device = device;
  tp->checked_rows = -1;
  int64_t sharded = d->mode == LUTRA_TP_COLUMN ? out : in;
  CHECK_ARG(sharded % tp->size == 0, "%s_features %lld is not a multiple of the group size %d",
            d->mode == LUTRA_TP_COLUMN ? "out" : "in", (long long)sharded, tp->size);
  *local_in = d->mode == LUTRA_TP_ROW ? in / tp->size : in;
  *local_out = d->mode == LUTRA_TP_COLUMN ? out / tp->size : out;
  tp->group = d->group;
  lutra_group_retain(tp->group);
  return LUTRA_OK;
}

void lutra_tp_release(lutra_tp *tp) {
  lutra_tensor *owned[] = {tp->x_full, tp->y, tp->dy_full, tp->dx, tp->xq_full, tp->deq};
  for (size_t i = 0; i < sizeof owned / sizeof *owned; i++)
    lutra_tensor_owner_drop(owned[i]);
  tp->x_full = tp->y = tp->dy_full = tp->dx = tp->xq_full = tp->deq = NULL;
  lutra_group_unref(tp->group);
  tp->group = NULL;
}

/* The first call with a new input shape (or recipe): every rank must run the same one. */
static int agree(lutra_tp *tp, const lutra_tensor *x, const char *fn) {
  const lutra_tls_state *s = lutra_autocast_current();
  uint64_t rkey = s->recipe && s->enabled ? s->recipe->key : 0;
  int64_t rows = lutra_rows(x);
  if (rows == tp->checked_rows && rkey == tp->checked_recipe) return LUTRA_OK;
  TRY(lutra_group_check(tp->group, fn));
  int64_t v[5] = {rows, lutra_cols(x), x->dtype, tp->mode * 2 + tp->sp, (int64_t)(rkey >> 1)};
  TRY(lutra_dist_agree(tp->group, v, 5,
                       "the parallel layer's (input rows, input features, dtype, mode, recipe key)",
                       fn));
  tp->checked_rows = rows;
  tp->checked_recipe = rkey;
  return LUTRA_OK;
}

/* a tensor of x's dims with the leading dim (the sequence) scaled by num/den */
static int ensure_rows(lutra_tensor **t, const lutra_tensor *like, int64_t num, int64_t den,
                       int64_t cols, int dtype, const char *fn) {
  int64_t shape[LUTRA_MAX_DIMS];
  memcpy(shape, like->shape, sizeof shape);
  int nd = like->ndim;
  CHECK_ARG(shape[0] * num % den == 0, "the leading dim %lld is not a multiple of %lld",
            (long long)shape[0], (long long)den);
  shape[0] = shape[0] * num / den;
  shape[nd - 1] = cols;
  return lutra_tensor_ensure(t, PLAIN_TENSOR(dtype, nd, shape, like->device), fn);
}

static bool gathers_fp8(const lutra_tp *tp) {
  const lutra_tls_state *s = lutra_autocast_current();
  const lutra_recipe *r = s->recipe;
  return r && s->enabled && r->roles[LUTRA_ROLE_INPUT].kind == LUTRA_QUANT_DELAYED &&
         (tp->size == 1 || (r->reduce_amax && s->group == tp->group));
}

bool lutra_tp_gathers_fp8(const lutra_tp *tp) {
  return tp->mode == LUTRA_TP_COLUMN && tp->sp && gathers_fp8(tp);
}

int lutra_tp_forward_input(lutra_tp *tp, const lutra_tensor *x, const lutra_tensor **gemm_x,
                           int32_t *gather_rows, const char *fn) {
  TRY(agree(tp, x, fn));
  *gather_rows = 1;
  if (!(tp->mode == LUTRA_TP_COLUMN && tp->sp)) {
    *gemm_x = x;
    return LUTRA_OK;
  }
  if (gathers_fp8(tp)) {
    *gather_rows = tp->size;
    *gemm_x = x;
    return LUTRA_OK;
  }
  CHECK_ARG(x->dtype == tp->dtype, "input dtype %s does not match the module's %s",
            lutra_dtype_name(x->dtype), lutra_dtype_name(tp->dtype));
  TRY(ensure_rows(&tp->x_full, x, tp->size, 1, lutra_cols(x), x->dtype, fn));
  TRY(lutra_dist_all_gather(tp->group, x->data, tp->x_full->data,
                            (size_t)x->numel * lutra_dtype_size(x->dtype), x->device, fn));
  *gemm_x = tp->x_full;
  return LUTRA_OK;
}

int lutra_tp_forward_output(lutra_tp *tp, lutra_tensor *y_partial, lutra_tensor **y,
                            const char *fn) {
  if (tp->mode == LUTRA_TP_COLUMN) {
    *y = y_partial;
    return LUTRA_OK;
  }
  if (!tp->sp) {
    TRY(lutra_dist_all_reduce(tp->group, y_partial->data, y_partial->numel, y_partial->dtype,
                              LUTRA_REDUCE_SUM, y_partial->device, fn));
    *y = y_partial;
    return LUTRA_OK;
  }
  TRY(ensure_rows(&tp->y, y_partial, 1, tp->size, lutra_cols(y_partial), y_partial->dtype, fn));
  TRY(lutra_dist_reduce_scatter(tp->group, y_partial->data, tp->y->data, tp->y->numel,
                                y_partial->dtype, y_partial->device, fn));
  *y = tp->y;
  return LUTRA_OK;
}

int lutra_tp_backward_input(lutra_tp *tp, const lutra_tensor *dy, const lutra_tensor **gemm_dy,
                            const char *fn) {
  if (!(tp->mode == LUTRA_TP_ROW && tp->sp)) {
    *gemm_dy = dy;
    return LUTRA_OK;
  }
  TRY(ensure_rows(&tp->dy_full, dy, tp->size, 1, lutra_cols(dy), dy->dtype, fn));
  TRY(lutra_dist_all_gather(tp->group, dy->data, tp->dy_full->data,
                            (size_t)dy->numel * lutra_dtype_size(dy->dtype), dy->device, fn));
  *gemm_dy = tp->dy_full;
  return LUTRA_OK;
}

int lutra_tp_backward_output(lutra_tp *tp, lutra_tensor *dx_partial, lutra_tensor **dx,
                             const char *fn) {
  if (tp->mode == LUTRA_TP_ROW) {
    *dx = dx_partial;
    return LUTRA_OK;
  }
  if (!tp->sp) {
    TRY(lutra_dist_all_reduce(tp->group, dx_partial->data, dx_partial->numel, dx_partial->dtype,
                              LUTRA_REDUCE_SUM, dx_partial->device, fn));
    *dx = dx_partial;
    return LUTRA_OK;
  }
  TRY(ensure_rows(&tp->dx, dx_partial, 1, tp->size, lutra_cols(dx_partial), dx_partial->dtype, fn));
  TRY(lutra_dist_reduce_scatter(tp->group, dx_partial->data, tp->dx->data, tp->dx->numel,
                                dx_partial->dtype, dx_partial->device, fn));
  *dx = tp->dx;
  return LUTRA_OK;
}

int lutra_tp_gather_fp8(void *ctx, const lutra_tensor *xq, const float *scale, lutra_tensor **full,
                        const char *fn) {
  lutra_tp *tp = ctx;
  CHECK_STATE(xq->scaling == LUTRA_SCALING_TENSOR && xq->data,
              "the FP8 all-gather needs per-tensor scaled rowwise codes");
  int64_t shape[LUTRA_MAX_DIMS];
  memcpy(shape, xq->shape, sizeof shape);
  shape[0] *= tp->size;
  lutra_tensor_spec spec = {.dtype = xq->dtype,
                            .scaling = LUTRA_SCALING_TENSOR,
                            .ndim = xq->ndim,
                            .device = xq->device,
                            .shape = shape,
                            .rowwise = true,
                            .columnwise = true};
  TRY(lutra_tensor_ensure(&tp->xq_full, &spec, fn));
  TRY(lutra_tensor_ensure(&tp->deq, PLAIN_TENSOR(LUTRA_F32, xq->ndim, shape, xq->device), fn));
  lutra_tensor *f = tp->xq_full;
  TRY(lutra_dist_all_gather(tp->group, xq->data, f->data, (size_t)xq->numel, xq->device, fn));
  const lutra_backend *be;
  TRY(lutra_backend_get(xq->device, &be, fn));
  /* every rank quantized with the same scale (its amaxes are reduced over this group) */
  TRY(be->copy(f->scale_inv, xq->scale_inv, sizeof(float)));
  int64_t rows = lutra_rows(f), cols = lutra_cols(f);
  TRY(be->dequantize(&(lutra_dequant_args){.data = f->data,
                                           .scale_inv = f->scale_inv,
                                           .dtype = f->dtype,
                                           .scaling = LUTRA_SCALING_TENSOR,
                                           .rows = rows,
                                           .cols = cols,
                                           .out = tp->deq->data,
                                           .out_dtype = LUTRA_F32}));
  TRY(be->cast(&(lutra_quant_args){.x = tp->deq->data,
                                   .x_dtype = LUTRA_F32,
                                   .out_dtype = f->dtype,
                                   .rows = rows,
                                   .cols = cols,
                                   .col_data = f->col_data,
                                   .col_scale_inv = f->col_scale_inv,
                                   .scale = scale}));
  *full = f;
  return LUTRA_OK;
}
