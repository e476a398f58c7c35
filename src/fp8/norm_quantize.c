/* lutra_norm_quantize (lutra/fused.h): the norm writing a quantizer's FP8 output, as a call of
 * its own (the modules reach the same code through lutra_quantize_norm_run). */
#include "core/dtype.h"
#include "core/error.h"
#include "core/object.h"
#include "fp8/quantizer.h"
#include "runtime/tensor.h"

#include <math.h>

static int check_param(const lutra_tensor *p, const lutra_tensor *x, const char *what,
                       const char *fn) {
  TRY(lutra_check_tensor(p, fn, what));
  CHECK_ARG(p->dtype == LUTRA_F32 || p->dtype == LUTRA_BF16, "%s dtype %s is not f32 or bf16", what,
            lutra_dtype_name(p->dtype));
  CHECK_ARG(p->scaling == LUTRA_SCALING_NONE && p->numel == lutra_cols(x),
            "%s must hold %lld values (x's last dim), not quantized", what,
            (long long)lutra_cols(x));
  CHECK_ARG(p->device == x->device, "%s is on another device than x", what);
  return LUTRA_OK;
}

int lutra_norm_quantize(lutra_quantizer *q, const lutra_tensor *x, const lutra_tensor *gamma,
                        const lutra_tensor *beta, float eps, int rms, int zero_centered_gamma,
                        lutra_tensor *y, lutra_tensor **out) {
  static const char fn[] = "lutra_norm_quantize";
  TRY(lutra_check_object(q, LUTRA_MAGIC_QUANTIZER, fn, "quantizer"));
  TRY(lutra_check_tensor(x, fn, "x"));
  CHECK_ARG(out, "out is NULL");
  CHECK_ARG(x->scaling == LUTRA_SCALING_NONE && lutra_dtype_is_float(x->dtype),
            "x must be f32, bf16 or f16 (got %s)", lutra_dtype_name(x->dtype));
  CHECK_ARG(x->ndim >= 1 && lutra_cols(x) > 0, "x has no features");
  CHECK_ARG(isfinite(eps) && eps >= 0.0f, "eps must be finite and >= 0 (got %g)", (double)eps);
  TRY(check_param(gamma, x, "gamma", fn));
  if (!rms) {
    TRY(check_param(beta, x, "beta", fn));
    CHECK_ARG(beta->dtype == gamma->dtype, "gamma and beta have different dtypes");
  }
  if (y) {
    TRY(lutra_check_tensor(y, fn, "y"));
    CHECK_ARG(y->dtype == x->dtype && y->scaling == LUTRA_SCALING_NONE && lutra_same_shape(y, x) &&
                  y->device == x->device,
              "y must have x's dtype, shape and device");
    CHECK_ARG(y->data != x->data, "y must not alias x");
  }
  lutra_norm_args na = {.x = x->data,
                        .gamma = gamma->data,
                        .beta = rms ? NULL : beta->data,
                        .dtype = x->dtype,
                        .param_dtype = gamma->dtype,
                        .rows = lutra_rows(x),
                        .hidden = lutra_cols(x),
                        .eps = eps,
                        .rms = rms != 0,
                        .zero_centered_gamma = zero_centered_gamma != 0,
                        .y = y ? y->data : NULL};
  TRY(lutra_quantize_norm_run(q, &na, x, true, false, out, fn));
  if (y) y->flags |= LUTRA_TENSOR_WRITTEN;
  return LUTRA_OK;
}
