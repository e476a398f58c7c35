/* The CPU backend's four-lane f32 loops (backend/cpu: ReLU, the GEMM's bias add), kept out of
 * cpu.h, which C++ and CUDA programs of spec/native include too. */
#ifndef LUTRA_BACKEND_CPU_SIMD_H
#define LUTRA_BACKEND_CPU_SIMD_H

#include <stdint.h>
#include <string.h>

/* Four f32 lanes (GCC's and Clang's vector extensions: SSE on x86-64, NEON on arm64) for the
 * element-wise f32 loops a small model's forward runs (a bias add, ReLU), which -O2 leaves
 * scalar: one at a time they cost several times the GEMM around them at 64x64. Loads and stores
 * through memcpy: no alignment is assumed. */
typedef float lutra_f32x4 __attribute__((vector_size(16)));
typedef int32_t lutra_i32x4 __attribute__((vector_size(16)));
static inline lutra_f32x4 lutra_f32x4_load(const float *p) {
  lutra_f32x4 v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void lutra_f32x4_store(float *p, lutra_f32x4 v) {
  memcpy(p, &v, sizeof v);
}

#endif
