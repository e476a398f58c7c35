/* src/core/fp4.h against CUDA's own FP4 conversions (cuda_fp4.h), as host code: the E2M1
 * encoder over every f32 bit pattern (or every STRIDE-th) and every bf16 pattern, the decoder
 * over every code, the packing of two codes per byte (__nv_fp4x2: element 0 in the low nibble),
 * and NVFP4's block scale step (E4M3 through cuda_fp8.h) over a sweep of block amaxes. On sm_90
 * the device conversions are these same functions (the PTX cvt to e2m1 needs sm_100a), so a
 * mismatch here is a place where the CPU reference and kernels/quantize/quantize_nvfp4.cu would
 * disagree. Needs nvcc (built as host code: nvcc -x cu), not a GPU.
 *
 *   check_fp4 [STRIDE]   f32 patterns 0, STRIDE, 2*STRIDE, ... (default 1: all 2^32)
 *
 * Prints the first mismatches per check and a summary; exits 1 on any. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" {
#include "core/fp4.h"
}

namespace {

const int shown_max = 8;
long long mismatches = 0;

void report(const char *what, unsigned long long in, unsigned got, unsigned want, int *shown) {
#pragma omp critical
  {
    mismatches++;
    if ((*shown)++ < shown_max)
      std::printf("%s: input 0x%llx: lutra 0x%x, cuda 0x%x\n", what, in, got, want);
  }
}

float f32_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

unsigned cuda_e2m1(float f) {
  return __nv_cvt_float_to_fp4(f, __NV_E2M1, cudaRoundNearest);
}

float cuda_e2m1_decode(unsigned c) {
  __half_raw h = __nv_cvt_fp4_to_halfraw((__nv_fp4_storage_t)c, __NV_E2M1);
  return __half2float(__half(h));
}

} // namespace

int main(int argc, char **argv) {
  const unsigned long long stride = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
  if (stride == 0) {
    std::fprintf(stderr, "check_fp4: STRIDE must be positive\n");
    return 2;
  }
  long long f32_count = 0;
  int shown_f32 = 0, shown_bf16 = 0, shown_dec = 0, shown_pack = 0, shown_scale = 0;
#pragma omp parallel for reduction(+ : f32_count) schedule(static, 65536)
  for (long long i = 0; i < (1LL << 32); i += (long long)stride) {
    const float f = f32_of((uint32_t)i);
    const unsigned got = f32_to_e2m1(f), want = cuda_e2m1(f);
    if (got != want) report("e2m1 from f32", (unsigned long long)i, got, want, &shown_f32);
    f32_count++;
  }
  /* every bf16 pattern, as the kernels read bf16 inputs (widened to f32 first) */
  for (uint32_t b = 0; b < 65536; b++) {
    __nv_bfloat16_raw raw;
    raw.x = (unsigned short)b;
    const unsigned want = __nv_cvt_bfloat16raw_to_fp4(raw, __NV_E2M1, cudaRoundNearest);
    const unsigned got = f32_to_e2m1(bf16_to_f32((uint16_t)b));
    if (got != want) report("e2m1 from bf16", b, got, want, &shown_bf16);
  }
  /* every code; NaN-free, so the values compare exactly */
  for (unsigned c = 0; c < 16; c++) {
    const float got = e2m1_to_f32(c), want = cuda_e2m1_decode(c);
    if (std::memcmp(&got, &want, sizeof got) != 0)
      report("e2m1 decode", c, f32_bits(got), f32_bits(want), &shown_dec);
  }
  /* packing: element 0 of a pair in the low nibble, as __nv_cvt_float2_to_fp4x2 stores x.x */
  const float probe[] = {0.0f, -0.0f, 0.3f, -0.75f, 1.25f, 1.75f, -2.5f, 3.5f, 5.0f, -6.5f};
  const int np = sizeof probe / sizeof *probe;
  for (int a = 0; a < np; a++)
    for (int b = 0; b < np; b++) {
      float2 v;
      v.x = probe[a];
      v.y = probe[b];
      const unsigned want = __nv_cvt_float2_to_fp4x2(v, __NV_E2M1, cudaRoundNearest);
      const unsigned got = (unsigned)(f32_to_e2m1(v.x) | (f32_to_e2m1(v.y) << 4));
      if (got != want)
        report("fp4x2 packing", (unsigned long long)(a * np + b), got, want, &shown_pack);
    }
  /* the block scale: e4m3(block_amax * (global_encode / 6)) through cuda_fp8.h, over amaxes
   * spanning E4M3's range (subnormals, ties, saturation) for a few global scales */
  const float globals[] = {1.0f, 2688.0f, 0.37f, 1.0e-20f, 3.0e30f};
  long long scale_count = 0;
  for (float g : globals)
    for (uint32_t u = 0x30000000u; u < 0x48000000u; u += 4099u) {
      const float amax = f32_of(u);
      const float s = amax * (g * (1.0f / 6.0f));
      const unsigned want =
          __nv_cvt_float_to_fp8(std::fmin(s, 3.402823466e38f), __NV_SATFINITE, __NV_E4M3);
      const unsigned got = fp4_block_scale(amax, g);
      if (got != want) report("block scale", u, got, want, &shown_scale);
      scale_count++;
    }
  std::printf("check-fp4: %lld f32 patterns (stride %llu), 65536 bf16, 16 codes, %d pairs, %lld "
              "block scales: %lld mismatches, %s\n",
              f32_count, stride, np * np, scale_count, mismatches, mismatches ? "FAIL" : "ok");
  return mismatches ? 1 : 0;
}
