/* Gradient accumulation for an optimizer (lutra_optim_accumulate): f32 sums of each parameter's
 * gradients over the micro-batches since the last step, turned into their mean by the step. */
#ifndef LUTRA_OPTIM_GRAD_ACCUM_H
#define LUTRA_OPTIM_GRAD_ACCUM_H

#include "backend/backend.h"

typedef struct lutra_grad_accum {
  const lutra_backend *be;
  int32_t count;         /* parameters; 0 until the first add (nothing allocated before) */
  int32_t micro_batches; /* gradients summed since the last step */
  float **sum;           /* [count] f32 sums, backend memory */
  const void **grad;     /* [count] = sum, typed as lutra_optim_args.grad: what a step reads */
  int32_t *dtype;        /* [count] LUTRA_F32 */
  float *scratch;        /* a non-f32 gradient converted, the largest parameter's size */
} lutra_grad_accum;

/* Adds every gradient of a into the sums (the first of a window converts instead of adding),
 * allocating them at the first call (so the first call cannot be inside a CUDA graph capture:
 * the allocation refuses there). */
int lutra_grad_accum_add(lutra_grad_accum *g, const lutra_optim_args *a, const char *fn);
/* The sums divided by the number of micro-batches, in place (before the step reads them). */
int lutra_grad_accum_mean(lutra_grad_accum *g, const lutra_optim_args *a);
void lutra_grad_accum_free(lutra_grad_accum *g);

#endif
