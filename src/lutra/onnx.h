/* lutra/onnx.h: exporting a module tree as an ONNX model, for inference in an engine's ONNX
 * runtime (ONNX Runtime, Unity Sentis, Unreal NNE). Part of lutra.h (include that one; its
 * conventions hold here). */
#ifndef LUTRA_ONNX_H
#define LUTRA_ONNX_H

#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The exported model: one f32 input and one f32 output, the tree's forward as ONNX operators,
 * every parameter an f32 initializer (BF16 ones widened; a linear-like module whose last forward
 * ran in FP8 exported with that FP8 weight dequantized, which the model's metadata_props say:
 * "lutra.weights" and "lutra.fp8_scaling"). Supported kinds: sequential, linear, layernorm,
 * rmsnorm, layernorm_linear, layernorm_mlp, residual and every activation; another kind anywhere
 * in the tree is refused (LUTRA_EINVAL naming it and its place) before anything is written.
 * Operators (the default ONNX domain): MatMul + Add for a Linear (its weight [out, in] stored
 * transposed), LayerNormalization for LayerNorm, RMSNorm decomposed (ReduceMean, Sqrt, Div),
 * the activations decomposed (Erf, Tanh, Sigmoid, Relu, Split for the gated ones), Add for a
 * Residual. The file is written to a temporary beside path and renamed over it. */
typedef struct lutra_onnx_options {
  int32_t opset; /* the ONNX opset: 17 (default, the first with LayerNormalization) to 21 */
  int32_t ndim;  /* the input's rank, 1..LUTRA_MAX_DIMS (default 2: [batch, features]) */
  /* the input's shape; a dim <= 0 is dynamic (named "batch" for dim 0, "d<i>" after), the last
   * (the features) must be given. Default {0, 0, 0, 0}: set the features. */
  int64_t input_shape[LUTRA_MAX_DIMS];
  const char *input_name;  /* default "input" */
  const char *output_name; /* default "output" */
} lutra_onnx_options;
LUTRA_API void lutra_onnx_defaults(lutra_onnx_options *o);
/* 1 when this library was built with ONNX export (Makefile: ONNX, on where protoc-c and
 * protobuf-c's header were found); without it lutra_export_onnx refuses (LUTRA_EUNSUPPORTED). */
LUTRA_API int lutra_onnx_available(void);
LUTRA_API int lutra_export_onnx(const lutra_module *m, const char *path,
                                const lutra_onnx_options *o);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_ONNX_H */
