/* lutra/train.h: losses and optimizers.
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_TRAIN_H
#define LUTRA_TRAIN_H

#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- losses ------------------------------------------------------------------------------ */
typedef struct lutra_loss lutra_loss;
enum { LUTRA_LOSS_MSE = 0, LUTRA_LOSS_SOFTMAX_XENT = 1 };

LUTRA_API int lutra_loss_new(int kind, lutra_loss **out);
LUTRA_API int lutra_loss_unref(lutra_loss *l);
LUTRA_API int lutra_loss_destroy(lutra_loss *l);
/* MSE: target has pred's shape. Softmax cross-entropy: pred [N, C], target I32 labels [N].
 * The loss is a mean over rows (MSE: over all elements), written to a 1-element f32 tensor. */
LUTRA_API int lutra_loss_forward(lutra_loss *l, const lutra_tensor *pred,
                                 const lutra_tensor *target, lutra_tensor **loss);
LUTRA_API int lutra_loss_backward(lutra_loss *l, lutra_tensor **dpred);
LUTRA_API int lutra_loss_value(const lutra_loss *l, float *value); /* host copy of the loss */

/* ---- optimizers -------------------------------------------------------------------------- */
typedef struct lutra_optim lutra_optim;
enum { LUTRA_OPTIM_SGD = 0, LUTRA_OPTIM_ADAMW = 1 };

/* The learning rate of each step, computed where the step runs (the CPU from the step count, a
 * CUDA kernel from the device step counter, so that a captured step replayed N times follows the
 * schedule as N eager steps). With t the 1-based step being taken (1 for the first step), s = t -
 * 1, base the optimizer's lr (lutra_optim_set_lr), W = warmup_steps, T = total_steps, m = min_lr:
 *   s < W:                 lr = base * (s + 1) / W            (linear warmup, ends at base)
 *   CONSTANT, s >= W:      lr = base
 *   s >= T:                lr = m                              (constant after the decay)
 *   WARMUP_COSINE, else:   lr = m + 0.5 * (base - m) * (1 + cos(pi * (s - W) / (T - W)))
 *   WARMUP_LINEAR, else:   lr = m + (base - m) * (1 - (s - W) / (T - W))
 * in double, rounded once to f32 (llm.c's and nanoGPT's decay: base at s = W, m from s = T).
 * The zeroed schedule is CONSTANT without warmup: lr = base at every step. */
enum { LUTRA_LR_CONSTANT = 0, LUTRA_LR_WARMUP_COSINE = 1, LUTRA_LR_WARMUP_LINEAR = 2 };
typedef struct lutra_lr_schedule {
  int32_t kind;         /* LUTRA_LR_* */
  float min_lr;         /* >= 0, finite; unused by CONSTANT */
  int64_t warmup_steps; /* >= 0 */
  int64_t total_steps;  /* >= warmup_steps (CONSTANT: unused) */
} lutra_lr_schedule;

/* Which parameters take weight decay: ALL (the zeroed default here; the Lua front's AdamW
 * defaults to MATRICES), or MATRICES (nanoGPT's groups: parameters of 2 or more dimensions, i.e.
 * Linear / grouped / embedding weights; biases and norm weights, 1-D, take none). Fixed at
 * creation: a checkpoint carries the schedule and max_grad_norm (lutra/checkpoint.h), not the
 * rule, which the objects a run resumes into are built with. */
enum { LUTRA_DECAY_ALL = 0, LUTRA_DECAY_MATRICES = 1 };

typedef struct lutra_optim_desc {
  int32_t kind;
  float lr;           /* base (peak) lr of the schedule */
  float momentum;     /* SGD */
  float weight_decay; /* SGD: L2 added to the gradient; AdamW: decoupled */
  float beta1, beta2, eps;
  /* > 0: global-norm clipping as torch.nn.utils.clip_grad_norm_: norm = the l2 norm of all
   * gradients together (f64 sum of squares of the f32 gradients), every gradient scaled by
   * min(1, max_grad_norm / (norm + 1e-6)) in f32 before the update; 0: off (no norm computed);
   * +inf: the norm is computed (lutra_optim_grad_norm) and nothing is clipped */
  float max_grad_norm;
  int32_t decay; /* LUTRA_DECAY_* */
  int32_t pad;
  lutra_lr_schedule schedule;
} lutra_optim_desc;

LUTRA_API void lutra_optim_defaults(int kind, lutra_optim_desc *d);
/* Collects the parameters of m (and its children) once. BF16 parameters get f32 masters. */
LUTRA_API int lutra_optim_new(const lutra_optim_desc *d, lutra_module *m, lutra_optim **out);
LUTRA_API int lutra_optim_unref(lutra_optim *o);
LUTRA_API int lutra_optim_destroy(lutra_optim *o);
/* On cuda the step count lives in device memory too and the step's kernels advance it, so a
 * CUDA graph that captured a step takes the next step at every replay: its bias corrections
 * (AdamW), its scheduled lr and its clipping (the norm is computed on the device, no host read)
 * follow the count. The base lr, schedule, betas, eps, weight decay and max_grad_norm are
 * captured by value (the setters below do not reach a captured step). */
LUTRA_API int lutra_optim_step(lutra_optim *o);
/* Gradient accumulation over micro-batches: after each micro-batch's backward, accumulate adds
 * every parameter's gradient into an f32 sum of its own (allocated at the first call, which
 * must therefore come before a CUDA graph capture; the warm-up of lutra.graph.capture does
 * it); the next step then reads the mean of the sums instead of the gradients, clipping and
 * all, and starts a new window. Without accumulate calls a step reads the gradients as before.
 * A checkpoint saved inside a window (accumulated, not stepped) is refused: the sums are not
 * in it. lutra_optim_accumulated gives the micro-batches summed since the last step. */
LUTRA_API int lutra_optim_accumulate(lutra_optim *o);
LUTRA_API int lutra_optim_accumulated(const lutra_optim *o, int32_t *micro_batches);
LUTRA_API int lutra_optim_set_lr(lutra_optim *o, float lr); /* the base lr of the schedule */
LUTRA_API int lutra_optim_set_schedule(lutra_optim *o, const lutra_lr_schedule *s);
LUTRA_API int lutra_optim_set_max_grad_norm(lutra_optim *o, float max_grad_norm);
/* The lr the next step takes: the schedule at the device's step count (on cuda a synchronizing
 * read of the counter, so that a captured step's replays count). */
LUTRA_API int lutra_optim_lr(const lutra_optim *o, float *lr);
/* The gradient norm (before clipping) of the last step that computed one (max_grad_norm > 0);
 * 0 before that. On cuda a synchronizing read of device memory: for printing, not for
 * every step of a fast loop. */
LUTRA_API int lutra_optim_grad_norm(const lutra_optim *o, float *norm);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_TRAIN_H */
