/* lutra/tensor_ops.h: the tensor operations a block written in Lua needs (adds, scales, views
 * and selections of rows, argmax, softmax and seeded sampling for generation), on every backend.
 * Part of lutra.h (include that one; its conventions hold here).
 *
 * Every operation checks its tensors first (live, high precision, on one device, the shapes it
 * names) and changes nothing when it refuses. Outputs are given by the caller and reused: no
 * operation here allocates a buffer (a view allocates its shell only). Float math is f32 with one
 * rounding into a BF16 or F16 output. */
#ifndef LUTRA_TENSOR_OPS_H
#define LUTRA_TENSOR_OPS_H

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out = a + alpha * b element-wise (f32 math, rounded once into the dtype). a, b and out have
 * one float dtype (f32, bf16, f16), one device and one shape; out may be a or b (t += alpha * b:
 * out = a = t). */
LUTRA_API int lutra_add_scaled(const lutra_tensor *a, const lutra_tensor *b, float alpha,
                               lutra_tensor *out);
/* t = s * t element-wise (f32 math, rounded once). */
LUTRA_API int lutra_tensor_scale(lutra_tensor *t, float s);

/* A view of count rows of t's leading dim starting at first (0-based): the same memory, no copy,
 * shape {count, t's other dims}. The view holds a reference to t: t's buffer stays allocated while
 * the view lives, even after t was destroyed or its owner (a module) replaced it (the view then
 * reads the old buffer). t must be a high-precision tensor (not FP8). *out is a new tensor that
 * the caller unrefs. A view of a view reads the same buffer. */
LUTRA_API int lutra_tensor_view_rows(lutra_tensor *t, int64_t first, int64_t count,
                                     lutra_tensor **out);
/* Re-points view (one lutra_tensor_view_rows made) at rows [first, first + count) of t, in place:
 * the loop form of lutra_tensor_view_rows, with no allocation while the base stays the same. */
LUTRA_API int lutra_tensor_view_rows_into(lutra_tensor *view, lutra_tensor *t, int64_t first,
                                          int64_t count);
/* out = t with dim fixed at index (0-based), a copy: t {B, T, H} with dim 1 and index T - 1 gives
 * the last position of each sequence, out {B, H}. out has t's dtype and device and t's shape
 * without dim (a 1-dim t gives out {1}). */
LUTRA_API int lutra_tensor_select(const lutra_tensor *t, int dim, int64_t index, lutra_tensor *out);

/* ids[r] = the index of the largest value of row r of x (over the last dim; the first one on a
 * tie; NaNs ignored, a row of NaNs gives 0). ids is i32 with x's leading dims ({1} for a 1-dim x),
 * on x's device. */
LUTRA_API int lutra_argmax(const lutra_tensor *x, lutra_tensor *ids);
/* out = softmax(x / temperature) over the last dim, in f32 (the row sum accumulated in f64 on the
 * CPU, f32 on CUDA); out has x's shape and any float dtype; temperature > 0. */
LUTRA_API int lutra_softmax(const lutra_tensor *x, float temperature, lutra_tensor *out);
/* ids[r] = one draw from softmax(x[r] / temperature) over the last dim, after keeping only the
 * top_k largest logits of the row (top_k 0 or >= the row length: all; logits equal to the k-th
 * largest are all kept). Deterministic: the draw of row r uses a uniform number that is a fixed
 * function of (seed, r), the same on every backend; the CPU and CUDA sum the probabilities in
 * different orders, so a draw that falls within rounding of a boundary may differ between them.
 * temperature > 0 (greedy decoding is lutra_argmax); ids as for lutra_argmax. */
LUTRA_API int lutra_sample(const lutra_tensor *x, float temperature, int top_k, uint64_t seed,
                           lutra_tensor *ids);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_TENSOR_OPS_H */
