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

typedef struct lutra_optim_desc {
  int32_t kind;
  float lr;
  float momentum;     /* SGD */
  float weight_decay; /* SGD: L2 added to the gradient; AdamW: decoupled */
  float beta1, beta2, eps;
} lutra_optim_desc;

LUTRA_API void lutra_optim_defaults(int kind, lutra_optim_desc *d);
/* Collects the parameters of m (and its children) once. BF16 parameters get f32 masters. */
LUTRA_API int lutra_optim_new(const lutra_optim_desc *d, lutra_module *m, lutra_optim **out);
LUTRA_API int lutra_optim_unref(lutra_optim *o);
LUTRA_API int lutra_optim_destroy(lutra_optim *o);
/* AdamW on cuda keeps its step count (bias correction) in device memory and its kernel advances
 * it, so a CUDA graph that captured a step takes the next step at every replay; lr, betas, eps
 * and weight decay are captured by value (lutra_optim_set_lr does not reach a captured step). */
LUTRA_API int lutra_optim_step(lutra_optim *o);
LUTRA_API int lutra_optim_set_lr(lutra_optim *o, float lr);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_TRAIN_H */
