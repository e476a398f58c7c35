/* NVFP4 in recipes (lutra/nvfp4.h): the checks a custom desc's NVFP4 roles get at creation, and
 * lutra_nvfp4_rht, the transform's reference on CPU tensors. */
#include "backend/backend.h"
#include "core/error.h"
#include "core/fp4.h"
#include "core/object.h"
#include "fp8/recipe.h"
#include "runtime/tensor.h"

int lutra_nvfp4_check_role(const lutra_custom_desc *d, int i, const char *role, const char *fn) {
  CHECK_ARG(d->format[i] == LUTRA_E2M1, "format for %s must be e2m1 (kind nvfp4)", role);
  CHECK_ARG(d->columnwise_format[i] == 0 || d->columnwise_format[i] == LUTRA_E2M1,
            "%s: an NVFP4 role has no hybrid columnwise format", role);
  const int o = d->nvfp4[i];
  CHECK_ARG(!(o & ~LUTRA_NVFP4_OPTION_MASK), "unknown NVFP4 options 0x%x for %s", (unsigned)o,
            role);
  CHECK_ARG(!((o & LUTRA_NVFP4_2D) && (o & LUTRA_NVFP4_RHT)),
            "%s: 16x16 tiles and the RHT exclude each other (the columnwise copy of a tiled "
            "tensor is its rowwise one transposed)",
            role);
  CHECK_ARG(d->rht_signs <= 0xFFFFu, "rht_signs 0x%x has more than 16 bits", d->rht_signs);
  return LUTRA_OK;
}

/* the GEMMs of a Linear and the copies they read (as lutra_recipe_custom_specs checks them) */
int lutra_nvfp4_check_pairs(const lutra_quantizer_spec roles[LUTRA_NUM_ROLES],
                            const char *const *role_names, const char *fn) {
  static const struct {
    int a, b;
    const char *gemm;
  } pairs[] = {{LUTRA_ROLE_INPUT, LUTRA_ROLE_WEIGHT, "fprop"},
               {LUTRA_ROLE_GRAD_OUTPUT, LUTRA_ROLE_WEIGHT, "dgrad"},
               {LUTRA_ROLE_GRAD_OUTPUT, LUTRA_ROLE_INPUT, "wgrad"}};
  for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
    const int ka = roles[pairs[i].a].kind, kb = roles[pairs[i].b].kind;
    if (ka == LUTRA_QUANT_NONE || kb == LUTRA_QUANT_NONE) continue;
    CHECK_ARG((ka == LUTRA_QUANT_NVFP4) == (kb == LUTRA_QUANT_NVFP4),
              "%s is %s and %s is %s: the %s GEMM would pair NVFP4 with FP8 (both operands of "
              "an NVFP4 GEMM are NVFP4)",
              role_names[pairs[i].a], ka == LUTRA_QUANT_NVFP4 ? "nvfp4" : "fp8",
              role_names[pairs[i].b], kb == LUTRA_QUANT_NVFP4 ? "nvfp4" : "fp8", pairs[i].gemm);
  }
  /* the RHT cancels out only between the two operands of the wgrad GEMM, both transformed */
  const lutra_quantizer_spec *in = &roles[LUTRA_ROLE_INPUT], *w = &roles[LUTRA_ROLE_WEIGHT],
                             *g = &roles[LUTRA_ROLE_GRAD_OUTPUT];
  CHECK_ARG(!(w->kind == LUTRA_QUANT_NVFP4 && (w->nvfp4 & LUTRA_NVFP4_RHT)),
            "weight: the RHT goes on the wgrad GEMM's operands (input and grad_output), not on "
            "the weight (its columnwise copy feeds dgrad)");
  const bool in_rht = in->kind == LUTRA_QUANT_NVFP4 && (in->nvfp4 & LUTRA_NVFP4_RHT);
  const bool g_rht = g->kind == LUTRA_QUANT_NVFP4 && (g->nvfp4 & LUTRA_NVFP4_RHT);
  CHECK_ARG(in_rht == g_rht,
            "the RHT is on %s but not on %s: the wgrad GEMM needs it on both of its operands or "
            "on neither",
            in_rht ? "input" : "grad_output", in_rht ? "grad_output" : "input");
  return LUTRA_OK;
}

int lutra_nvfp4_rht(const lutra_tensor *x, uint32_t signs, int inverse, lutra_tensor *out) {
  static const char fn[] = "lutra_nvfp4_rht";
  TRY(lutra_check_tensor(x, fn, "x"));
  TRY(lutra_check_tensor(out, fn, "out"));
  CHECK_ARG(x->dtype == LUTRA_F32 && out->dtype == LUTRA_F32 && x->scaling == LUTRA_SCALING_NONE &&
                out->scaling == LUTRA_SCALING_NONE,
            "x and out must be f32 tensors (got %s and %s)", lutra_dtype_name(x->dtype),
            lutra_dtype_name(out->dtype));
  CHECK_ARG(x->device == LUTRA_CPU && out->device == LUTRA_CPU, "x and out must be CPU tensors");
  CHECK_ARG(lutra_same_shape(x, out), "out's shape differs from x's");
  CHECK_ARG(lutra_cols(x) % FP4_BLOCK == 0, "the last dim %lld is not a multiple of 16",
            (long long)lutra_cols(x));
  CHECK_ARG(signs <= 0xFFFFu, "signs 0x%x has more than 16 bits", signs);
  CHECK_ARG(x->data && out->data, "x or out has no data");
  const float *src = x->data;
  float *dst = out->data, in[FP4_BLOCK];
  for (int64_t i = 0; i < x->numel; i += FP4_BLOCK) {
    for (int k = 0; k < FP4_BLOCK; k++)
      in[k] = src[i + k]; /* out may be x */
    if (inverse)
      fp4_rht16_inverse(in, dst + i, signs);
    else
      fp4_rht16(in, dst + i, signs);
  }
  out->flags |= LUTRA_TENSOR_WRITTEN;
  return LUTRA_OK;
}
