/* The backend's optimizer-step arguments (backend/backend.h's sgd_step and adamw_step). */
#ifndef LUTRA_BACKEND_ARGS_OPTIM_H
#define LUTRA_BACKEND_ARGS_OPTIM_H

#include "backend/args_common.h"

/* Optimizer steps over many tensors in one call. For each i: value[i] (dtype value_dtype[i])
 * is updated from grad[i] (f32 or the value dtype); master[i], when not NULL, is the f32
 * master copy that is updated and then rounded into value[i]. */
typedef struct lutra_optim_args {
  int32_t count;
  int32_t pad;
  void **value;
  int32_t *value_dtype;
  const void **grad;
  int32_t *grad_dtype;
  float **master;
  float **m; /* SGD momentum buffer or AdamW first moment (NULL for plain SGD) */
  float **v; /* AdamW second moment */
  int64_t *numel;
  float lr, momentum, weight_decay, beta1, beta2, eps;
  int64_t step; /* AdamW: 1-based step for bias correction */
  /* AdamW on a device (NULL on the CPU, which uses step): the number of steps taken, in backend
   * memory owned by the optimizer (zeroed at creation). The step's kernel reads
   * t = *device_step + 1 and advances the counter itself, so that a replayed CUDA graph takes
   * step t + 1 next; arrivals is that kernel's block counter (zero between launches). */
  int64_t *device_step;
  uint32_t *arrivals;
  /* the lr of step t is lutra_lr_at(&schedule, lr, t) (backend/optim_math.h) */
  lutra_lr_schedule schedule;
  const uint8_t *decays; /* host array, [i] 0: tensor i takes no weight decay; NULL: all do */
  /* > 0: every gradient is scaled by lutra_clip_factor(sum of squares of all, max_grad_norm)
   * before the update; 0: no norm, no scaling */
  float max_grad_norm;
  int32_t pad2;
  /* backend memory of LUTRA_CLIP_DOUBLES doubles, zeroed at creation: the step writes the sum
   * of squares of all gradients at [LUTRA_CLIP_SUMSQ] when clipping; before it, a device
   * backend's per-block partial sums, and after it the arrival counter of its reduction */
  double *clip;
} lutra_optim_args;

enum { LUTRA_CLIP_PARTIALS = 512, LUTRA_CLIP_SUMSQ = 512, LUTRA_CLIP_DOUBLES = 514 };

#endif
