/* Rowwise scaling on the CPU backend (lutra/formats.h; torchao's ROWWISE): each row of the
 * rowwise copy, and each row of the columnwise (transposed) copy, that is each column of x, gets
 * its own scale from its own amax, by the rule of current scaling. f32 math in a fixed order and
 * lutra_encode, as the other CPU quantizers. */
#include "cpu.h"

#include <math.h>

static inline float load_x(const void *x, int dtype, int64_t i) {
  if (dtype == LUTRA_F32) return ((const float *)x)[i];
  return lutra_elem_load(x, dtype, i);
}

/* one line of n values at x[i0 + k * stride] into out[k], with its scale_inv */
static void quantize_line(const lutra_quant_args *a, int64_t i0, int64_t stride, int64_t n,
                          uint8_t *out, float *scale_inv, float fp8_max) {
  float amax = 0.0f;
  for (int64_t k = 0; k < n; k++)
    amax = fmaxf(amax, fabsf(load_x(a->x, a->x_dtype, i0 + k * stride)));
  const float s = lutra_cpu_scale_rule(amax, fp8_max, a->power_2_scale, a->amax_epsilon);
  for (int64_t k = 0; k < n; k++)
    out[k] = (uint8_t)lutra_encode(a->out_dtype, load_x(a->x, a->x_dtype, i0 + k * stride) * s);
  *scale_inv = 1.0f / s;
}

int lutra_cpu_quantize_rowwise(const lutra_quant_args *a) {
  static const char fn[] = "lutra_cpu_quantize_rowwise";
  CHECK_ARG(a, "arguments are NULL");
  CHECK_ARG(lutra_dtype_is_float(a->x_dtype), "input dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(a->x_dtype));
  CHECK_ARG(lutra_dtype_is_fp8(a->out_dtype), "output dtype %s is not e4m3 or e5m2",
            lutra_dtype_name(a->out_dtype));
  CHECK_ARG(a->rows >= 0 && a->cols >= 0, "negative shape");
  CHECK_ARG(!a->dbias && !a->act, "rowwise scaling fuses no bias gradient or GELU gradient");
  if (a->skip && *a->skip) return LUTRA_OK;
  const float fp8_max = lutra_dtype_max(a->out_dtype);
  const int64_t rows = a->rows, cols = a->cols;
  if (a->data)
    for (int64_t r = 0; r < rows; r++)
      quantize_line(a, r * cols, 1, cols, (uint8_t *)a->data + r * cols, (float *)a->scale_inv + r,
                    fp8_max);
  if (a->col_data)
    for (int64_t c = 0; c < cols; c++)
      quantize_line(a, c, cols, rows, (uint8_t *)a->col_data + c * rows,
                    (float *)a->col_scale_inv + c, fp8_max);
  return LUTRA_OK;
}
