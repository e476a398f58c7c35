/* A recipe as the FP8 layer reads it: one quantizer spec per tensor role, and a key. */
#ifndef LUTRA_FP8_RECIPE_H
#define LUTRA_FP8_RECIPE_H

#include "core/object.h"
#include "lutra.h"

typedef struct lutra_quantizer_spec {
  int32_t kind;  /* LUTRA_QUANT_* */
  int32_t dtype; /* E4M3 / E5M2 */
  int32_t power_2_scale;
  float amax_epsilon;
  int32_t margin;
  int32_t amax_history_len;
  int32_t amax_compute_algo;
  int32_t block_dim;
  int32_t rule; /* delayed scaling: an external scaling rule's id (lutra/rules.h); 0: built-in */
  int32_t col_dtype;  /* a hybrid role: the columnwise copy's FP8 dtype; 0: dtype */
  int32_t nvfp4;      /* NVFP4: LUTRA_NVFP4_* options (lutra/nvfp4.h) */
  uint32_t rht_signs; /* NVFP4: the RHT's sign mask */
  uint64_t seed;      /* NVFP4: the stochastic rounding's seed */
} lutra_quantizer_spec;

struct lutra_recipe {
  lutra_object obj;
  int32_t kind;
  int32_t reduce_amax;
  lutra_quantizer_spec roles[LUTRA_NUM_ROLES];
  uint64_t key;
  int32_t factory;                /* a factory recipe's front id (lutra/factory.h); 0: none */
  lutra_custom_desc factory_base; /* its delayed fields, for the choices */
  lutra_recipe_options options;   /* per-GEMM options, backward override (recipe_options.c) */
};

/* The validated specs of a custom desc (the checks of lutra_recipe_custom). */
int lutra_recipe_custom_specs(const lutra_custom_desc *d,
                              lutra_quantizer_spec roles[LUTRA_NUM_ROLES], const char *fn);

/* NVFP4's checks of a custom desc (nvfp4.c): role i's format and options, and GEMMs that would
 * pair an NVFP4 operand with an FP8 one */
int lutra_nvfp4_check_role(const lutra_custom_desc *d, int i, const char *role, const char *fn);
int lutra_nvfp4_check_pairs(const lutra_quantizer_spec roles[LUTRA_NUM_ROLES],
                            const char *const *role_names, const char *fn);

/* A new recipe from a filled template: refcount, magic and key set (recipe.c). */
int lutra_recipe_finish(lutra_recipe *tmpl, lutra_recipe **out, const char *fn);

#endif
