/* src/core/codec.h against CUDA's own conversions (cuda_fp8.h, cuda_bf16.h, cuda_fp16.h), as
 * host code: every f32 bit pattern through the bf16 / f16 / E4M3 / E5M2 / E8M0 encoders, every
 * code through the decoders. The host functions are what the toolkit documents as the
 * conversions' results (the device instructions give the same), so a mismatch here is a place
 * where lutra's CPU reference and its kernels would disagree. Needs nvcc, not a GPU.
 *
 *   check_codecs [STRIDE]   f32 patterns 0, STRIDE, 2*STRIDE, ... (default 1: all 2^32)
 *
 * Prints each mismatch (the first few per conversion) and a summary; exits 1 on any. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" {
#include "core/codec.h"
}

namespace {

enum { BF16, F16, E4M3, E5M2, E8M0, NCONV };
const char *const names[NCONV] = {"bf16", "f16", "e4m3", "e5m2", "e8m0"};
const int shown_max = 8;

uint32_t ref_encode(int c, float f) {
  switch (c) {
  case BF16:
    return f32_to_bf16(f);
  case F16:
    return f32_to_f16(f);
  case E4M3:
    return f32_to_e4m3(f);
  case E5M2:
    return f32_to_e5m2(f);
  default:
    return f32_to_e8m0(f);
  }
}

/* the conversions lutra's kernels use: RNE, FP8 saturating to the largest finite value, E8M0
 * rounding up (TransformerEngine's float_to_e8m0 rounds toward +inf) */
uint32_t cuda_encode(int c, float f) {
  switch (c) {
  case BF16:
    return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(f)).x;
  case F16:
    return static_cast<__half_raw>(__float2half_rn(f)).x;
  case E4M3:
    return __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
  case E5M2:
    return __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2);
  default:
    return __nv_cvt_float_to_e8m0(f, __NV_SATFINITE, cudaRoundPosInf);
  }
}

long long mismatches[NCONV];

void report(const char *what, uint32_t in, uint32_t ref, uint32_t cuda, int c) {
  long long n;
#pragma omp atomic capture
  n = ++mismatches[c];
  if (n <= shown_max) {
#pragma omp critical
    std::printf("MISMATCH %-12s 0x%08X: lutra 0x%08X, cuda 0x%08X\n", what, in, ref, cuda);
  }
}

} // namespace

int main(int argc, char **argv) {
  const uint64_t stride = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : 1;
  if (stride == 0) {
    std::fprintf(stderr, "usage: %s [STRIDE >= 1]\n", argv[0]);
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();

  /* decodes: every code (E8M0 has no f32 decoder in CUDA; its bf16 one is exact for every
   * non-NaN code, so lutra's f32 value rounded to bf16 must be CUDA's bf16) */
  for (uint32_t h = 0; h < 0x10000u; h++) {
    __nv_bfloat16_raw b;
    b.x = (unsigned short)h;
    __half_raw hr;
    hr.x = (unsigned short)h;
    const uint32_t rb = f32_bits(bf16_to_f32((uint16_t)h)),
                   cb = f32_bits(__bfloat162float(__nv_bfloat16(b)));
    if (rb != cb) report("bf16 decode", h, rb, cb, BF16);
    const uint32_t rh = f32_bits(f16_to_f32((uint16_t)h)), ch = f32_bits(__half2float(__half(hr)));
    if (rh != ch) report("f16 decode", h, rh, ch, F16);
  }
  for (uint32_t c = 0; c < 0x100u; c++) {
    const __nv_fp8_storage_t s = (__nv_fp8_storage_t)c;
    const uint32_t r4 = f32_bits(e4m3_to_f32(c)),
                   c4 = f32_bits(__half2float(__half(__nv_cvt_fp8_to_halfraw(s, __NV_E4M3))));
    if (r4 != c4) report("e4m3 decode", c, r4, c4, E4M3);
    const uint32_t r5 = f32_bits(e5m2_to_f32(c)),
                   c5 = f32_bits(__half2float(__half(__nv_cvt_fp8_to_halfraw(s, __NV_E5M2))));
    if (r5 != c5) report("e5m2 decode", c, r5, c5, E5M2);
    const uint32_t r8 = f32_to_bf16(e8m0_to_f32(c)), c8 = __nv_cvt_e8m0_to_bf16raw(s).x;
    if (r8 != c8) report("e8m0 decode", c, r8, c8, E8M0);
  }

  /* encodes */
  const long long count = (long long)((0xFFFFFFFFull / stride) + 1);
  long long done = 0;
#pragma omp parallel for schedule(dynamic, 1 << 16) reduction(+ : done)
  for (long long i = 0; i < count; i++) {
    const uint32_t u = (uint32_t)((uint64_t)i * stride);
    const float f = bits_f32(u);
    for (int c = 0; c < NCONV; c++) {
      const uint32_t r = ref_encode(c, f), k = cuda_encode(c, f);
      if (r != k) {
        char what[24];
        std::snprintf(what, sizeof what, "%s encode", names[c]);
        report(what, u, r, k, c);
      }
    }
    done++;
  }

  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  long long total = 0;
  for (int c = 0; c < NCONV; c++) {
    std::printf("%-5s %lld mismatches\n", names[c], mismatches[c]);
    total += mismatches[c];
  }
  std::printf("check-codecs: %lld f32 patterns (stride %llu) and all 2^16 / 2^8 codes, "
              "%lld mismatches, %.1f s\n",
              done, (unsigned long long)stride, total, secs);
  return total ? 1 : 0;
}
