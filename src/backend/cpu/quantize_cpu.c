/* CPU reference for conversion, amax, FP8 quantization (per-tensor, MXFP8, block) and the
 * delayed-scaling update. All FP8 math is f32 in a fixed order of operations and goes through
 * lutra_encode/lutra_decode, so the CUDA kernels can match it bit for bit. */
#include "cpu.h"

#include <float.h>
#include <math.h>
#include <string.h>

enum { MX_BLOCK = 32, FP8_BLOCK = 128, TILE = 64 };

/* Input element i as f32: F32 is read directly, the others through lutra_elem_load. */
static inline float load_x(const void *x, int dtype, int64_t i) {
  if (dtype == LUTRA_F32) return ((const float *)x)[i];
  return lutra_elem_load(x, dtype, i);
}

static inline void store_y(void *y, int dtype, int64_t i, float v) {
  if (dtype == LUTRA_F32)
    ((float *)y)[i] = v;
  else
    lutra_elem_store(y, dtype, i, v);
}

static inline uint8_t fp8(int dtype, float v) {
  return (uint8_t)lutra_encode(dtype, v);
}

static inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

/* Block scaling's padded dims (cuBLASLt's layout, see lutra_tensor in lutra.h). */
static inline int64_t round4(int64_t n) {
  return (n + 3) / 4 * 4;
}

/* lutra_quant_args.skip: on the CPU the flag is host memory, read when the call runs */
static inline bool skipped(const int32_t *skip) {
  return skip && *skip != 0;
}

static int check_quant(const lutra_quant_args *a, const char *fn) {
  if (!a) return lutra_error(LUTRA_EINVAL, fn, "arguments are NULL");
  if (!lutra_dtype_is_float(a->x_dtype))
    return lutra_error(LUTRA_EINVAL, fn, "input dtype %s (%d) is not f32, bf16 or f16",
                       lutra_dtype_name(a->x_dtype), (int)a->x_dtype);
  if (!lutra_dtype_is_fp8(a->out_dtype))
    return lutra_error(LUTRA_EINVAL, fn, "output dtype %s (%d) is not e4m3 or e5m2",
                       lutra_dtype_name(a->out_dtype), (int)a->out_dtype);
  if (a->rows < 0 || a->cols < 0)
    return lutra_error(LUTRA_EINVAL, fn, "negative shape [%lld, %lld]", (long long)a->rows,
                       (long long)a->cols);
  return LUTRA_OK;
}

/* ---- element-wise ----------------------------------------------------------------------- */

int lutra_cpu_convert(const void *src, int src_dtype, void *dst, int dst_dtype, int64_t n) {
  static const char fn[] = "lutra_cpu_convert";
  CHECK_ARG(lutra_dtype_is_float(src_dtype), "source dtype %s (%d) is not f32, bf16 or f16",
            lutra_dtype_name(src_dtype), src_dtype);
  CHECK_ARG(lutra_dtype_is_float(dst_dtype), "destination dtype %s (%d) is not f32, bf16 or f16",
            lutra_dtype_name(dst_dtype), dst_dtype);
  CHECK_ARG(n >= 0, "negative count %lld", (long long)n);
  if (n == 0) return LUTRA_OK;
  if (src_dtype == dst_dtype) {
    if (src == dst) return LUTRA_OK;
    memmove(dst, src, (size_t)n * lutra_dtype_size(src_dtype));
    return LUTRA_OK;
  }
  if (src_dtype == LUTRA_F32) {
    const float *s = src;
    for (int64_t i = 0; i < n; i++)
      lutra_elem_store(dst, dst_dtype, i, s[i]);
  } else if (dst_dtype == LUTRA_F32) {
    float *d = dst;
    for (int64_t i = 0; i < n; i++)
      d[i] = lutra_elem_load(src, src_dtype, i);
  } else {
    for (int64_t i = 0; i < n; i++)
      lutra_elem_store(dst, dst_dtype, i, lutra_elem_load(src, src_dtype, i));
  }
  return LUTRA_OK;
}

