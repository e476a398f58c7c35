/* lutra/tensor.h: tensors and the global seed generator.
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_TENSOR_H
#define LUTRA_TENSOR_H

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- tensors ---------------------------------------------------------------------------- */
/* Zero-filled (every dtype). Refused with LUTRA_EINVAL when a byte count overflows. */
LUTRA_API int lutra_tensor_new(int dtype, int ndim, const int64_t *shape, int device,
                               lutra_tensor **out);
/* Drops one of the caller's references: the one lutra_tensor_new (or any call that hands out a
 * new tensor) gave, or one lutra_tensor_retain took; the last reference frees the tensor. A
 * tensor owned by a module, quantizer or loss (LUTRA_TENSOR_BORROWED) stays readable while its
 * owner keeps it; a retain keeps its shell (not the buffers) beyond that, so that a later call
 * on it fails with "was freed" instead of reading freed memory (the Lua front takes one for
 * every such tensor it hands out). Unref of an owner's tensor that the caller never retained is
 * refused (LUTRA_ESTATE): the owner frees it. */
LUTRA_API void lutra_tensor_retain(lutra_tensor *t);
LUTRA_API int lutra_tensor_unref(lutra_tensor *t);
/* Frees the buffers now; the shell stays, marked LUTRA_TENSOR_FREED, until the last unref, so
 * later calls (a module that saved it as an input, too) fail with "was freed". Refused for an
 * owner's tensor. */
LUTRA_API int lutra_tensor_destroy(lutra_tensor *t);
/* Copy n values in or out, converting from/to f32 (FP8 tensors are dequantized on read). Every
 * value read out as a float (here, lutra_loss_value, lutra_tensor_amax, the quantizer's scales
 * and history) has its NaNs made the one quiet NaN 0x7FC00000: other payloads, widened to a
 * double, are LuaJIT's type tags (a NaN of 0xFFFFFFFF would reach Lua as nil). i32 tensors
 * (labels) are written and read with the _i32 pair. */
LUTRA_API int lutra_tensor_set_f32(lutra_tensor *t, const float *src, int64_t n);
LUTRA_API int lutra_tensor_get_f32(const lutra_tensor *t, float *dst, int64_t n);
LUTRA_API int lutra_tensor_set_i32(lutra_tensor *t, const int32_t *src, int64_t n);
LUTRA_API int lutra_tensor_get_i32(const lutra_tensor *t, int32_t *dst, int64_t n);
/* Raw bytes of the rowwise data (or of the columnwise copy when columnwise != 0). */
LUTRA_API int lutra_tensor_get_bytes(const lutra_tensor *t, int columnwise, void *dst,
                                     size_t bytes);
LUTRA_API int lutra_tensor_fill(lutra_tensor *t, float value);
/* Deterministic fills (xoshiro256**, Box-Muller), the same on every backend. */
/* The process-wide seed generator: lutra_seed_next hands out the next seed (splitmix64 of a
 * state that lutra_manual_seed sets; it starts from a fixed value, so unseeded runs repeat).
 * Fills and layers created without a seed of their own draw theirs from it. */
LUTRA_API int lutra_manual_seed(uint64_t seed);
LUTRA_API int lutra_seed_next(uint64_t *out);
LUTRA_API int lutra_tensor_randn(lutra_tensor *t, uint64_t seed, float mean, float stddev);
LUTRA_API int lutra_tensor_uniform(lutra_tensor *t, uint64_t seed, float lo, float hi);
LUTRA_API int lutra_tensor_copy(lutra_tensor *dst, const lutra_tensor *src); /* converts */
/* The same elements under a new shape, in place; refused for a tensor a module, quantizer or
 * loss owns (LUTRA_TENSOR_BORROWED: its next call needs the shape it gave it). */
LUTRA_API int lutra_tensor_reshape(lutra_tensor *t, int ndim, const int64_t *shape);
LUTRA_API int lutra_tensor_amax(const lutra_tensor *t, float *amax); /* host result */

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_TENSOR_H */
