/* lutra/factory.h: recipes whose quantizers are chosen per module (TransformerEngine's
 * CustomRecipe with a qfactory; the Lua front's lutra.recipe.custom{factory = function}).
 * Part of lutra.h (include that one; its conventions hold here).
 *
 * A factory recipe leaves the choice of each role's quantizer to the caller, per module: the
 * first forward of a module under the recipe (nothing else has run yet in that call tree's
 * module) fails with LUTRA_FACTORY_PENDING, and lutra_factory_request says which module (its kind
 * and name) asks. The caller chooses, lutra_factory_resolve stores the choice in the module for
 * this recipe, and the caller runs the forward again. Later forwards under the same recipe use
 * the stored choice without asking again. A forward that failed this way has recorded nothing
 * (its scope's amaxes of that call are forgotten, as for every failed forward). */
#ifndef LUTRA_FACTORY_H
#define LUTRA_FACTORY_H

#include "nn.h"
#include "recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { LUTRA_RECIPE_FACTORY = 5 };
/* Returned by a forward whose module waits for a choice (not an error of the arguments). */
enum { LUTRA_FACTORY_PENDING = 65 };
enum { LUTRA_MODULE_NAME_MAX = 64 }; /* bytes of a module name, with the terminating NUL */

typedef struct lutra_factory_desc {
  int32_t factory; /* the caller's id of the factory, > 0 (part of the recipe's key) */
  /* for the roles a module chooses DELAYED for (as lutra_custom_desc's) */
  int32_t margin;
  int32_t amax_history_len;
  int32_t amax_compute_algo;
  int32_t reduce_amax;
  int32_t rule; /* an external scaling rule (lutra/rules.h); 0: none */
  /* for the roles a module chooses NVFP4 for (as lutra_custom_desc's; lutra/nvfp4.h) */
  uint32_t rht_signs;
  uint64_t nvfp4_seed;
} lutra_factory_desc;

/* One role's choice: what lutra_custom_desc holds for it. */
typedef struct lutra_factory_choice {
  int32_t kind;   /* LUTRA_QUANT_* */
  int32_t format; /* LUTRA_E4M3 or LUTRA_E5M2 */
  int32_t power_2_scale;
  float amax_epsilon;
  int32_t columnwise_format; /* a hybrid role's columnwise format; 0: format */
  int32_t nvfp4;             /* an NVFP4 role's LUTRA_NVFP4_* options (lutra/nvfp4.h) */
} lutra_factory_choice;

LUTRA_API void lutra_factory_defaults(lutra_factory_desc *d);
LUTRA_API int lutra_recipe_factory(const lutra_factory_desc *d, lutra_recipe **out);
/* LUTRA_FACTORY_PENDING when a module waits for its choice and no call failed since; else OK. */
LUTRA_API int lutra_factory_status(void);
/* The waiting module: the recipe's factory id, the module's kind ("linear", ...) and name (""
 * when it has none). The strings stay valid until lutra_factory_resolve. */
LUTRA_API int lutra_factory_request(int *factory, const char **module_kind, const char **name);
/* Stores the choice (validated as lutra_recipe_custom validates its desc: an unknown kind or
 * format, or a GEMM pairing FP8 GEMMs cannot run, is refused and nothing is stored). */
LUTRA_API int lutra_factory_resolve(const lutra_factory_choice choices[LUTRA_NUM_ROLES]);
/* Drops the waiting module's request (the caller's factory failed): request and resolve then say
 * that nothing waits, and the module asks again at its next forward. */
LUTRA_API void lutra_factory_cancel(void);
/* Names a module for the factory (a Linear, LayerNormLinear, parallel Linear or GroupedLinear):
 * at most LUTRA_MODULE_NAME_MAX - 1 bytes. */
LUTRA_API int lutra_module_set_name(lutra_module *m, const char *name);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_FACTORY_H */
