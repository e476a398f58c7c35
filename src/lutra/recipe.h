/* lutra/recipe.h: FP8 recipes.
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_RECIPE_H
#define LUTRA_RECIPE_H

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- recipes ----------------------------------------------------------------------------- */
typedef struct lutra_recipe lutra_recipe;

enum { LUTRA_FORMAT_E4M3 = 0, LUTRA_FORMAT_HYBRID = 1, LUTRA_FORMAT_E5M2 = 2 };
enum { LUTRA_AMAX_MAX = 0, LUTRA_AMAX_MOST_RECENT = 1 };
enum {
  LUTRA_RECIPE_DELAYED = 0,
  LUTRA_RECIPE_CURRENT = 1,
  LUTRA_RECIPE_MXFP8 = 2,
  LUTRA_RECIPE_BLOCK = 3,
  LUTRA_RECIPE_CUSTOM = 4
};
/* Tensor roles a recipe quantizes. */
enum {
  LUTRA_ROLE_INPUT = 0,
  LUTRA_ROLE_WEIGHT = 1,
  LUTRA_ROLE_GRAD_OUTPUT = 2,
  LUTRA_NUM_ROLES = 3
};
/* Quantizer kinds a custom recipe may name per role. */
enum {
  LUTRA_QUANT_NONE = 0, /* keep this role in high precision */
  LUTRA_QUANT_DELAYED = 1,
  LUTRA_QUANT_CURRENT = 2,
  LUTRA_QUANT_MXFP8 = 3,
  LUTRA_QUANT_BLOCK_1D = 4,
  LUTRA_QUANT_BLOCK_2D = 5
};

/* TransformerEngine's DelayedScaling. Defaults: lutra_delayed_defaults(). */
typedef struct lutra_delayed_desc {
  int32_t fp8_format;        /* HYBRID (default) or E4M3; E5M2 is refused */
  int32_t margin;            /* 0..32; scale = fp8_max / amax / 2^margin */
  int32_t amax_history_len;  /* >= 1, default 1024 */
  int32_t amax_compute_algo; /* LUTRA_AMAX_MAX (default) or LUTRA_AMAX_MOST_RECENT */
  int32_t reduce_amax;       /* reduce amaxes across the scope's group (default 1) */
  int32_t rule; /* an external scaling rule (lutra/rules.h) instead of the built-in one; 0: none */
} lutra_delayed_desc;

/* Float8CurrentScaling: per-tensor scale from the tensor's own amax. */
typedef struct lutra_current_desc {
  int32_t fp8_format;       /* HYBRID (default) or E4M3 */
  int32_t power_2_scale[3]; /* per role, default 0 */
  float amax_epsilon[3];    /* per role, default 0 */
} lutra_current_desc;

/* MXFP8BlockScaling: 1x32 blocks, E8M0 scales rounded up. */
typedef struct lutra_mxfp8_desc {
  int32_t fp8_format; /* E4M3 (default) or HYBRID */
  int32_t margin;     /* kept for TE parity; must be 0 */
} lutra_mxfp8_desc;

/* Float8BlockScaling: 1x128 blocks for inputs and grads, 128x128 tiles for weights. */
typedef struct lutra_block_desc {
  int32_t fp8_format;       /* E4M3 (default) or HYBRID */
  int32_t power_2_scale[3]; /* per role, default 1 */
  float amax_epsilon[3];    /* per role, default 0 */
  int32_t block_dim[3];     /* per role: 1 (1x128) or 2 (128x128); default {1, 2, 1} */
} lutra_block_desc;

/* Custom: one quantizer per role. The delayed fields apply to roles that use DELAYED. */
typedef struct lutra_custom_desc {
  int32_t kind[3];   /* LUTRA_QUANT_* per role */
  int32_t format[3]; /* LUTRA_E4M3 or LUTRA_E5M2 per role */
  int32_t power_2_scale[3];
  float amax_epsilon[3];
  int32_t margin;
  int32_t amax_history_len;
  int32_t amax_compute_algo;
  int32_t reduce_amax;
  int32_t rule; /* for the DELAYED roles: an external scaling rule (lutra/rules.h); 0: none */
  /* per role: the columnwise copy's format when it differs from the rowwise one (TE's hybrid
   * quantizer: two quantizations of the same kind); 0: the same as format */
  int32_t columnwise_format[3];
  /* NVFP4 roles (kind LUTRA_QUANT_NVFP4, format LUTRA_E2M1; lutra/nvfp4.h): LUTRA_NVFP4_* options
   * per role, the RHT's sign mask (16 bits; defaults: LUTRA_NVFP4_TE_SIGNS) and the seed of the
   * stochastic rounding */
  int32_t nvfp4[3];
  uint32_t rht_signs;
  uint64_t nvfp4_seed;
} lutra_custom_desc;

LUTRA_API void lutra_delayed_defaults(lutra_delayed_desc *d);
LUTRA_API void lutra_current_defaults(lutra_current_desc *d);
LUTRA_API void lutra_mxfp8_defaults(lutra_mxfp8_desc *d);
LUTRA_API void lutra_block_defaults(lutra_block_desc *d);
LUTRA_API void lutra_custom_defaults(lutra_custom_desc *d);
LUTRA_API int lutra_recipe_delayed(const lutra_delayed_desc *d, lutra_recipe **out);
LUTRA_API int lutra_recipe_current(const lutra_current_desc *d, lutra_recipe **out);
LUTRA_API int lutra_recipe_mxfp8(const lutra_mxfp8_desc *d, lutra_recipe **out);
LUTRA_API int lutra_recipe_block(const lutra_block_desc *d, lutra_recipe **out);
LUTRA_API int lutra_recipe_custom(const lutra_custom_desc *d, lutra_recipe **out);
LUTRA_API int lutra_recipe_unref(lutra_recipe *r);
LUTRA_API int lutra_recipe_destroy(lutra_recipe *r);
LUTRA_API int lutra_recipe_kind(const lutra_recipe *r, int *kind);
/* What the recipe does with a role: LUTRA_QUANT_* kind and FP8 dtype. */
LUTRA_API int lutra_recipe_role(const lutra_recipe *r, int role, int *quant_kind, int *dtype);
/* 64-bit key of the recipe's fields, computed once at creation. Equal fields, equal keys. */
LUTRA_API int lutra_recipe_key(const lutra_recipe *r, uint64_t *key);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_RECIPE_H */
