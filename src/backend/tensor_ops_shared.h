/* What the CPU and CUDA backends' tensor operations (backend.h's axpby, copy_2d, rows_*) share:
 * the declarations of their entries, and what makes both compute the same function (the
 * sampler's uniform draw per row, the order of floats as integers for the top-k threshold's
 * bisection). Plain C, compiled by nvcc too. */
#ifndef LUTRA_BACKEND_TENSOR_OPS_SHARED_H
#define LUTRA_BACKEND_TENSOR_OPS_SHARED_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Declares one backend's entries, prefix_axpby .. prefix_rows_sample (backend.h's signatures):
 * LUTRA_TENSOR_OPS_DECLARE(lutra_cpu) in the CPU backend, (lutra_cuda) in the CUDA one. */
#define LUTRA_TENSOR_OPS_DECLARE(prefix)                                                           \
  int prefix##_axpby(const void *x, float alpha, const void *y, float beta, void *out, int dtype,  \
                     int64_t n);                                                                   \
  int prefix##_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,     \
                       int64_t height);                                                            \
  int prefix##_rows_argmax(const void *x, int dtype, int64_t rows, int64_t cols, int32_t *ids);    \
  int prefix##_rows_softmax(const void *x, int dtype, int64_t rows, int64_t cols,                  \
                            float temperature, void *out, int out_dtype);                          \
  int prefix##_rows_sample(const void *x, int dtype, int64_t rows, int64_t cols,                   \
                           float temperature, int top_k, uint64_t seed, int32_t *ids)

#ifdef __CUDACC__
#define LUTRA_OPS_HD __host__ __device__ static inline
#else
#define LUTRA_OPS_HD static inline
#endif

/* The uniform number in [0, 1) that row r's draw uses: splitmix64 of (seed, row), its top 24
 * bits (exact in f32, so the same value on every backend). */
LUTRA_OPS_HD float lutra_sample_uniform(uint64_t seed, int64_t row) {
  uint64_t z = seed + (uint64_t)(row + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (float)(z >> 40) * (1.0f / 16777216.0f);
}

/* f32 bits mapped to unsigned integers of the same order (-inf smallest, +inf largest) */
LUTRA_OPS_HD uint32_t lutra_order_key(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

#endif
