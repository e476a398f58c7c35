/* The CUDA backend's tensor operations (backend.h's axpby, copy_2d, rows_*; tensor_ops_cuda.c). */
#ifndef LUTRA_BACKEND_CUDA_TENSOR_OPS_CUDA_H
#define LUTRA_BACKEND_CUDA_TENSOR_OPS_CUDA_H

#include <stddef.h>
#include <stdint.h>

int lutra_cuda_axpby(const void *x, float alpha, const void *y, float beta, void *out, int dtype,
                     int64_t n);
int lutra_cuda_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                       int64_t height);
int lutra_cuda_rows_argmax(const void *x, int dtype, int64_t rows, int64_t cols, int32_t *ids);
int lutra_cuda_rows_softmax(const void *x, int dtype, int64_t rows, int64_t cols, float temperature,
                            void *out, int out_dtype);
int lutra_cuda_rows_sample(const void *x, int dtype, int64_t rows, int64_t cols, float temperature,
                           int top_k, uint64_t seed, int32_t *ids);

#endif
