/* The per-tensor cast with a columnwise (transposed) output, through shared-memory tiles
 * (cast_transpose_16bit.cu's 128x128 or cast_transpose.cu's 64x64, which defines it): lk_cast
 * (quantize.cu) calls it when col_data is set. Arguments are checked by the caller. */
#ifndef LUTRA_KERNELS_QUANTIZE_CAST_TRANSPOSE_CUH
#define LUTRA_KERNELS_QUANTIZE_CAST_TRANSPOSE_CUH

#include <cuda_runtime.h>

#include "kernels.h"

namespace lkc {

cudaError_t cast_transpose(const lutra_quant_args *a, cudaStream_t s);

} // namespace lkc

#endif
