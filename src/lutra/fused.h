/* lutra/fused.h: the norm-fused modules (TransformerEngine's LayerNormLinear and LayerNormMLP)
 * and the norm that writes a quantizer's FP8 output directly.
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_FUSED_H
#define LUTRA_FUSED_H

#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { LUTRA_NORM_LAYERNORM = 0, LUTRA_NORM_RMSNORM = 1 };

/* The norm of x [.., hidden] (LayerNorm, or RMSNorm when rms: beta is then ignored and may be
 * NULL) with gamma and beta [hidden] (f32 or bf16), written straight into q's output, FP8
 * (rowwise and/or columnwise, as q was made), with the amax fused: TransformerEngine's
 * layernorm_fwd with an FP8 output. The codes, scales and amax are those of lutra_quantize on
 * the norm's output stored in x's dtype (one pass over x; per-tensor current scaling: two,
 * since the scale needs the amax of every row first). y, when not NULL (x's dtype and shape),
 * gets that high-precision output too. q: per-tensor delayed or current scaling, MXFP8 or 1x128
 * blocks (128x128 tiles: LUTRA_EINVAL). */
LUTRA_API int lutra_norm_quantize(lutra_quantizer *q, const lutra_tensor *x,
                                  const lutra_tensor *gamma, const lutra_tensor *beta, float eps,
                                  int rms, int zero_centered_gamma, lutra_tensor *y,
                                  lutra_tensor **out);

/* LayerNormLinear: y = norm(x) W^T + b. Under an enabled FP8 autocast scope whose input scaling
 * allows it (all but 128x128 tiles), the norm writes the GEMM's FP8 input (and its columnwise
 * copy for the wgrad) in the same pass; the high-precision norm output is then only written
 * when return_layernorm_output asks for it (lutra_layernorm_linear_ln_output). Parameters, in
 * order: the norm's weight (and LayerNorm's bias) [in], the Linear's weight [out, in] (and bias
 * [out]); main_grad buffers exist for the Linear's (the norm's gradients are small and are
 * overwritten each backward, as nn.LayerNorm's). */
typedef struct lutra_layernorm_linear_desc {
  int64_t in_features;
  int64_t out_features;
  int32_t normalization;           /* LUTRA_NORM_LAYERNORM (default) or LUTRA_NORM_RMSNORM */
  int32_t bias;                    /* the Linear's bias, default 1 */
  int32_t return_layernorm_output; /* keep the norm's output readable; default 0 */
  int32_t zero_centered_gamma;     /* default 0 */
  float eps;                       /* default 1e-5 */
  int32_t dtype;                   /* F32 (default) or BF16 */
  int32_t device;                  /* LUTRA_CPU (default) */
  int32_t accumulate_main_grad;
  uint64_t seed; /* the Linear's weights (see lutra_linear_desc) */
} lutra_layernorm_linear_desc;
LUTRA_API void lutra_layernorm_linear_defaults(lutra_layernorm_linear_desc *d);
LUTRA_API int lutra_layernorm_linear_new(const lutra_layernorm_linear_desc *d, lutra_module **out);
/* The norm's output of the last forward (owned by the module); refused unless the module was
 * made with return_layernorm_output. Its gradient does not flow back: it is a read-only view. */
LUTRA_API int lutra_layernorm_linear_ln_output(const lutra_module *m, lutra_tensor **out);
/* *fused = 1 when the last forward's norm wrote the GEMM's FP8 input itself. */
LUTRA_API int lutra_layernorm_linear_fused(const lutra_module *m, int *fused);

/* LayerNormMLP: norm -> FC1 -> activation -> FC2, a LayerNormLinear(hidden, ffn_hidden, or
 * 2 ffn_hidden for gated activations), an activation module and a Linear(ffn_hidden, hidden)
 * joined through the fusion protocol (the tanh GELU runs in FC1's GEMM epilogue). Parameters:
 * the LayerNormLinear's, then FC2's weight (and bias). */
typedef struct lutra_layernorm_mlp_desc {
  int64_t hidden;
  int64_t ffn_hidden;
  int32_t normalization; /* LUTRA_NORM_* */
  int32_t activation;    /* LUTRA_ACTIVATION_* (default GELU_TANH) */
  int32_t bias;          /* both Linears' biases, default 1 */
  int32_t zero_centered_gamma;
  float eps;
  int32_t dtype;
  int32_t device;
  int32_t accumulate_main_grad;
  uint64_t seed; /* FC1's weights; FC2's from seed + 1 */
} lutra_layernorm_mlp_desc;
LUTRA_API void lutra_layernorm_mlp_defaults(lutra_layernorm_mlp_desc *d);
LUTRA_API int lutra_layernorm_mlp_new(const lutra_layernorm_mlp_desc *d, lutra_module **out);
/* Linear+activation pairs its last forward and backward fused (lutra_sequential_fusions). */
LUTRA_API int lutra_layernorm_mlp_fusions(const lutra_module *m, int *forward, int *backward);

/* Residual: y = x + m(x) (m's output must have x's dtype and shape); backward: dx = dy + m's
 * input gradient. It holds a reference to m; its parameters are m's. The sums are made by m's
 * last kernel where m has one that can (a Linear's, LayerNormMLP's or MultiheadAttention's
 * forward GEMM takes x as its epilogue's C; the backward kernel of a norm or of a
 * LayerNorm-first module's norm, or the dgrad GEMM of a Linear-first one, adds dy), in f32 and
 * rounded once, else by an element-wise sum after m. */
LUTRA_API int lutra_residual_new(lutra_module *m, lutra_module **out);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_FUSED_H */
