/* Per-GEMM options and the backward override of a recipe (lutra/recipe_options.h): a recipe is
 * immutable, so the options make a new one, with its own key. */
#include "core/error.h"
#include "core/object.h"
#include "fp8/recipe.h"

int lutra_recipe_options_of(const lutra_recipe *r, lutra_recipe_options *o) {
  static const char fn[] = "lutra_recipe_options_of";
  TRY(lutra_check_object(r, LUTRA_MAGIC_RECIPE, fn, "recipe"));
  CHECK_ARG(o, "o is NULL");
  *o = r->options;
  return LUTRA_OK;
}

int lutra_recipe_with_options(const lutra_recipe *r, const lutra_recipe_options *o,
                              lutra_recipe **out) {
  static const char fn[] = "lutra_recipe_with_options";
  TRY(lutra_check_object(r, LUTRA_MAGIC_RECIPE, fn, "recipe"));
  CHECK_ARG(o, "options are NULL");
  static const char *const gemms[LUTRA_NUM_GEMMS] = {"fprop", "dgrad", "wgrad"};
  for (int i = 0; i < LUTRA_NUM_GEMMS; i++)
    CHECK_ARG(o->use_split_accumulator[i] == 0 || o->use_split_accumulator[i] == 1,
              "use_split_accumulator for %s must be 0 or 1 (got %d)", gemms[i],
              (int)o->use_split_accumulator[i]);
  CHECK_ARG(o->backward_override >= LUTRA_BACKWARD_FP8 &&
                o->backward_override <= LUTRA_BACKWARD_DEQUANTIZED,
            "unknown backward_override %d", (int)o->backward_override);
  lutra_recipe t = *r;
  t.obj = (lutra_object){0};
  t.options = *o;
  return lutra_recipe_finish(&t, out, fn);
}
