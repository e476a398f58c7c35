/* lutra/recipe_options.h: per-GEMM options and the backward override of a recipe.
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_RECIPE_OPTIONS_H
#define LUTRA_RECIPE_OPTIONS_H

#include "recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The three GEMMs of a linear layer. */
enum { LUTRA_GEMM_FPROP = 0, LUTRA_GEMM_DGRAD = 1, LUTRA_GEMM_WGRAD = 2, LUTRA_NUM_GEMMS = 3 };
/* How the backward GEMMs of an FP8 forward run. */
enum {
  LUTRA_BACKWARD_FP8 = 0,            /* FP8 (the recipe's grad_output quantizer) */
  LUTRA_BACKWARD_HIGH_PRECISION = 1, /* high precision, from the saved high-precision x and W */
  LUTRA_BACKWARD_DEQUANTIZED = 2 /* high precision, from the forward's FP8 x and W dequantized */
};

/* TransformerEngine's MMParams per GEMM, and its backward override. Defaults
 * (lutra_recipe_options_defaults): split accumulator off for fprop, on for dgrad and wgrad
 * (TE's); the backward in FP8. */
typedef struct lutra_recipe_options {
  int32_t use_split_accumulator[LUTRA_NUM_GEMMS]; /* 0: FP8 fast accumulation (cuBLASLt's
                                                     CUBLASLT_MATMUL_DESC_FAST_ACCUM) */
  int32_t backward_override;                      /* LUTRA_BACKWARD_* */
} lutra_recipe_options;

LUTRA_API void lutra_recipe_options_defaults(lutra_recipe_options *o);
/* The recipe's options (a recipe from any constructor has the defaults). */
LUTRA_API int lutra_recipe_options_of(const lutra_recipe *r, lutra_recipe_options *o);
/* A new recipe: r with these options (its own key). r is unchanged. */
LUTRA_API int lutra_recipe_with_options(const lutra_recipe *r, const lutra_recipe_options *o,
                                        lutra_recipe **out);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_RECIPE_OPTIONS_H */
