/* The tensor operations' kernels (kernels/tensor/tensor_ops.cu; backend.h's axpby and rows_*
 * entries say what each computes). Each returns the launch status; a bad argument is
 * cudaErrorInvalidValue (the CUDA backend checks them first, with a message). */
#ifndef LUTRA_KERNELS_TENSOR_OPS_H
#define LUTRA_KERNELS_TENSOR_OPS_H

#include <cuda_runtime.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

cudaError_t lk_axpby(const void *x, float alpha, const void *y, float beta, void *out, int dtype,
                     int64_t n, cudaStream_t s);
/* rows up to 2^31 - 1 (one block per row) */
cudaError_t lk_rows_argmax(const void *x, int dtype, int64_t rows, int64_t cols, int32_t *ids,
                           cudaStream_t s);
cudaError_t lk_rows_softmax(const void *x, int dtype, int64_t rows, int64_t cols, float temperature,
                            void *out, int out_dtype, cudaStream_t s);
cudaError_t lk_rows_sample(const void *x, int dtype, int64_t rows, int64_t cols, float temperature,
                           int top_k, uint64_t seed, int32_t *ids, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
