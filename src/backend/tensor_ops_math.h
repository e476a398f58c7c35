/* What the CPU and CUDA backends' tensor operations (backend.h's rows_sample, rows_argmax) share,
 * so that both compute the same function: the sampler's uniform draw per row and the order of
 * floats as integers (the top-k threshold's bisection). Plain C, compiled by nvcc too. */
#ifndef LUTRA_BACKEND_TENSOR_OPS_MATH_H
#define LUTRA_BACKEND_TENSOR_OPS_MATH_H

#include <stdint.h>
#include <string.h>

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
