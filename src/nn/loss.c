/* Losses: the forward computes the mean loss and its gradient in one pass (the gradient is
 * what backward returns), so a training step makes one backend call per loss. */
#include "backend/backend.h"
#include "backend/device.h"
#include "core/dtype.h"
#include "core/capture.h"
#include "core/error.h"
#include "core/object.h"
#include "runtime/tensor.h"

#include <stdlib.h>

struct lutra_loss {
  lutra_object obj;
  int32_t kind;
  bool forward_done;
  lutra_tensor *loss;  /* f32 [1] */
  lutra_tensor *dpred; /* pred's shape and dtype */
  /* cross-entropy on a device: i32 [1], set by the kernel when a label was out of range (see
   * lutra_loss_args.bad_label), read and cleared by lutra_loss_value */
  lutra_tensor *bad_label;
  int64_t classes; /* cols of the last cross-entropy forward, for the message */
};

int lutra_loss_new(int kind, lutra_loss **out) {
  static const char fn[] = "lutra_loss_new";
  CHECK_ARG(out, "out is NULL");
  CHECK_ARG(kind == LUTRA_LOSS_MSE || kind == LUTRA_LOSS_SOFTMAX_XENT,
            "unknown loss kind %d (expected mse or softmax cross-entropy)", kind);
  lutra_loss *l = calloc(1, sizeof *l);
  if (!l) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a loss");
  l->obj.magic = LUTRA_MAGIC_LOSS;
  l->obj.refs = 1;
  l->kind = kind;
  *out = l;
  return LUTRA_OK;
}

static void loss_buffers_free(lutra_loss *l) {
  lutra_tensor_owner_drop(l->loss);
  lutra_tensor_owner_drop(l->dpred);
  lutra_tensor_owner_drop(l->bad_label);
  l->loss = l->dpred = l->bad_label = NULL;
}

int lutra_loss_unref(lutra_loss *l) {
  if (!l || --l->obj.refs > 0) return LUTRA_OK; /* a captured graph still holds it */
  loss_buffers_free(l);
  free(l);
  return LUTRA_OK;
}

int lutra_loss_destroy(lutra_loss *l) {
  static const char fn[] = "lutra_loss_destroy";
  TRY(lutra_check_object(l, LUTRA_MAGIC_LOSS, fn, "loss"));
  loss_buffers_free(l);
  l->obj.flags |= LUTRA_OBJ_FREED;
  return LUTRA_OK;
}

