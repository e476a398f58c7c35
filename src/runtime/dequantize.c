/* FP8 tensor back to f32/bf16/f16: a tensor operation (it needs the tensor's codes and scales,
 * not the quantizer that made them). */
#include "backend/backend.h"
#include "backend/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/object.h"
#include "runtime/tensor.h"

int lutra_dequantize(const lutra_tensor *q, int columnwise, lutra_tensor *out) {
  static const char fn[] = "lutra_dequantize";
  TRY(lutra_check_tensor(q, fn, "q"));
  TRY(lutra_check_tensor(out, fn, "out"));
  CHECK_ARG(lutra_dtype_is_fp8(q->dtype) && q->scaling != LUTRA_SCALING_NONE,
            "q is not an FP8 tensor");
  CHECK_ARG(lutra_dtype_is_float(out->dtype), "out dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(out->dtype));
  CHECK_ARG(out->numel == q->numel, "out has %lld elements, q %lld", (long long)out->numel,
            (long long)q->numel);
  CHECK_ARG(out->device == q->device, "out is on another device");
  const void *data = columnwise ? q->col_data : q->data;
  CHECK_ARG(data, "q has no %s data", columnwise ? "columnwise" : "rowwise");
  const lutra_backend *be;
  TRY(lutra_backend_get(q->device, &be, fn));
  int64_t rows = lutra_rows(q), cols = lutra_cols(q);
  lutra_dequant_args a = {
      .data = data,
      .scale_inv = columnwise ? q->col_scale_inv : q->scale_inv,
      .dtype = q->dtype,
      .scaling = q->scaling,
      .rows = columnwise ? cols : rows,
      .cols = columnwise ? rows : cols,
      .out = out->data,
      .out_dtype = out->dtype,
  };
  return be->dequantize(&a);
}
