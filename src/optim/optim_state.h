/* Optimizer internals for checkpoints (io/checkpoint.c): the state gathered at creation. */
#ifndef LUTRA_NN_OPTIM_STATE_H
#define LUTRA_NN_OPTIM_STATE_H

#include "backend/backend.h"
#include "lutra.h"

typedef struct lutra_optim_view {
  int32_t kind; /* LUTRA_OPTIM_* */
  float *lr;    /* the current base lr (lutra_optim_set_lr) */
  lutra_lr_schedule *schedule;
  float *max_grad_norm;
  const lutra_optim_desc *desc; /* as built: what has no setter (betas, eps, decay) is fixed */
  lutra_optim_args *args;  /* master, m, v in backend memory; step; device_step (NULL on cpu) */
  lutra_tensor **mastered; /* [i]: the bf16 parameter whose master is args->master[i], or NULL */
  int32_t accumulated;     /* micro-batches summed since the last step (lutra_optim_accumulate) */
  int32_t *window;         /* the same count, for a load to close the window (0: no sums kept) */
  lutra_module *module;
  const lutra_backend *be;
} lutra_optim_view;
/* LUTRA_ESTATE when o or its module was freed. */
int lutra_optim_view_of(lutra_optim *o, lutra_optim_view *v, const char *fn);
/* lutra_optim_set_schedule's checks (LUTRA_EINVAL naming fn, then context, then the field). */
int lutra_lr_schedule_check(const lutra_lr_schedule *s, const char *fn, const char *context);

#endif
