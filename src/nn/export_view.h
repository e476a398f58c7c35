/* What an exporter (io/onnx_export.c) reads of a module beyond the public getters: the options a
 * norm was made with, the FP8 weight a linear-like module's last forward used, and the chain a
 * LayerNormMLP runs. Read-only views; nothing here changes a module. */
#ifndef LUTRA_NN_EXPORT_VIEW_H
#define LUTRA_NN_EXPORT_VIEW_H

#include "lutra.h"

#include <stdbool.h>

/* the options of a LayerNorm or RMSNorm (nn/norm.c); false for any other kind */
bool lutra_norm_view(const lutra_module *m, lutra_norm_desc *out);
/* a LayerNormLinear's norm options and the FP8 weight its last forward used (NULL: none, or a
 * high-precision forward); false for any other kind (nn/linear/layernorm_linear.c) */
bool lutra_layernorm_linear_view(const lutra_module *m, lutra_norm_desc *norm,
                                 const lutra_tensor **fp8_weight);
/* a Linear's FP8 weight as above (nn/linear/linear.c); NULL for any other kind */
const lutra_tensor *lutra_linear_fp8_weight_view(const lutra_module *m);
/* the Sequential (LayerNormLinear, activation, Linear) a LayerNormMLP runs; NULL for any other
 * kind (nn/linear/layernorm_mlp.c) */
const lutra_module *lutra_layernorm_mlp_chain_view(const lutra_module *m);

#endif
