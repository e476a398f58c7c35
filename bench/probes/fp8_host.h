/* Host-side E4M3 operands for the cuBLASLt probes (probe_block_gemm.cu, probe_rowwise.cu): a
 * fixed-seed xorshift generator, so that a run repeats exactly, and random finite E4M3 codes
 * within a magnitude range, so that the FP64 reference sums stay well inside f32. */
#ifndef LUTRA_BENCH_PROBES_FP8_HOST_H
#define LUTRA_BENCH_PROBES_FP8_HOST_H

#include <cuda_fp8.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

static uint64_t probe_rng = 88172645463325252ull;
static inline uint32_t next_u32(void) {
  probe_rng ^= probe_rng << 13;
  probe_rng ^= probe_rng >> 7;
  probe_rng ^= probe_rng << 17;
  return (uint32_t)probe_rng;
}

static inline float e4m3_value(uint8_t c) {
  __nv_fp8_e4m3 v;
  memcpy(&v, &c, 1);
  return (float)v;
}

/* a random E4M3 code whose value is finite (E4M3 has NaN, no infinity) with min_abs <= |v| <=
 * max_abs */
static inline uint8_t random_code(float min_abs, float max_abs) {
  for (;;) {
    uint8_t c = (uint8_t)next_u32();
    float v = fabsf(e4m3_value(c));
    if (v == v && v >= min_abs && v <= max_abs) return c;
  }
}

#endif
