/* NVFP4's per-thread work (kernels/quantize/quantize_nvfp4.cu; lutra/nvfp4.h says what it
 * computes), as
 * __host__ __device__ functions so that spec/native/sim_nvfp4.cu can run them on the host against
 * the CPU backend. The scalar steps are src/core/fp4.h's own, the CPU backend's header compiled for
 * the device: E2M1 by its integer thresholds (the PTX cvt to e2m1 exists only on sm_100a, and
 * this way no architecture rounds differently), E4M3 by the hardware's conversion, f32 arithmetic
 * rounded as the CPU rounds (never contracted into FMAs). One thread handles one 1x16 block (or
 * one 16x16 tile): the copy's amax comes first, from a separate pass. */
#ifndef LUTRA_KERNELS_NVFP4_MATH_CUH
#define LUTRA_KERNELS_NVFP4_MATH_CUH

#include <float.h>
#include <string.h>

#include "common/elements.cuh"
#include "common/f32.cuh"
#include "core/fp4.h"

namespace lknv {

using lkc::fdiv;
using lkc::fmul;

constexpr int B = FP4_BLOCK;

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

/* a quantization's arguments as the kernels take them (the launcher's and
 * spec/native/sim_nvfp4.cu's); a copy without codes gets no scales either */
inline Args args_of(const lutra_quant_args &q) {
  Args a = {};
  a.x = q.x;
  a.x_dtype = q.x_dtype;
  a.rows = q.rows;
  a.cols = q.cols;
  a.data[0] = static_cast<uint8_t *>(q.data);
  a.data[1] = static_cast<uint8_t *>(q.col_data);
  a.scales[0] = q.data ? static_cast<uint8_t *>(q.scale_inv) : nullptr;
  a.scales[1] = q.col_data ? static_cast<uint8_t *>(q.col_scale_inv) : nullptr;
  a.opts = q.nvfp4;
  a.signs = q.rht_signs;
  a.seed = q.seed;
  a.skip = q.skip;
  return a;
}

/* where a copy's f32 words (decode scale, amax) sit behind its block scales */
LKC_HD int64_t tail_offset(int64_t lines, int64_t len) {
  return (lines * (len / B) + 15) / 16 * 16;
}

LKC_HD int64_t lines_of(const Args &a, int copy) {
  return copy ? a.cols : a.rows;
}
LKC_HD int64_t len_of(const Args &a, int copy) {
  return copy ? a.rows : a.cols;
}

/* block b of line l of a copy, as the CPU's read_block */
LKC_HD void read_block(const Args &a, int copy, int64_t l, int64_t b, float *v) {
  float raw[B];
  for (int i = 0; i < B; i++) {
    const int64_t k = b * B + i;
    raw[i] = lkc::ld_rt(a.x, a.x_dtype, copy ? k * a.cols + l : l * a.cols + k);
  }
  if (copy && (a.opts & LUTRA_NVFP4_RHT)) {
    fp4_rht16(raw, v, a.signs);
  } else {
    for (int i = 0; i < B; i++)
      v[i] = raw[i];
  }
}

LKC_HD float amax16(const float *v) {
  float m = 0.0f;
  for (int i = 0; i < B; i++)
    m = fmaxf(m, fabsf(v[i]));
  return m;
}

LKC_HD uint8_t encode(const Args &a, float v, uint64_t stream, int64_t idx) {
  if (a.opts & LUTRA_NVFP4_SR)
    return f32_to_e2m1_sr(v, fp4_random24(a.seed, stream, (uint64_t)idx));
  return f32_to_e2m1(v);
}

/* one 1x16 block of a copy, given the copy's global encode scale: its scale byte and 8 bytes of
 * codes */
LKC_HD void quantize_block(const Args &a, int copy, int64_t l, int64_t b, float ge) {
  float v[B];
  read_block(a, copy, l, b, v);
  const int64_t len = len_of(a, copy), nb = len / B;
  const uint8_t sc = fp4_block_scale(amax16(v), ge);
  const float enc = fp4_block_encode(sc, ge);
  a.scales[copy][l * nb + b] = sc;
  const uint64_t stream = copy ? FP4_COL_STREAM : 0;
  uint8_t packed[B / 2];
  for (int i = 0; i < B; i += 2) {
    const int64_t idx = l * len + b * B + i;
    const uint8_t lo = encode(a, fmul(v[i], enc), stream, idx);
    const uint8_t hi = encode(a, fmul(v[i + 1], enc), stream, idx + 1);
    packed[i / 2] = (uint8_t)(lo | hi << 4);
  }
  memcpy(a.data[copy] + (l * len + b * B) / 2, packed, sizeof packed);
}

LKC_HD void put_code(uint8_t *data, int64_t i, uint8_t code) {
  uint8_t *p = data + i / 2;
  *p = (i & 1) ? (uint8_t)((*p & 0x0Fu) | (code << 4)) : (uint8_t)((*p & 0xF0u) | code);
}

/* one 16x16 tile (2D): its scale into each of its rows' (and columns') entries, codes into both
 * copies. A thread owns its whole tile, so the nibble writes of put_code race with no one. */
LKC_HD void quantize_tile(const Args &a, int64_t ti, int64_t tj, float ge) {
  const int64_t rows = a.rows, cols = a.cols, rb = rows / B, cb = cols / B;
  float tmax = 0.0f;
  for (int64_t r = ti * B; r < (ti + 1) * B; r++)
    for (int64_t c = tj * B; c < (tj + 1) * B; c++)
      tmax = fmaxf(tmax, fabsf(lkc::ld_rt(a.x, a.x_dtype, r * cols + c)));
  const uint8_t sc = fp4_block_scale(tmax, ge);
  const float enc = fp4_block_encode(sc, ge);
  for (int64_t r = ti * B; r < (ti + 1) * B; r++) {
    if (a.scales[0]) a.scales[0][r * cb + tj] = sc;
    for (int64_t c = tj * B; c < (tj + 1) * B; c++) {
      if (a.scales[1] && r % B == 0) a.scales[1][c * rb + ti] = sc;
      const int64_t idx = r * cols + c;
      const uint8_t code = encode(a, fmul(lkc::ld_rt(a.x, a.x_dtype, idx), enc), 0, idx);
      if (a.data[0]) put_code(a.data[0], idx, code);
      if (a.data[1]) put_code(a.data[1], c * rows + r, code);
    }
  }
}

/* the 16 values of block b of row r of a stored copy [rows][cols], dequantized into out */
LKC_HD void dequant_block(const uint8_t *data, const uint8_t *scales, int64_t rows, int64_t cols,
                          int64_t r, int64_t b, void *out, int out_dtype) {
  float w[2];
  memcpy(w, scales + tail_offset(rows, cols), sizeof w);
  const float s = e4m3_to_f32(scales[r * (cols / B) + b]);
  for (int i = 0; i < B; i++) {
    const int64_t idx = r * cols + b * B + i;
    const uint32_t c = (data[idx / 2] >> ((idx & 1) * 4)) & 0x0Fu;
    lkc::st_rt(out, out_dtype, idx, fmul(fmul(e2m1_to_f32(c), s), w[0]));
  }
}

} // namespace lknv

#endif
