/* NVFP4's per-thread work (kernels/quantize_nvfp4.cu; lutra/nvfp4.h says what it computes), as
 * __host__ __device__ functions so that tools/sim_nvfp4.cpp can run them on the host against the
 * CPU backend. Each mirrors src/core/fp4.h step for step: E2M1 by the same integer thresholds
 * (the PTX cvt to e2m1 exists only on sm_100a, and this way no architecture rounds differently),
 * E4M3 through cuda_fp8.h (tools/check_codecs.cu: equal to src/core/codec.h's), f32 arithmetic
 * through ops_common.cuh's _rn operations (never contracted into FMAs). One thread handles one
 * 1x16 block (or one 16x16 tile): the copy's amax comes first, from a separate pass. */
#ifndef LUTRA_KERNELS_NVFP4_MATH_CUH
#define LUTRA_KERNELS_NVFP4_MATH_CUH

#include <cuda_fp8.h>

#include <float.h>
#include <string.h>

#include "ops_common.cuh"

namespace lknv {

using lkops::fadd;
using lkops::fdiv;
using lkops::fmul;
using lkops::fsub;

constexpr int B = 16;
constexpr uint64_t GOLDEN = 0x9E3779B97F4A7C15ull;
constexpr uint64_t COL_STREAM = 0xD1B54A32D192ED03ull;

/* what a quantization needs (device pointers); copy 0 is the rowwise copy, 1 the columnwise */
struct Args {
  const void *x;
  int x_dtype;
  int64_t rows, cols;
  uint8_t *data[2];
  uint8_t *scales[2];
  int opts; /* LUTRA_NVFP4_* */
  uint32_t signs;
  uint64_t seed;
  const int32_t *skip;
};

LKOPS_HD uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
LKOPS_HD float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

LKOPS_HD uint8_t e2m1_rn(float f) {
  const uint32_t u = bits_of(f), mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return 0x7u;
  const uint8_t sign = (uint8_t)((u >> 28) & 0x8u);
  const float a = float_of(mag);
  uint8_t c;
  if (a <= 0.25f)
    c = 0;
  else if (a < 0.75f)
    c = 1;
  else if (a <= 1.25f)
    c = 2;
  else if (a < 1.75f)
    c = 3;
  else if (a <= 2.5f)
    c = 4;
  else if (a < 3.5f)
    c = 5;
  else if (a <= 5.0f)
    c = 6;
  else
    c = 7;
  return (uint8_t)(sign | c);
}

LKOPS_HD float grid(int c) {
  return c == 0   ? 0.0f
         : c == 1 ? 0.5f
         : c == 2 ? 1.0f
         : c == 3 ? 1.5f
         : c == 4 ? 2.0f
         : c == 5 ? 3.0f
         : c == 6 ? 4.0f
                  : 6.0f;
}

LKOPS_HD float e2m1_value(uint32_t c) {
  const float v = grid((int)(c & 7u));
  return (c & 8u) ? -v : v;
}

LKOPS_HD uint8_t e2m1_sr(float f, uint32_t r) {
  const uint32_t u = bits_of(f), mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return 0x7u;
  const uint8_t sign = (uint8_t)((u >> 28) & 0x8u);
  const float a = float_of(mag);
  if (a >= 6.0f) return (uint8_t)(sign | 7u);
  int lo = 0;
  while (lo < 6 && grid(lo + 1) <= a)
    lo++;
  const float frac = fdiv(fsub(a, grid(lo)), fsub(grid(lo + 1), grid(lo)));
  const float uf = fmul((float)r, 1.0f / 16777216.0f);
  return (uint8_t)(sign | (uf < frac ? lo + 1 : lo));
}

LKOPS_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
LKOPS_HD uint32_t random24(uint64_t seed, uint64_t stream, uint64_t index) {
  return (uint32_t)(mix64((seed ^ stream) + (index + 1) * GOLDEN) >> 40);
}

LKOPS_HD float global_encode(float amax) {
  float s = fdiv(448.0f * 6.0f, amax);
  if (s > FLT_MAX) s = FLT_MAX;
  if (amax == 0.0f || s == 0.0f) return 1.0f;
  return s;
}

LKOPS_HD uint8_t e4m3(float v) {
  return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}
/* E4M3 code -> f32, exact, as src/core/codec.h's e4m3_to_f32 */
LKOPS_HD float e4m3_value(uint32_t c) {
  c &= 0xFFu;
  if ((c & 0x7Fu) == 0x7Fu) return float_of(0x7FFFFFFFu);
  const uint32_t sign = (c & 0x80u) << 24, e = (c & 0x7Fu) >> 3, m = c & 7u;
  if (e == 0) {
    const float v = fmul(float_of((uint32_t)(127 - 9) << 23), (float)m);
    return sign ? -v : v;
  }
  return float_of(sign | ((e + 120u) << 23) | (m << 20));
}

LKOPS_HD uint8_t block_scale(float block_amax, float ge) {
  return e4m3(fminf(fmul(block_amax, fmul(ge, 1.0f / 6.0f)), FLT_MAX));
}
LKOPS_HD float block_encode(uint8_t sc, float ge) {
  return fminf(fdiv(1.0f, fmul(e4m3_value(sc), fdiv(1.0f, ge))), FLT_MAX);
}

/* popcount parity of i & j, for the Sylvester Hadamard matrix */
LKOPS_HD bool odd(int v) {
  v ^= v >> 2;
  v ^= v >> 1;
  return (v & 1) != 0;
}

LKOPS_HD void rht16(const float *x, float *y, uint32_t signs) {
  float t[B];
  for (int i = 0; i < B; i++)
    t[i] = (signs >> i & 1u) ? -x[i] : x[i];
  for (int j = 0; j < B; j++) {
    float acc = 0.0f;
    for (int i = 0; i < B; i++)
      acc = odd(i & j) ? fsub(acc, t[i]) : fadd(acc, t[i]);
    y[j] = fmul(acc, 0.25f);
  }
}

/* where a copy's f32 words (decode scale, amax) sit behind its block scales */
LKOPS_HD int64_t tail_offset(int64_t lines, int64_t len) {
  return (lines * (len / B) + 15) / 16 * 16;
}

LKOPS_HD int64_t lines_of(const Args &a, int copy) {
  return copy ? a.cols : a.rows;
}
LKOPS_HD int64_t len_of(const Args &a, int copy) {
  return copy ? a.rows : a.cols;
}

/* block b of line l of a copy, as the CPU's read_block */
LKOPS_HD void read_block(const Args &a, int copy, int64_t l, int64_t b, float *v) {
  float raw[B];
  for (int i = 0; i < B; i++) {
    const int64_t k = b * B + i;
    raw[i] = lkops::ld_rt(a.x, a.x_dtype, copy ? k * a.cols + l : l * a.cols + k);
  }
  if (copy && (a.opts & LUTRA_NVFP4_RHT)) {
    rht16(raw, v, a.signs);
  } else {
    for (int i = 0; i < B; i++)
      v[i] = raw[i];
  }
}

LKOPS_HD float amax16(const float *v) {
  float m = 0.0f;
  for (int i = 0; i < B; i++)
    m = fmaxf(m, fabsf(v[i]));
  return m;
}

LKOPS_HD uint8_t encode(const Args &a, float v, uint64_t stream, int64_t idx) {
  if (a.opts & LUTRA_NVFP4_SR) return e2m1_sr(v, random24(a.seed, stream, (uint64_t)idx));
  return e2m1_rn(v);
}

/* one 1x16 block of a copy, given the copy's global encode scale: its scale byte and 8 bytes of
 * codes */
LKOPS_HD void quantize_block(const Args &a, int copy, int64_t l, int64_t b, float ge) {
  float v[B];
  read_block(a, copy, l, b, v);
  const int64_t len = len_of(a, copy), nb = len / B;
  const uint8_t sc = block_scale(amax16(v), ge);
  const float enc = block_encode(sc, ge);
  a.scales[copy][l * nb + b] = sc;
  const uint64_t stream = copy ? COL_STREAM : 0;
  uint8_t packed[B / 2];
  for (int i = 0; i < B; i += 2) {
    const int64_t idx = l * len + b * B + i;
    const uint8_t lo = encode(a, fmul(v[i], enc), stream, idx);
    const uint8_t hi = encode(a, fmul(v[i + 1], enc), stream, idx + 1);
    packed[i / 2] = (uint8_t)(lo | hi << 4);
  }
  memcpy(a.data[copy] + (l * len + b * B) / 2, packed, sizeof packed);
}

LKOPS_HD void put_code(uint8_t *data, int64_t i, uint8_t code) {
  uint8_t *p = data + i / 2;
  *p = (i & 1) ? (uint8_t)((*p & 0x0Fu) | (code << 4)) : (uint8_t)((*p & 0xF0u) | code);
}

/* one 16x16 tile (2D): its scale into each of its rows' (and columns') entries, codes into both
 * copies. A thread owns its whole tile, so the nibble writes of put_code race with no one. */
LKOPS_HD void quantize_tile(const Args &a, int64_t ti, int64_t tj, float ge) {
  const int64_t rows = a.rows, cols = a.cols, rb = rows / B, cb = cols / B;
  float tmax = 0.0f;
  for (int64_t r = ti * B; r < (ti + 1) * B; r++)
    for (int64_t c = tj * B; c < (tj + 1) * B; c++)
      tmax = fmaxf(tmax, fabsf(lkops::ld_rt(a.x, a.x_dtype, r * cols + c)));
  const uint8_t sc = block_scale(tmax, ge);
  const float enc = block_encode(sc, ge);
  for (int64_t r = ti * B; r < (ti + 1) * B; r++) {
    if (a.scales[0]) a.scales[0][r * cb + tj] = sc;
    for (int64_t c = tj * B; c < (tj + 1) * B; c++) {
      if (a.scales[1] && r % B == 0) a.scales[1][c * rb + ti] = sc;
      const int64_t idx = r * cols + c;
      const uint8_t code = encode(a, fmul(lkops::ld_rt(a.x, a.x_dtype, idx), enc), 0, idx);
      if (a.data[0]) put_code(a.data[0], idx, code);
      if (a.data[1]) put_code(a.data[1], c * rows + r, code);
    }
  }
}

/* the 16 values of block b of row r of a stored copy [rows][cols], dequantized into out */
LKOPS_HD void dequant_block(const uint8_t *data, const uint8_t *scales, int64_t rows, int64_t cols,
                            int64_t r, int64_t b, void *out, int out_dtype) {
  float w[2];
  memcpy(w, scales + tail_offset(rows, cols), sizeof w);
  const float s = e4m3_value(scales[r * (cols / B) + b]);
  for (int i = 0; i < B; i++) {
    const int64_t idx = r * cols + b * B + i;
    const uint32_t c = (data[idx / 2] >> ((idx & 1) * 4)) & 0x0Fu;
    lkops::st_rt(out, out_dtype, idx, fmul(fmul(e2m1_value(c), s), w[0]));
  }
}

} // namespace lknv

#endif
