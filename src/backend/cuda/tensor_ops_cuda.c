/* The tensor operations on CUDA (lutra/tensor_ops.h): kernels/tensor/tensor_ops.cu's launchers
 * on the thread's stream (so a lutra.graph capture records them), copy_2d as one
 * cudaMemcpy2DAsync. What the kernels cannot take is refused here with a message. */
#include "backend/tensor_ops_shared.h"
#include "cuda_backend.h"
#include "tensor/tensor_ops.h"

LUTRA_TENSOR_OPS_DECLARE(lutra_cuda);

#define LAUNCH(name, call) lutra_cuda_status((call), "lutra_cuda_" #name, "kernel " #name)

int lutra_cuda_axpby(const void *x, float alpha, const void *y, float beta, void *out, int dtype,
                     int64_t n) {
  return LAUNCH(axpby, lk_axpby(x, alpha, y, beta, out, dtype, n, lutra_cuda_stream()));
}

int lutra_cuda_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                       int64_t height) {
  if (height == 0 || width == 0) return LUTRA_OK;
  return lutra_cuda_status(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, (size_t)height,
                                             cudaMemcpyDeviceToDevice, lutra_cuda_stream()),
                           "lutra_cuda_copy_2d", "cudaMemcpy2DAsync");
}

static int check_rows(int64_t rows, const char *fn) {
  CHECK_ARG(rows <= 0x7FFFFFFF, "%lld rows: at most 2^31 - 1 (one block per row)", (long long)rows);
  return LUTRA_OK;
}

int lutra_cuda_rows_argmax(const void *x, int dtype, int64_t rows, int64_t cols, int32_t *ids) {
  TRY(check_rows(rows, "lutra_cuda_rows_argmax"));
  return LAUNCH(rows_argmax, lk_rows_argmax(x, dtype, rows, cols, ids, lutra_cuda_stream()));
}

int lutra_cuda_rows_softmax(const void *x, int dtype, int64_t rows, int64_t cols, float temperature,
                            void *out, int out_dtype) {
  TRY(check_rows(rows, "lutra_cuda_rows_softmax"));
  return LAUNCH(rows_softmax, lk_rows_softmax(x, dtype, rows, cols, temperature, out, out_dtype,
                                              lutra_cuda_stream()));
}

int lutra_cuda_rows_sample(const void *x, int dtype, int64_t rows, int64_t cols, float temperature,
                           int top_k, uint64_t seed, int32_t *ids) {
  TRY(check_rows(rows, "lutra_cuda_rows_sample"));
  return LAUNCH(rows_sample, lk_rows_sample(x, dtype, rows, cols, temperature, top_k, seed, ids,
                                            lutra_cuda_stream()));
}