int lutra_cpu_fill(void *dst, int dtype, int64_t n, float value) {
  static const char fn[] = "lutra_cpu_fill";
  CHECK_ARG(n >= 0, "negative count %lld", (long long)n);
  switch (dtype) {
  case LUTRA_F32: {
    float *d = dst;
    for (int64_t i = 0; i < n; i++)
      d[i] = value;
    return LUTRA_OK;
  }
  case LUTRA_BF16:
  case LUTRA_F16: {
    uint16_t h = (uint16_t)lutra_encode(dtype, value);
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++)
      d[i] = h;
    return LUTRA_OK;
  }
  case LUTRA_I32: {
    /* labels: truncated toward zero, NaN to 0, clamped to the int32 range */
    int32_t k;
    if (isnan(value))
      k = 0;
    else if (value >= 2147483648.0f)
      k = INT32_MAX;
    else if (value <= -2147483648.0f)
      k = INT32_MIN;
    else
      k = (int32_t)value;
    int32_t *d = dst;
    for (int64_t i = 0; i < n; i++)
      d[i] = k;
    return LUTRA_OK;
  }
  default:
    return lutra_error(LUTRA_EINVAL, fn, "dtype %s (%d) cannot be filled", lutra_dtype_name(dtype),
                       dtype);
  }
}

int lutra_cpu_amax(const void *x, int dtype, int64_t n, float *amax) {
  static const char fn[] = "lutra_cpu_amax";
  CHECK_ARG(lutra_dtype_is_float(dtype), "dtype %s (%d) is not f32, bf16 or f16",
            lutra_dtype_name(dtype), dtype);
  CHECK_ARG(amax, "amax is NULL");
  CHECK_ARG(n >= 0, "negative count %lld", (long long)n);
  float m = *amax;
  if (dtype == LUTRA_F32) {
    const float *s = x;
    for (int64_t i = 0; i < n; i++)
      m = fmaxf(m, fabsf(s[i]));
  } else {
    for (int64_t i = 0; i < n; i++)
      m = fmaxf(m, fabsf(lutra_elem_load(x, dtype, i)));
  }
  *amax = m;
  return LUTRA_OK;
}

int lutra_cpu_current_scale(const void *x, int dtype, int64_t n, float fp8_max, int power_2_scale,
                            float epsilon, float *amax, float *scale, uint32_t *work,
                            const int32_t *skip) {
  static const char fn[] = "lutra_cpu_current_scale";
  CHECK_ARG(amax && scale && work, "amax, scale and work must not be NULL");
  if (skipped(skip)) return LUTRA_OK;
  float m = 0.0f; /* work is the CUDA kernels' scratch: nothing to keep here */
  TRY(lutra_cpu_amax(x, dtype, n, &m));
  *amax = m;
  *scale = lutra_cpu_scale_rule(m, fp8_max, power_2_scale, epsilon);
  return LUTRA_OK;
}

/* ---- per-tensor cast -------------------------------------------------------------------- */

int lutra_cpu_cast(const lutra_quant_args *a) {
  static const char fn[] = "lutra_cpu_cast";
  TRY(check_quant(a, fn));
  CHECK_ARG(a->scale, "scale is NULL");
  if (skipped(a->skip)) return LUTRA_OK;
  const float s = *a->scale;
  const int64_t rows = a->rows, cols = a->cols;
  const int xd = a->x_dtype, od = a->out_dtype;
  uint8_t *data = a->data, *col = a->col_data;
  float m = a->amax ? *a->amax : 0.0f;

  if (data || col || a->amax) {
    /* tiles keep the transposed writes within cache */
    for (int64_t r0 = 0; r0 < rows; r0 += TILE) {
      int64_t r1 = r0 + TILE < rows ? r0 + TILE : rows;
      for (int64_t c0 = 0; c0 < cols; c0 += TILE) {
        int64_t c1 = c0 + TILE < cols ? c0 + TILE : cols;
        for (int64_t r = r0; r < r1; r++) {
          for (int64_t c = c0; c < c1; c++) {
            float v = load_x(a->x, xd, r * cols + c);
            m = fmaxf(m, fabsf(v));
            uint8_t q = fp8(od, v * s);
            if (data) data[r * cols + c] = q;
            if (col) col[c * rows + r] = q;
          }
        }
      }
    }
  }
  const float inv = 1.0f / s;
  if (a->scale_inv) ((float *)a->scale_inv)[0] = inv;
  if (a->col_scale_inv) ((float *)a->col_scale_inv)[0] = inv;
  if (a->amax) *a->amax = m;
  return LUTRA_OK;
}

/* ---- MXFP8 (1x32 blocks, E8M0 scales) ----------------------------------------------------- */

/* TransformerEngine's exp2f_rcp: 2^(127 - e) as an f32 bit pattern, 1 for e = 0. */
static inline float mx_scale_rcp(uint8_t e) {
  if (e == 0) return 1.0f;
  if (e == 0xFF) return NAN;
  return bits_f32((uint32_t)(254 - e) << 23);
}

