/* The backend's loss arguments (backend/backend.h's mse and softmax_xent entries). */
#ifndef LUTRA_BACKEND_ARGS_LOSS_H
#define LUTRA_BACKEND_ARGS_LOSS_H

#include "backend/args_common.h"

LUTRA_ARGS_NO_PADDING_BEGIN
/* A loss and its gradient, in one struct for both losses (each reads its own fields):
 * mse: loss = mean((pred - target)^2) over n elements, dgrad = 2 (pred - target) / n;
 * softmax_xent: pred is logits [rows, cols], loss = mean_r -log softmax(pred[r])[labels[r]],
 * dgrad = (softmax - onehot) / rows. The means accumulate in double. */
typedef struct lutra_loss_args {
  const void *pred;      /* mse: the prediction; softmax_xent: the logits */
  const void *target;    /* mse: pred's dtype and size */
  const int32_t *labels; /* softmax_xent: [rows], each in [0, cols) */
  int32_t dtype;         /* pred's, target's and dgrad's */
  int32_t pad;
  int64_t rows, cols; /* softmax_xent */
  int64_t n;          /* mse */
  float *loss;        /* f32 [1] */
  void *dgrad;        /* if not NULL: d loss / d pred, pred's dtype and shape */
  /* softmax_xent on a device, if not NULL: backend memory set to 1 when a label is outside
   * [0, cols) (never cleared by the backend; the loss is NaN then). A kernel cannot return an
   * error, and reading a flag back would cost a synchronization per call, so the loss module
   * reads it with the loss value. The CPU refuses such labels at once instead. */
  int32_t *bad_label;
} lutra_loss_args;
LUTRA_ARGS_NO_PADDING_END

#endif
