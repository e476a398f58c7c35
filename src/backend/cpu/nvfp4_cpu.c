/* NVFP4 on the CPU backend (lutra/nvfp4.h): the reference kernels/quantize_nvfp4.cu matches byte
 * for byte. Every value goes through core/fp4.h's f32 steps in a fixed order; the two passes
 * (the copy's amax, then the blocks) recompute the RHT rather than keeping a transformed copy, so
 * nothing is allocated. */
#include "core/fp4.h"
#include "cpu.h"

#include <math.h>
#include <string.h>

static inline float load_x(const void *x, int dtype, int64_t i) {
  if (dtype == LUTRA_F32) return ((const float *)x)[i];
  return lutra_elem_load(x, dtype, i);
}

static inline void put_code(uint8_t *data, int64_t i, uint8_t code) {
  uint8_t *b = data + i / 2;
  *b = (i & 1) ? (uint8_t)((*b & 0x0Fu) | (code << 4)) : (uint8_t)((*b & 0xF0u) | code);
}

static inline uint8_t get_code(const uint8_t *data, int64_t i) {
  return (uint8_t)((data[i / 2] >> ((i & 1) * 4)) & 0x0Fu);
}

/* byte offset of the f32 decode scale behind a copy's block scales */
static inline int64_t decode_offset(int64_t rows, int64_t cols) {
  return (rows * (cols / FP4_BLOCK) + 15) / 16 * 16;
}

/* the f32 words behind a copy's block scales: the decode scale, then the copy's amax */
static void put_tail(uint8_t *tail, float global_encode, float amax) {
  const float w[2] = {1.0f / global_encode, amax};
  memcpy(tail, w, sizeof w);
}

/* the 16 values of block b of line l of a copy: rowwise, line l is row l of x; columnwise, it is
 * column l (transformed by the RHT when asked) */
typedef struct line_reader {
  const lutra_quant_args *a;
  bool columnwise, rht;
} line_reader;

static void read_block(const line_reader *rd, int64_t l, int64_t b, float *v) {
  const lutra_quant_args *a = rd->a;
  float raw[FP4_BLOCK];
  for (int i = 0; i < FP4_BLOCK; i++) {
    const int64_t k = b * FP4_BLOCK + i;
    raw[i] = load_x(a->x, a->x_dtype, rd->columnwise ? k * a->cols + l : l * a->cols + k);
  }
  if (rd->rht)
    fp4_rht16(raw, v, a->rht_signs);
  else
    memcpy(v, raw, sizeof raw);
}

static inline float block_amax(const float *v) {
  float m = 0.0f;
  for (int i = 0; i < FP4_BLOCK; i++)
    m = fmaxf(m, fabsf(v[i]));
  return m;
}

static inline uint8_t encode(const lutra_quant_args *a, float v, uint64_t stream, int64_t index) {
  if (a->nvfp4 & LUTRA_NVFP4_SR)
    return f32_to_e2m1_sr(v, fp4_random24(a->seed, stream, (uint64_t)index));
  return f32_to_e2m1(v);
}

/* One copy with 1x16 blocks: lines x blocks of 16 */
static void quantize_copy_1d(const line_reader *rd, int64_t lines, int64_t len, uint8_t *data,
                             uint8_t *scales) {
  const int64_t nb = len / FP4_BLOCK;
  float v[FP4_BLOCK], amax = 0.0f;
  for (int64_t l = 0; l < lines; l++)
    for (int64_t b = 0; b < nb; b++) {
      read_block(rd, l, b, v);
      amax = fmaxf(amax, block_amax(v));
    }
  const float ge = fp4_global_encode(amax);
  const uint64_t stream = rd->columnwise ? FP4_COL_STREAM : 0;
  for (int64_t l = 0; l < lines; l++)
    for (int64_t b = 0; b < nb; b++) {
      read_block(rd, l, b, v);
      const uint8_t sc = fp4_block_scale(block_amax(v), ge);
      const float enc = fp4_block_encode(sc, ge);
      scales[l * nb + b] = sc;
      for (int i = 0; i < FP4_BLOCK; i++) {
        const int64_t idx = l * len + b * FP4_BLOCK + i;
        put_code(data, idx, encode(rd->a, v[i] * enc, stream, idx));
      }
    }
  put_tail(scales + decode_offset(lines, len), ge, amax);
}