/* Quantizes n values v[0..n) as one MXFP8 block; writes codes to q[i * q_stride]. */
static inline uint8_t mx_block(const float *v, int n, int od, float max_rcp, uint8_t *q,
                               int64_t q_stride) {
  float amax = 0.0f;
  for (int i = 0; i < n; i++)
    amax = fmaxf(amax, fabsf(v[i]));
  uint8_t e = (uint8_t)lutra_encode(LUTRA_E8M0, amax * max_rcp);
  float rcp = mx_scale_rcp(e);
  for (int i = 0; i < n; i++)
    q[(int64_t)i * q_stride] = fp8(od, v[i] * rcp);
  return e;
}

int lutra_cpu_quantize_mxfp8(const lutra_quant_args *a) {
  static const char fn[] = "lutra_cpu_quantize_mxfp8";
  TRY(check_quant(a, fn));
  const int64_t rows = a->rows, cols = a->cols;
  const int xd = a->x_dtype, od = a->out_dtype;
  const float max_rcp = 1.0f / lutra_dtype_max(od);
  CHECK_ARG(!a->data || a->scale_inv, "rowwise data without scale_inv");
  CHECK_ARG(!a->col_data || a->col_scale_inv, "columnwise data without col_scale_inv");
  const bool row_out = a->data && a->scale_inv, col_out = a->col_data && a->col_scale_inv;
  CHECK_ARG(!row_out || cols % MX_BLOCK == 0, "cols %lld is not a multiple of 32", (long long)cols);
  CHECK_ARG(!col_out || rows % MX_BLOCK == 0, "rows %lld is not a multiple of 32", (long long)rows);
  if (skipped(a->skip)) return LUTRA_OK;
  float v[MX_BLOCK];

  if (row_out) {
    uint8_t *data = a->data, *sc = a->scale_inv;
    const int64_t nb = cols / MX_BLOCK;
    for (int64_t r = 0; r < rows; r++) {
      for (int64_t b = 0; b < nb; b++) {
        const int64_t base = r * cols + b * MX_BLOCK;
        for (int i = 0; i < MX_BLOCK; i++)
          v[i] = load_x(a->x, xd, base + i);
        sc[r * nb + b] = mx_block(v, MX_BLOCK, od, max_rcp, data + base, 1);
      }
    }
  }
  if (col_out) {
    /* x^T [cols][rows] in 1x32 blocks = 32 consecutive rows of one column of x */
    uint8_t *data = a->col_data, *sc = a->col_scale_inv;
    const int64_t nb = rows / MX_BLOCK;
    for (int64_t b = 0; b < nb; b++) {
      const int64_t r0 = b * MX_BLOCK;
      for (int64_t c = 0; c < cols; c++) {
        for (int i = 0; i < MX_BLOCK; i++)
          v[i] = load_x(a->x, xd, (r0 + i) * cols + c);
        sc[c * nb + b] = mx_block(v, MX_BLOCK, od, max_rcp, data + c * rows + r0, 1);
      }
    }
  }
  return LUTRA_OK;
}

/* ---- Float8BlockScaling (1x128 blocks or 128x128 tiles, f32 scales) ---------------------- */

