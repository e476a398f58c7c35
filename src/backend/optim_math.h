/* The scalar rules an optimizer step shares between the CPU backend and the CUDA kernels
 * (src/backend/cpu/optim_cpu.c, kernels/optim/): the scheduled learning rate of a step and the
 * global-norm clipping factor. One definition, compiled for the host and the device, rounded
 * alike on both (no contraction into fused multiply-adds on the device), so that a CUDA step
 * takes the lr and clipping factor the CPU takes. */
#ifndef LUTRA_BACKEND_OPTIM_MATH_H
#define LUTRA_BACKEND_OPTIM_MATH_H

#include "lutra.h"

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define LUTRA_OPTIM_HD __host__ __device__ static inline
#else
#define LUTRA_OPTIM_HD static inline
#endif

#if defined(__CUDA_ARCH__)
#define LUTRA_DADD(a, b) __dadd_rn((a), (b))
#define LUTRA_DMUL(a, b) __dmul_rn((a), (b))
#else
#define LUTRA_DADD(a, b) ((a) + (b))
#define LUTRA_DMUL(a, b) ((a) * (b))
#endif

/* The lr of 1-based step t (lutra/train.h's lutra_lr_schedule, which gives the formula). */
LUTRA_OPTIM_HD float lutra_lr_at(const lutra_lr_schedule *s, float base, int64_t t) {
  const int64_t i = t - 1, warmup = s->warmup_steps, total = s->total_steps;
  const double b = base, m = s->min_lr;
  if (i < warmup) return (float)(LUTRA_DMUL(b, (double)(i + 1)) / (double)warmup);
  if (s->kind == LUTRA_LR_CONSTANT) return base;
  if (i >= total) return s->min_lr;
  const double p = (double)(i - warmup) / (double)(total - warmup);
  double f; /* the fraction of (base - m) left at this step */
  if (s->kind == LUTRA_LR_WARMUP_COSINE)
    f = LUTRA_DMUL(0.5, LUTRA_DADD(1.0, cos(LUTRA_DMUL(3.141592653589793, p))));
  else
    f = LUTRA_DADD(1.0, -p);
  return (float)LUTRA_DADD(m, LUTRA_DMUL(LUTRA_DADD(b, -m), f));
}

/* The factor every gradient is scaled by, from the sum of squares of all gradients:
 * torch.nn.utils.clip_grad_norm_'s min(1, max_norm / (norm + 1e-6)) in f32 (a NaN norm gives
 * NaN, as torch's clamp keeps it; an infinite max_norm gives 1). */
LUTRA_OPTIM_HD float lutra_clip_factor(double sumsq, float max_norm) {
  const float norm = (float)sqrt(sumsq);
  const float coef = max_norm / (norm + 1e-6f);
  return coef >= 1.0f ? 1.0f : coef;
}

#endif
