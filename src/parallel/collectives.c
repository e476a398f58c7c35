/* The tensor collectives of lutra/dist.h: argument checks, then the group's transport. */
#include "backend/device.h"
#include "core/error.h"
#include "core/object.h"
#include "parallel/group.h"
#include "runtime/tensor.h"

static int check_pair(const lutra_tensor *x, const lutra_tensor *y, const char *fn) {
  TRY(lutra_check_tensor(x, fn, "x"));
  TRY(lutra_check_tensor(y, fn, "y"));
  CHECK_ARG(x->dtype == y->dtype, "y has dtype %s, x %s", lutra_dtype_name(y->dtype),
            lutra_dtype_name(x->dtype));
  CHECK_ARG(x->device == y->device, "x and y are on different devices");
  CHECK_ARG(x->data && y->data, "x and y need their rowwise data");
  CHECK_ARG(lutra_cols(x) == lutra_cols(y), "y has %lld columns, x %lld", (long long)lutra_cols(y),
            (long long)lutra_cols(x));
  return LUTRA_OK;
}

int lutra_group_all_reduce(lutra_group *g, lutra_tensor *t, int op) {
  static const char fn[] = "lutra_group_all_reduce";
  TRY(lutra_group_check(g, fn));
  TRY(lutra_check_tensor(t, fn, "t"));
  CHECK_ARG(op == LUTRA_REDUCE_SUM || op == LUTRA_REDUCE_MAX || op == LUTRA_REDUCE_AVG,
            "unknown reduction %d", op);
  CHECK_ARG(t->dtype == LUTRA_F32 || t->dtype == LUTRA_BF16, "t must be f32 or bf16 (got %s)",
            lutra_dtype_name(t->dtype));
  int64_t key[3] = {t->numel, t->dtype, op};
  TRY(lutra_dist_agree_once(g, 0, key, 3, "the all-reduce's (numel, dtype, op)", fn));
  return lutra_tensor_mark_written(
      t, lutra_dist_all_reduce(g, t->data, t->numel, t->dtype, op, t->device, fn));
}

int lutra_group_all_gather(lutra_group *g, const lutra_tensor *x, lutra_tensor *y) {
  static const char fn[] = "lutra_group_all_gather";
  TRY(lutra_group_check(g, fn));
  TRY(check_pair(x, y, fn));
  int size = lutra_group_size_of(g);
  CHECK_ARG(lutra_rows(y) == size * lutra_rows(x), "y has %lld rows; %d ranks of %lld need %lld",
            (long long)lutra_rows(y), size, (long long)lutra_rows(x),
            (long long)(size * lutra_rows(x)));
  CHECK_ARG(x->scaling == LUTRA_SCALING_NONE || x->scaling == LUTRA_SCALING_TENSOR,
            "FP8 tensors gather with per-tensor scaling only");
  int64_t key[3] = {x->numel, x->dtype, x->scaling};
  TRY(lutra_dist_agree_once(g, 1, key, 3, "the all-gather's (numel, dtype, scaling)", fn));
  TRY(lutra_dist_all_gather(g, x->data, y->data, (size_t)x->numel * lutra_dtype_size(x->dtype),
                            x->device, fn));
  if (x->scaling == LUTRA_SCALING_TENSOR && y->scale_inv && x->scale_inv) {
    /* every rank quantized with the same (reduced) scale: y takes it */
    const lutra_backend *be;
    TRY(lutra_backend_get(x->device, &be, fn));
    TRY(be->copy(y->scale_inv, x->scale_inv, sizeof(float)));
  }
  return lutra_tensor_mark_written(y, LUTRA_OK);
}

int lutra_group_reduce_scatter(lutra_group *g, const lutra_tensor *x, lutra_tensor *y) {
  static const char fn[] = "lutra_group_reduce_scatter";
  TRY(lutra_group_check(g, fn));
  TRY(check_pair(x, y, fn));
  CHECK_ARG(x->dtype == LUTRA_F32 || x->dtype == LUTRA_BF16, "x must be f32 or bf16 (got %s)",
            lutra_dtype_name(x->dtype));
  int size = lutra_group_size_of(g);
  CHECK_ARG(lutra_rows(x) % size == 0 && lutra_rows(y) == lutra_rows(x) / size,
            "x has %lld rows and y %lld: x needs a multiple of %d rows and y 1/%d of them",
            (long long)lutra_rows(x), (long long)lutra_rows(y), size, size);
  int64_t key[2] = {x->numel, x->dtype};
  TRY(lutra_dist_agree_once(g, 2, key, 2, "the reduce-scatter's (numel, dtype)", fn));
  return lutra_tensor_mark_written(
      y, lutra_dist_reduce_scatter(g, x->data, y->data, y->numel, x->dtype, x->device, fn));
}