static int check_target(const lutra_loss *l, const lutra_tensor *pred, const lutra_tensor *target,
                        const char *fn) {
  CHECK_ARG(lutra_dtype_is_float(pred->dtype), "pred dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(pred->dtype));
  CHECK_ARG(target->device == pred->device, "target is on another device than pred");
  if (l->kind == LUTRA_LOSS_MSE) {
    CHECK_ARG(lutra_same_shape(pred, target), "target shape does not match pred");
    CHECK_ARG(target->dtype == pred->dtype, "target dtype %s does not match pred's %s",
              lutra_dtype_name(target->dtype), lutra_dtype_name(pred->dtype));
  } else {
    CHECK_ARG(target->dtype == LUTRA_I32, "target must hold i32 class labels, not %s",
              lutra_dtype_name(target->dtype));
    CHECK_ARG(target->numel == lutra_rows(pred), "%lld labels for %lld rows of pred",
              (long long)target->numel, (long long)lutra_rows(pred));
  }
  return LUTRA_OK;
}

/* a captured graph drops its reference to the loss through this */
static int release_loss(void *p) {
  return lutra_loss_unref(p);
}

int lutra_loss_forward(lutra_loss *l, const lutra_tensor *pred, const lutra_tensor *target,
                       lutra_tensor **loss) {
  static const char fn[] = "lutra_loss_forward";
  TRY(lutra_check_object(l, LUTRA_MAGIC_LOSS, fn, "loss"));
  TRY(lutra_check_tensor(pred, fn, "pred"));
  TRY(lutra_check_tensor(target, fn, "target"));
  CHECK_ARG(loss, "loss is NULL");
  TRY(check_target(l, pred, target, fn));
  const lutra_backend *be;
  TRY(lutra_backend_get(pred->device, &be, fn));
  if (l->kind == LUTRA_LOSS_SOFTMAX_XENT && pred->device != LUTRA_CPU && !l->bad_label) {
    int64_t one_flag = 1;
    lutra_tensor_spec spec = *PLAIN_TENSOR(LUTRA_I32, 1, &one_flag, pred->device);
    spec.flags = LUTRA_TENSOR_BORROWED;
    lutra_tensor *flag;
    TRY(lutra_tensor_make(&spec, &flag, fn));
    int zeroed = be->memset(flag->data, 0, sizeof(int32_t));
    if (zeroed != LUTRA_OK) {
      lutra_tensor_owner_drop(flag);
      return lutra_error_wrap(zeroed, fn);
    }
    l->bad_label = flag;
  }
  /* new buffers (a new shape) are installed only once the backend has accepted the call */
  int64_t one = 1;
  lutra_tensor *loss_t, *dpred;
  TRY(lutra_tensor_prepare(l->loss, PLAIN_TENSOR(LUTRA_F32, 1, &one, pred->device), &loss_t, fn));
  int st = lutra_tensor_prepare(
      l->dpred, PLAIN_TENSOR(pred->dtype, pred->ndim, pred->shape, pred->device), &dpred, fn);
  if (st == LUTRA_OK) {
    const lutra_loss_args la = {.pred = pred->data,
                                .target = target->data,
                                .labels = target->data,
                                .dtype = pred->dtype,
                                .rows = lutra_rows(pred),
                                .cols = lutra_cols(pred),
                                .n = pred->numel,
                                .loss = loss_t->data,
                                .dgrad = dpred->data,
                                .bad_label = l->bad_label ? l->bad_label->data : NULL};
    st = l->kind == LUTRA_LOSS_MSE ? be->mse(&la) : be->softmax_xent(&la);
    if (st != LUTRA_OK) {
      lutra_error_wrap(st, fn);
      lutra_tensor_discard(l->dpred, dpred);
    }
  }
  if (st != LUTRA_OK) {
    lutra_tensor_discard(l->loss, loss_t);
    return st;
  }
  lutra_tensor_commit(&l->loss, loss_t);
  lutra_tensor_commit(&l->dpred, dpred);
  l->forward_done = true;
  l->classes = lutra_cols(pred);
  if (LUTRA_CAPTURING()) {
    TRY(lutra_capture_hold_object(l, release_loss, fn));
    TRY(lutra_capture_hold_tensor(pred, fn));
    TRY(lutra_capture_hold_tensor(target, fn));
  }
  *loss = l->loss;
  return LUTRA_OK;
}

int lutra_loss_backward(lutra_loss *l, lutra_tensor **dpred) {
  static const char fn[] = "lutra_loss_backward";
  TRY(lutra_check_object(l, LUTRA_MAGIC_LOSS, fn, "loss"));
  CHECK_ARG(dpred, "dpred is NULL");
  CHECK_STATE(l->forward_done, "backward called before forward");
  *dpred = l->dpred;
  return LUTRA_OK;
}

int lutra_loss_value(const lutra_loss *l, float *value) {
  static const char fn[] = "lutra_loss_value";
  TRY(lutra_check_object(l, LUTRA_MAGIC_LOSS, fn, "loss"));
  CHECK_ARG(value, "value is NULL");
  CHECK_STATE(l->forward_done, "no loss computed yet");
  if (l->bad_label) {
    const lutra_backend *be;
    TRY(lutra_backend_get(l->bad_label->device, &be, fn));
    int32_t bad = 0;
    TRY(be->to_host(&bad, l->bad_label->data, sizeof bad));
    if (bad) {
      TRY(be->memset(l->bad_label->data, 0, sizeof bad));
      return lutra_error(LUTRA_EINVAL, fn,
                         "a label of a cross-entropy forward since the last read was outside "
                         "[0, %lld): the loss and its gradient are NaN",
                         (long long)l->classes);
    }
  }
  return lutra_tensor_get_f32(l->loss, value, 1);
}
