/* The norm writing a GEMM's FP8 input on the CPU (lutra_norm_quant_args in backend/backend.h):
 * the reference of kernels/norm_quantize.cu. By definition the fused op is the norm followed by
 * the quantization of its stored output, so the reference is exactly that composition: the
 * norm's y (rounded into the activation dtype, as layernorm_forward stores it) goes through the
 * same cast / quantize_mxfp8 / quantize_block code the quantizers run. What the CUDA kernel
 * fuses (one pass from x to the codes) must therefore give these codes bit for bit wherever its
 * row statistics equal the CPU's (norm_cpu.c says when they do). */
#include "cpu.h"

#include <stdlib.h>

static int check_args(const lutra_norm_quant_args *a, const char *fn) {
  CHECK_ARG(a, "arguments are NULL");
  const lutra_quant_args *q = &a->quant;
  CHECK_ARG(a->scaling == LUTRA_SCALING_TENSOR || a->scaling == LUTRA_SCALING_MXFP8 ||
                a->scaling == LUTRA_SCALING_BLOCK_1D,
            "scaling %d is not tensor, mxfp8 or block_1d", (int)a->scaling);
  CHECK_ARG(a->scaling == LUTRA_SCALING_TENSOR || !a->current,
            "current scaling is a per-tensor scaling");
  CHECK_ARG(lutra_dtype_is_fp8(q->out_dtype), "output dtype %s (%d) is not e4m3 or e5m2",
            lutra_dtype_name(q->out_dtype), (int)q->out_dtype);
  CHECK_ARG(!q->data || q->scale_inv, "rowwise data without scale_inv");
  CHECK_ARG(!q->col_data || q->col_scale_inv, "columnwise data without col_scale_inv");
  if (a->scaling == LUTRA_SCALING_TENSOR) {
    CHECK_ARG(q->scale, "scale is NULL");
    if (a->current) CHECK_ARG(q->amax && a->work, "current scaling needs amax and work");
  }
  if (a->scaling == LUTRA_SCALING_MXFP8) {
    CHECK_ARG(!q->data || a->norm.hidden % 32 == 0, "hidden %lld is not a multiple of 32",
              (long long)a->norm.hidden);
    CHECK_ARG(!q->col_data || a->norm.rows % 32 == 0, "rows %lld is not a multiple of 32",
              (long long)a->norm.rows);
  }
  return LUTRA_OK;
}

int lutra_cpu_norm_quantize(const lutra_norm_quant_args *a) {
  static const char fn[] = "lutra_cpu_norm_quantize";
  TRY(check_args(a, fn));
  if (a->quant.skip && *a->quant.skip) return LUTRA_OK;
  const lutra_norm_args *na = &a->norm;
  CHECK_ARG(na->rows >= 0 && na->hidden > 0, "bad shape [%lld, %lld]", (long long)na->rows,
            (long long)na->hidden);
  const int64_t n = na->rows * na->hidden;
  /* without a high-precision output the norm's y lives in a scratch buffer for the call */
  void *scratch = NULL;
  if (!na->y && n > 0) {
    scratch = malloc((size_t)n * lutra_dtype_size(na->dtype));
    if (!scratch)
      return lutra_error(LUTRA_ENOMEM, fn, "no memory for a %lld-element norm output",
                         (long long)n);
  }
  lutra_norm_args norm = *na;
  if (!norm.y) norm.y = scratch ? scratch : (void *)na->x; /* n == 0: nothing is written */
  int st = lutra_cpu_layernorm_forward(&norm);
  lutra_quant_args q = a->quant;
  q.x = norm.y;
  q.x_dtype = na->dtype;
  q.rows = na->rows;
  q.cols = na->hidden;
  q.act = NULL;
  q.dbias = NULL;
  q.skip = NULL;
  if (st == LUTRA_OK && a->current)
    st = lutra_cpu_current_scale(norm.y, na->dtype, n, a->fp8_max, q.power_2_scale, q.amax_epsilon,
                                 q.amax, (float *)q.scale, a->work, NULL);
  if (st == LUTRA_OK) {
    if (a->current) q.amax = NULL; /* current_scale wrote it: the cast only casts */
    switch (a->scaling) {
    case LUTRA_SCALING_TENSOR:
      st = lutra_cpu_cast(&q);
      break;
    case LUTRA_SCALING_MXFP8:
      st = lutra_cpu_quantize_mxfp8(&q);
      break;
    default:
      q.block_dim = 1;
      st = lutra_cpu_quantize_block(&q);
      break;
    }
  }
  free(scratch);
  return st == LUTRA_OK ? LUTRA_OK : lutra_error_wrap(st, fn);
}
