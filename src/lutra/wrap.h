/* lutra/wrap.h: tensors over memory the caller owns (an engine's own buffers).
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_WRAP_H
#define LUTRA_WRAP_H

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A tensor over the caller's buffer: lutra reads and writes data in place and never frees it
 * (lutra_tensor_unref and lutra_tensor_destroy free only the tensor struct; the buffer must stay
 * valid until then, and until every module that took the tensor as an input ran its next
 * forward or was freed, as for any input). It is a plain tensor everywhere else: a module
 * input, a loss target, the destination (or source) of lutra_tensor_copy, which copies a
 * module's output into it with no allocation.
 *   data      host memory for LUTRA_CPU; device memory of the current device for LUTRA_CUDA
 *             (cudaMalloc, cudaMallocAsync, managed memory), written in lutra's stream order
 *   dtype     LUTRA_F32, LUTRA_BF16, LUTRA_F16 or LUTRA_I32 (FP8 tensors come from quantizers)
 *   shape     1..4 positive dims, dense row-major: element (i0, .., in) at the usual offset,
 *             no strides or padding (copy a strided view into a dense buffer first)
 *   bytes     the size of the buffer: at least the product of the dims times the dtype's size
 *             (the product's overflow is refused)
 *   alignment data a multiple of the dtype's size on LUTRA_CPU, of 256 bytes on LUTRA_CUDA
 *             (what cudaMalloc gives, and what cuBLASLt's algorithm choice assumes) */
LUTRA_API int lutra_tensor_wrap(void *data, int dtype, int ndim, const int64_t *shape, int device,
                                size_t bytes, lutra_tensor **out);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_WRAP_H */
