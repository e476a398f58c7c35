/* The rotary position embedding's launcher (kernels/rope/rope.cu; lutra_rope_args), called by
 * src/backend/cuda/rope_cuda.c: one launch on stream s, checked (cudaGetLastError), nothing
 * allocated or synchronized. Arguments lutra_rope_args_problem refuses give
 * cudaErrorInvalidValue. */
#ifndef LUTRA_KERNELS_ROPE_H
#define LUTRA_KERNELS_ROPE_H

#include <cuda_runtime.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

cudaError_t lk_rope(const lutra_rope_args *a, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