/* 16x16 tiles: one scale per tile; the columnwise copy is the rowwise one transposed */
static void quantize_2d(const lutra_quant_args *a) {
  const int64_t rows = a->rows, cols = a->cols, rb = rows / FP4_BLOCK, cb = cols / FP4_BLOCK;
  float amax = 0.0f;
  for (int64_t i = 0; i < rows * cols; i++)
    amax = fmaxf(amax, fabsf(load_x(a->x, a->x_dtype, i)));
  const float ge = fp4_global_encode(amax);
  uint8_t *rs = a->scale_inv, *cs = a->col_scale_inv;
  for (int64_t ti = 0; ti < rb; ti++)
    for (int64_t tj = 0; tj < cb; tj++) {
      float tmax = 0.0f;
      for (int64_t r = ti * FP4_BLOCK; r < (ti + 1) * FP4_BLOCK; r++)
        for (int64_t c = tj * FP4_BLOCK; c < (tj + 1) * FP4_BLOCK; c++)
          tmax = fmaxf(tmax, fabsf(load_x(a->x, a->x_dtype, r * cols + c)));
      const uint8_t sc = fp4_block_scale(tmax, ge);
      const float enc = fp4_block_encode(sc, ge);
      for (int64_t r = ti * FP4_BLOCK; r < (ti + 1) * FP4_BLOCK; r++) {
        if (rs) rs[r * cb + tj] = sc;
        for (int64_t c = tj * FP4_BLOCK; c < (tj + 1) * FP4_BLOCK; c++) {
          if (cs && r % FP4_BLOCK == 0) cs[c * rb + ti] = sc;
          const int64_t idx = r * cols + c;
          const uint8_t code = encode(a, load_x(a->x, a->x_dtype, idx) * enc, 0, idx);
          if (a->data) put_code(a->data, idx, code);
          if (a->col_data) put_code(a->col_data, c * rows + r, code);
        }
      }
    }
  if (rs) put_tail(rs + decode_offset(rows, cols), ge, amax);
  if (cs) put_tail(cs + decode_offset(cols, rows), ge, amax);
}

int lutra_cpu_quantize_nvfp4(const lutra_quant_args *a) {
  static const char fn[] = "lutra_cpu_quantize_nvfp4";
  CHECK_ARG(a, "arguments are NULL");
  CHECK_ARG(lutra_dtype_is_float(a->x_dtype), "input dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(a->x_dtype));
  CHECK_ARG(a->out_dtype == LUTRA_E2M1, "output dtype %s is not e2m1",
            lutra_dtype_name(a->out_dtype));
  CHECK_ARG(a->rows >= 0 && a->cols >= 0 && a->rows % FP4_BLOCK == 0 && a->cols % FP4_BLOCK == 0,
            "NVFP4 needs both matrix dims to be multiples of 16 (got %lldx%lld)",
            (long long)a->rows, (long long)a->cols);
  CHECK_ARG(!(a->nvfp4 & ~LUTRA_NVFP4_OPTION_MASK), "unknown NVFP4 options 0x%x",
            (unsigned)a->nvfp4);
  CHECK_ARG(!((a->nvfp4 & LUTRA_NVFP4_2D) && (a->nvfp4 & LUTRA_NVFP4_RHT)),
            "16x16 tiles and the RHT exclude each other");
  CHECK_ARG(!a->dbias && !a->act, "NVFP4 fuses no bias gradient or activation");
  CHECK_ARG((!a->data || a->scale_inv) && (!a->col_data || a->col_scale_inv),
            "a copy without its scale array");
  if (a->skip && *a->skip) return LUTRA_OK;
  if (a->nvfp4 & LUTRA_NVFP4_2D) {
    quantize_2d(a);
    return LUTRA_OK;
  }
  if (a->data) quantize_copy_1d(&(line_reader){.a = a}, a->rows, a->cols, a->data, a->scale_inv);
  if (a->col_data)
    quantize_copy_1d(
        &(line_reader){.a = a, .columnwise = true, .rht = (a->nvfp4 & LUTRA_NVFP4_RHT) != 0},
        a->cols, a->rows, a->col_data, a->col_scale_inv);
  return LUTRA_OK;
}

int lutra_cpu_dequantize_nvfp4(const lutra_dequant_args *a) {
  static const char fn[] = "lutra_cpu_dequantize";
  CHECK_ARG(a->dtype == LUTRA_E2M1, "dtype %s is not e2m1 (NVFP4)", lutra_dtype_name(a->dtype));
  CHECK_ARG(lutra_dtype_is_float(a->out_dtype), "output dtype %s (%d) is not f32, bf16 or f16",
            lutra_dtype_name(a->out_dtype), (int)a->out_dtype);
  CHECK_ARG(a->rows >= 0 && a->cols >= 0 && a->cols % FP4_BLOCK == 0,
            "NVFP4 needs cols to be a multiple of 16 (got %lldx%lld)", (long long)a->rows,
            (long long)a->cols);
  CHECK_ARG(a->data && a->scale_inv && a->out, "data, scale_inv and out must not be NULL");
  const int64_t rows = a->rows, cols = a->cols, nb = cols / FP4_BLOCK;
  const uint8_t *sc = a->scale_inv;
  float dec;
  memcpy(&dec, sc + decode_offset(rows, cols), sizeof dec);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) {
      const int64_t i = r * cols + c;
      const float v = e2m1_to_f32(get_code(a->data, i)) * e4m3_to_f32(sc[r * nb + c / FP4_BLOCK]);
      lutra_elem_store(a->out, a->out_dtype, i, v * dec);
    }
  return LUTRA_OK;
}