int lutra_cpu_quantize_block(const lutra_quant_args *a) {
  static const char fn[] = "lutra_cpu_quantize_block";
  TRY(check_quant(a, fn));
  CHECK_ARG(a->block_dim == 1 || a->block_dim == 2, "block_dim %d is not 1 or 2",
            (int)a->block_dim);
  const int64_t rows = a->rows, cols = a->cols;
  const int xd = a->x_dtype, od = a->out_dtype;
  CHECK_ARG(!a->data || a->scale_inv, "rowwise data without scale_inv");
  CHECK_ARG(!a->col_data || a->col_scale_inv, "columnwise data without col_scale_inv");
  const float fp8_max = lutra_dtype_max(od);
  const int p2 = a->power_2_scale;
  const float eps = a->amax_epsilon;
  const bool row_out = a->data && a->scale_inv, col_out = a->col_data && a->col_scale_inv;
  const int64_t rb = ceil_div(rows, FP8_BLOCK), cb = ceil_div(cols, FP8_BLOCK);
  if (skipped(a->skip)) return LUTRA_OK;
  float v[FP8_BLOCK];

  if (a->block_dim == 1) {
    if (row_out) {
      uint8_t *data = a->data;
      float *sc = a->scale_inv;
      for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < cb; b++) {
          const int64_t c0 = b * FP8_BLOCK;
          const int n = (int)(cols - c0 < FP8_BLOCK ? cols - c0 : FP8_BLOCK);
          float amax = 0.0f;
          for (int i = 0; i < n; i++) {
            v[i] = load_x(a->x, xd, r * cols + c0 + i);
            amax = fmaxf(amax, fabsf(v[i]));
          }
          const float s = lutra_cpu_scale_rule(amax, fp8_max, p2, eps);
          for (int i = 0; i < n; i++)
            data[r * cols + c0 + i] = fp8(od, v[i] * s);
          sc[b * round4(rows) + r] = 1.0f / s; /* [cb][roundup(rows, 4)] */
        }
      }
    }
    if (col_out) {
      /* x^T [cols][rows] in 1x128 blocks = up to 128 consecutive rows of one column of x */
      uint8_t *data = a->col_data;
      float *sc = a->col_scale_inv;
      for (int64_t b = 0; b < rb; b++) {
        const int64_t r0 = b * FP8_BLOCK;
        const int n = (int)(rows - r0 < FP8_BLOCK ? rows - r0 : FP8_BLOCK);
        for (int64_t c = 0; c < cols; c++) {
          float amax = 0.0f;
          for (int i = 0; i < n; i++) {
            v[i] = load_x(a->x, xd, (r0 + i) * cols + c);
            amax = fmaxf(amax, fabsf(v[i]));
          }
          const float s = lutra_cpu_scale_rule(amax, fp8_max, p2, eps);
          for (int i = 0; i < n; i++)
            data[c * rows + r0 + i] = fp8(od, v[i] * s);
          sc[b * round4(cols) + c] = 1.0f / s; /* [rb][roundup(cols, 4)] */
        }
      }
    }
    return LUTRA_OK;
  }

  /* 128x128 tiles: one scale per tile, shared by the rowwise and the transposed copy */
  if (!row_out && !col_out) return LUTRA_OK;
  uint8_t *data = row_out ? a->data : NULL, *cdata = col_out ? a->col_data : NULL;
  float *sc = row_out ? a->scale_inv : NULL, *csc = col_out ? a->col_scale_inv : NULL;
  for (int64_t tr = 0; tr < rb; tr++) {
    const int64_t r0 = tr * FP8_BLOCK, r1 = r0 + FP8_BLOCK < rows ? r0 + FP8_BLOCK : rows;
    for (int64_t tc = 0; tc < cb; tc++) {
      const int64_t c0 = tc * FP8_BLOCK, c1 = c0 + FP8_BLOCK < cols ? c0 + FP8_BLOCK : cols;
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++)
          amax = fmaxf(amax, fabsf(load_x(a->x, xd, r * cols + c)));
      const float s = lutra_cpu_scale_rule(amax, fp8_max, p2, eps);
      for (int64_t r = r0; r < r1; r++) {
        for (int64_t c = c0; c < c1; c++) {
          uint8_t q = fp8(od, load_x(a->x, xd, r * cols + c) * s);
          if (data) data[r * cols + c] = q;
          if (cdata) cdata[c * rows + r] = q;
        }
      }
      const float inv = 1.0f / s;
      if (sc) sc[tr * round4(cb) + tc] = inv;   /* [rb][roundup(cb, 4)] */
      if (csc) csc[tc * round4(rb) + tr] = inv; /* [cb][roundup(rb, 4)] */
    }
  }
  return LUTRA_OK;
}

/* ---- dequantize -------------------------------------------------------------------------- */

