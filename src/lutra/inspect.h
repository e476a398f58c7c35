/* lutra/inspect.h: looking inside modules: a Sequential's children, and the FP8 tensors a
 * Linear's last forward quantized (to check what an inference forward made).
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_INSPECT_H
#define LUTRA_INSPECT_H

#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* the number of modules in a Sequential */
LUTRA_API int lutra_sequential_count(const lutra_module *m, int *n);
/* module i (0-based) of a Sequential, with a reference of its own: drop it with
 * lutra_module_unref (the Sequential keeps its own reference) */
LUTRA_API int lutra_sequential_child(const lutra_module *m, int i, lutra_module **out);
/* The FP8 tensor a Linear's last forward quantized for role LUTRA_ROLE_INPUT (its input) or
 * LUTRA_ROLE_WEIGHT; *out NULL when that forward ran in high precision. Owned by the module
 * (its quantizer's buffer of that shape and layout). An inference forward (grad = 0) quantizes
 * no columnwise copies: their col_data is NULL. */
LUTRA_API int lutra_linear_quantized(const lutra_module *m, int role, lutra_tensor **out);

#ifdef __cplusplus
}
#endif

#endif
