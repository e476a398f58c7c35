/* The backend's norm arguments (backend/backend.h's layernorm_forward / _backward and
 * norm_quantize entries). */
#ifndef LUTRA_BACKEND_ARGS_NORM_H
#define LUTRA_BACKEND_ARGS_NORM_H

#include "backend/args_quantize.h"

LUTRA_ARGS_NO_PADDING_BEGIN
/* ---- norms (LayerNorm, RMSNorm; src/backend/cpu/norm_cpu.c, kernels/norm.cu) ----
 * Over the last dim of x [rows, hidden], statistics in f32 (f32 sums in one fixed order):
 *   LayerNorm  y = (x - mean) * rstd * g + beta,  rstd = 1 / sqrt(var + eps)  (biased var)
 *   RMSNorm    y = x * rstd * g,                  rstd = 1 / sqrt(mean(x^2) + eps)
 * with g = gamma, or gamma + 1 when zero_centered_gamma (TransformerEngine's: the stored weight
 * is gamma - 1). x, y, dy and dx have dtype; gamma, beta, dgamma and dbeta param_dtype. */
typedef struct lutra_norm_args {
  const void *x;     /* [rows, hidden] */
  const void *gamma; /* [hidden] */
  const void *beta;  /* [hidden]; LayerNorm only (RMSNorm ignores it) */
  int32_t dtype, param_dtype;
  int64_t rows, hidden;
  float eps;
  int32_t rms;                 /* 1: RMSNorm (no mean, no beta) */
  int32_t zero_centered_gamma; /* 1: g = gamma + 1 */
  int32_t pad;
  /* forward writes y, and mean (LayerNorm) and rstd [rows] f32 when not NULL; backward reads
   * the mean and rstd of that forward */
  void *y;
  float *mean, *rstd;
  /* backward: dx [rows, hidden] (may be NULL: not wanted), dgamma and dbeta [hidden] (dbeta
   * NULL for RMSNorm), overwritten; the column sums are deterministic (a fixed order) */
  const void *dy;
  void *dx, *dgamma, *dbeta;
  /* backward: [rows, hidden] in dtype, added to dx in f32 before its one rounding (the gradient
   * of a residual around the norm's module); NULL: none */
  const void *dx_add;
} lutra_norm_args;

/* ---- the norm writing a GEMM's FP8 input (src/backend/cpu/norm_quantize_cpu.c,
 * kernels/norm_quantize.cu; TransformerEngine's layernorm_fwd with an FP8 output) ----
 * The norm of norm (its y may be NULL: no high-precision output) is rounded into norm.dtype,
 * exactly as layernorm_forward stores it, and that value is quantized as the quantizer of
 * quant.scaling would quantize the stored y: the codes, scales and amax equal those of
 * layernorm_forward followed by cast / quantize_mxfp8 / quantize_block (block_dim 1) on its y.
 * quant.x, x_dtype, rows, cols, act, dbias* are ignored (the input is norm's). Per-tensor:
 *   delayed  (current 0) quant.scale is read, *quant.amax max-accumulates max|y|: one pass;
 *   current  (current 1) *quant.amax = max|y| and *quant.scale from it (fp8_max,
 *            quant.power_2_scale, quant.amax_epsilon; TE's compute_scale_from_amax), then the
 *            cast with that scale: the scale depends on every row's output, so the norm runs
 *            twice (CUDA: two launches; work: 2 words of backend memory, zero on entry, left
 *            zero, as current_scale's).
 * MXFP8 needs hidden % 32 == 0 (and rows % 32 for the columnwise copy); BLOCK_1D is 1x128
 * blocks (quant.block_dim is ignored). quant.skip as for the quantizers: nothing is written. */
typedef struct lutra_norm_quant_args {
  lutra_norm_args norm;
  lutra_quant_args quant;
  int32_t scaling; /* LUTRA_SCALING_TENSOR, LUTRA_SCALING_MXFP8 or LUTRA_SCALING_BLOCK_1D */
  int32_t current; /* TENSOR: 1 for current scaling */
  float fp8_max;   /* current scaling */
  int32_t pad;
  uint32_t *work; /* current scaling */
} lutra_norm_quant_args;
LUTRA_ARGS_NO_PADDING_END

#endif
