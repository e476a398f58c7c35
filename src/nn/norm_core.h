/* The norm core: what a module that normalizes its input over the last dim holds and runs
 * (LayerNorm or RMSNorm, TransformerEngine's): the parameters and their gradients, the row
 * statistics, the output and input-gradient buffers (one per input shape seen, so that a
 * training and an evaluation batch size alternate without reallocating), and the input held
 * for the backward. The LayerNorm/RMSNorm module (nn/norm.c) is the core alone
 * (lutra_norm_core_run); LayerNormLinear builds on it, and its forward may hand the norm's
 * arguments to a fused kernel (lutra_norm_core_args) instead of running the plain norm. */
#ifndef LUTRA_NN_NORM_CORE_H
#define LUTRA_NN_NORM_CORE_H

#include "backend/backend.h"
#include "lutra.h"
#include "runtime/tensor_cache.h"

#include <stdbool.h>

typedef struct lutra_norm_core {
  lutra_norm_desc d;
  const lutra_backend *be;
  lutra_tensor *weight, *bias, *wgrad, *bgrad; /* bias, bgrad NULL for RMSNorm */
  lutra_tensor *y, *dx, *mean, *rstd;          /* from the caches below */
  const lutra_tensor *x; /* held (lutra_tensor_hold) from a grad forward until the next */
  bool forward_done;
  /* armed by a Residual around the module for its next backward (lutra_fusion_ops.arm_residual):
   * dx + residual written into residual_out by the norm's kernel; taken (cleared) by it */
  const lutra_tensor *residual;
  lutra_tensor *residual_out;
  lutra_tensor_cache y_cache, dx_cache, mean_cache, rstd_cache;
} lutra_norm_core;

/* Parameters as d says (checked: hidden > 0, eps finite >= 0, dtype f32/bf16), gamma = 1
 * (stored 0 when zero-centered), beta = 0. On failure nothing is kept. */
int lutra_norm_core_init(lutra_norm_core *c, const lutra_norm_desc *d, const char *fn);
void lutra_norm_core_release(lutra_norm_core *c);
/* Checks x for a forward and sizes y and the statistics for it. */
int lutra_norm_core_prepare(lutra_norm_core *c, const lutra_tensor *x, const char *fn);
/* The norm of x with the core's parameters and statistics (y not set). */
lutra_norm_args lutra_norm_core_args(const lutra_norm_core *c, const lutra_tensor *x);
/* The plain forward into c->y (after prepare). */
int lutra_norm_core_forward(lutra_norm_core *c, const lutra_tensor *x, const char *fn);
/* What a forward keeps: x for the backward when grad, nothing otherwise. */
void lutra_norm_core_done(lutra_norm_core *c, const lutra_tensor *x, bool grad);
/* The whole forward of the norm alone into c->y: prepare, the plain norm, done. An inference
 * forward (!grad) writes no statistics. */
int lutra_norm_core_run(lutra_norm_core *c, const lutra_tensor *x, bool grad, const char *fn);
/* That the last forward kept its input for a backward and the input is not freed. */
int lutra_norm_core_check_saved(const lutra_norm_core *c, const char *fn);
/* Backward of the last forward from dy (y's gradient): dgamma, dbeta, and *dx when dx is not
 * NULL (an armed residual added into residual_out where it matches the input: *dx is then that
 * tensor). */
int lutra_norm_core_backward(lutra_norm_core *c, const lutra_tensor *dy, lutra_tensor **dx,
                             const char *fn);
int lutra_norm_core_num_params(const lutra_norm_core *c);
void lutra_norm_core_param(const lutra_norm_core *c, int i, lutra_param *out);

#endif
