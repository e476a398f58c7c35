/* lutra/quantizer.h: quantizers and dequantization.
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_QUANTIZER_H
#define LUTRA_QUANTIZER_H

#include "recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- quantizers -------------------------------------------------------------------------- */
typedef struct lutra_quantizer lutra_quantizer;

/* A quantizer for one role of a recipe. rowwise/columnwise select the outputs. */
LUTRA_API int lutra_quantizer_new(const lutra_recipe *r, int role, int rowwise, int columnwise,
                                  int device, lutra_quantizer **out);
/* References: lutra_quantizer_new gives the caller one; a retain (of a quantizer a module owns,
 * too) takes another, which keeps the struct, not the state, so that calls after its owner
 * destroyed or rebuilt it fail with "was freed". Unref drops one of the caller's (the last frees
 * the quantizer); a module's quantizer that the caller never retained is refused. */
LUTRA_API void lutra_quantizer_retain(lutra_quantizer *q);
LUTRA_API int lutra_quantizer_unref(lutra_quantizer *q);
/* Frees the state now and keeps the struct, marked freed, until the last unref (refused for a
 * module's quantizer). */
LUTRA_API int lutra_quantizer_destroy(lutra_quantizer *q);
/* Quantize x into the quantizer's own output tensor (reused while the shape stays). */
LUTRA_API int lutra_quantize(lutra_quantizer *q, const lutra_tensor *x, lutra_tensor **out);
/* lutra_quantize that also writes the bias gradient of x: dbias[c] (+= when accumulate)
 * sum_r x[r, c] (x seen as [rows, cols]); fused into the quantization kernel on CUDA where it
 * writes a columnwise copy (TransformerEngine's quantize_dbias for grad_output). */
LUTRA_API int lutra_quantize_dbias(lutra_quantizer *q, const lutra_tensor *x, lutra_tensor *dbias,
                                   int accumulate, lutra_tensor **out);
/* lutra_quantize_dbias (dbias NULL: lutra_quantize) under a skip flag, TransformerEngine's noop
 * flag: skip is an i32 tensor of one element on the quantizer's device (NULL: never skip). When
 * it holds a nonzero value at the time the work runs (on CUDA: when the kernels run, so device
 * work queued before, or a change between replays of a CUDA graph, counts), the quantization
 * writes nothing at all: the output keeps its codes, scale_inv and amax, the quantizer its scale
 * and amax history, dbias its values. The output is reallocated (and then left unwritten) when
 * x's shape differs from the last call's. */
LUTRA_API int lutra_quantize_skip(lutra_quantizer *q, const lutra_tensor *x,
                                  const lutra_tensor *skip, lutra_tensor *dbias, int accumulate,
                                  lutra_tensor **out);
/* Delayed scaling: roll this quantizer's amax history and update its scale (one backend call). */
LUTRA_API int lutra_quantizer_update(lutra_quantizer *q);
/* Delayed/current scaling state, copied to the host. history may be NULL. */
LUTRA_API int lutra_quantizer_scale(const lutra_quantizer *q, float *scale, float *scale_inv);
LUTRA_API int lutra_quantizer_history(const lutra_quantizer *q, float *history, int len);
/* Delayed scaling: the length of the amax history. */
LUTRA_API int lutra_quantizer_history_len(const lutra_quantizer *q, int *len);
/* Delayed scaling: overwrite the most recent amax (history[0]), as a cast would record it. */
LUTRA_API int lutra_quantizer_record_amax(lutra_quantizer *q, float amax);
LUTRA_API int lutra_dequantize(const lutra_tensor *q, int columnwise, lutra_tensor *out);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_QUANTIZER_H */