int lutra_cpu_dequantize(const lutra_dequant_args *a) {
  static const char fn[] = "lutra_cpu_dequantize";
  CHECK_ARG(a, "arguments are NULL");
  if (a->scaling == LUTRA_SCALING_NVFP4) return lutra_cpu_dequantize_nvfp4(a);
  CHECK_ARG(lutra_dtype_is_fp8(a->dtype), "dtype %s (%d) is not e4m3 or e5m2",
            lutra_dtype_name(a->dtype), (int)a->dtype);
  CHECK_ARG(lutra_dtype_is_float(a->out_dtype), "output dtype %s (%d) is not f32, bf16 or f16",
            lutra_dtype_name(a->out_dtype), (int)a->out_dtype);
  CHECK_ARG(a->rows >= 0 && a->cols >= 0, "negative shape [%lld, %lld]", (long long)a->rows,
            (long long)a->cols);
  CHECK_ARG(a->data && a->scale_inv && a->out, "data, scale_inv and out must not be NULL");
  const int64_t rows = a->rows, cols = a->cols;
  const int dt = a->dtype, od = a->out_dtype;
  const uint8_t *q = a->data;
  void *out = a->out;

  switch (a->scaling) {
  case LUTRA_SCALING_TENSOR: {
    const float f = ((const float *)a->scale_inv)[0];
    const int64_t n = rows * cols;
    for (int64_t i = 0; i < n; i++)
      store_y(out, od, i, lutra_decode(dt, q[i]) * f);
    return LUTRA_OK;
  }
  case LUTRA_SCALING_ROWWISE: {
    const float *sc = a->scale_inv;
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++)
        store_y(out, od, r * cols + c, lutra_decode(dt, q[r * cols + c]) * sc[r]);
    return LUTRA_OK;
  }
  case LUTRA_SCALING_MXFP8: {
    CHECK_ARG(cols % MX_BLOCK == 0, "cols %lld is not a multiple of 32", (long long)cols);
    const uint8_t *sc = a->scale_inv;
    const int64_t nb = cols / MX_BLOCK;
    for (int64_t r = 0; r < rows; r++) {
      for (int64_t b = 0; b < nb; b++) {
        const float f = lutra_decode(LUTRA_E8M0, sc[r * nb + b]);
        const int64_t base = r * cols + b * MX_BLOCK;
        for (int i = 0; i < MX_BLOCK; i++)
          store_y(out, od, base + i, lutra_decode(dt, q[base + i]) * f);
      }
    }
    return LUTRA_OK;
  }
  case LUTRA_SCALING_BLOCK_1D:
  case LUTRA_SCALING_BLOCK_2D: {
    const float *sc = a->scale_inv;
    /* 1D: [cb][roundup(rows, 4)], block j of row r at j * ld + r; 2D: [rb][roundup(cb, 4)],
     * tile (i, j) at i * ld + j */
    const int64_t cb = ceil_div(cols, FP8_BLOCK);
    const bool tiles = a->scaling == LUTRA_SCALING_BLOCK_2D;
    const int64_t ld = tiles ? round4(cb) : round4(rows);
    for (int64_t r = 0; r < rows; r++) {
      for (int64_t c = 0; c < cols; c++) {
        const int64_t j = c / FP8_BLOCK;
        const float f = tiles ? sc[r / FP8_BLOCK * ld + j] : sc[j * ld + r];
        store_y(out, od, r * cols + c, lutra_decode(dt, q[r * cols + c]) * f);
      }
    }
    return LUTRA_OK;
  }
  default:
    return lutra_error(LUTRA_EINVAL, fn, "scaling %d is not tensor, mxfp8, block_1d or block_2d",
                       (int)a->scaling);
  }
}

/* ---- delayed scaling ---------------------------------------------------------------------- */

int lutra_cpu_delayed_update(lutra_scale_meta *const *metas, int n) {
  static const char fn[] = "lutra_cpu_delayed_update";
  CHECK_ARG(n >= 0, "negative count %d", n);
  CHECK_ARG(n == 0 || metas, "metas is NULL");
  /* check every meta before touching any, so a failure leaves them all as they were */
  for (int j = 0; j < n; j++) {
    const lutra_scale_meta *m = metas[j];
    CHECK_ARG(m, "meta %d is NULL", j);
    CHECK_ARG(m->scale && m->scale_inv && m->amax_history, "meta %d has NULL buffers", j);
    CHECK_ARG(m->history_len >= 1, "meta %d: history_len %d < 1", j, (int)m->history_len);
    CHECK_ARG(
        m->amax_compute_algo == LUTRA_AMAX_MAX || m->amax_compute_algo == LUTRA_AMAX_MOST_RECENT,
        "meta %d: amax_compute_algo %d is not max or most_recent", j, (int)m->amax_compute_algo);
  }
  for (int j = 0; j < n; j++) {
    lutra_scale_meta *m = metas[j];
    float *h = m->amax_history;
    const int32_t len = m->history_len;
    /* roll left by one: new[i] = h[i+1], new[len-1] = last; max over the rolled history */
    const float last = h[0];
    float amax_max = 0.0f;
    for (int32_t i = 0; i < len - 1; i++) {
      const float x = h[i + 1];
      amax_max = fmaxf(amax_max, x);
      h[i] = x;
    }
    h[len - 1] = last;
    amax_max = fmaxf(amax_max, last);
    h[0] = 0.0f;

    const float amax = m->amax_compute_algo == LUTRA_AMAX_MOST_RECENT ? last : amax_max;
    float scale;
    /* TE's order: the margin divides fp8_max first (they differ only when fp8_max / amax
     * overflows f32) */
    if (isfinite(amax) && amax > 0.0f)
      scale = (m->fp8_max / exp2f((float)m->margin)) / amax;
    else
      scale = *m->scale;
    if (isinf(scale)) scale = FLT_MAX;
    *m->scale = scale;
    *m->scale_inv = 1.0f / scale;
  }
  return LUTRA_OK;
}
