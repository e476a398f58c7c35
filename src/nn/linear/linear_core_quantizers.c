/* The Linear core's quantizers (see nn/linear/linear_core_quantizers.h). */
#include "nn/linear/linear_core_quantizers.h"
#include "core/error.h"
#include "fp8/quantizer.h"
#include "fp8/recipe.h"
#include "nn/module.h"

#include <string.h>

void lutra_linear_core_free_quantizers(lutra_quantizer *q[LUTRA_NUM_ROLES]) {
  for (int i = 0; i < LUTRA_NUM_ROLES; i++) {
    lutra_quantizer_owner_drop(q[i]);
    q[i] = NULL;
  }
}

/* Quantizers for the specs a recipe gives a module (roles: the recipe's, or the module's choice
 * for a factory recipe), not installed yet: fresh[] the rowwise (or only) one of each role,
 * fresh_col[] a hybrid role's columnwise one. */
int lutra_linear_core_build_quantizers(const lutra_linear_core *c,
                                       const lutra_quantizer_spec *roles,
                                       lutra_quantizer *fresh[LUTRA_NUM_ROLES],
                                       lutra_quantizer *fresh_col[LUTRA_NUM_ROLES],
                                       const char *fn) {
  for (int i = 0; i < LUTRA_NUM_ROLES; i++)
    fresh[i] = fresh_col[i] = NULL;
  for (int i = 0; i < LUTRA_NUM_ROLES; i++) {
    if (roles[i].kind == LUTRA_QUANT_NONE) continue;
    const bool hybrid = roles[i].col_dtype != 0;
    int st = lutra_quantizer_create(&roles[i], 1, !hybrid, c->device, &fresh[i], fn);
    if (st == LUTRA_OK && hybrid) {
      lutra_quantizer_spec col = roles[i];
      col.dtype = col.col_dtype;
      col.col_dtype = 0;
      st = lutra_quantizer_create(&col, 0, 1, c->device, &fresh_col[i], fn);
    }
    if (st != LUTRA_OK) {
      lutra_linear_core_free_quantizers(fresh);
      lutra_linear_core_free_quantizers(fresh_col);
      return st;
    }
  }
  return LUTRA_OK;
}

void lutra_linear_core_install_quantizers(lutra_linear_core *c, const lutra_recipe *r,
                                          lutra_quantizer *fresh[LUTRA_NUM_ROLES],
                                          lutra_quantizer *fresh_col[LUTRA_NUM_ROLES]) {
  lutra_linear_core_free_quantizers(c->q);
  lutra_linear_core_free_quantizers(c->qc);
  memcpy(c->q, fresh, sizeof c->q);
  memcpy(c->qc, fresh_col, sizeof c->qc);
  c->qkey = r->key;
  c->quantized_for_recipe = true;
  c->weight_cached = false;
  c->xq = c->wq = c->xqc = c->wqc = NULL;
}

int lutra_linear_core_quantizers(lutra_linear_core *c, const lutra_recipe *build_for,
                                 const char *const *names, lutra_module_quantizers *out,
                                 const char *fn) {
  static const char *const roles[LUTRA_NUM_ROLES] = {"input", "weight", "grad_output"};
  static const char *const col_roles[LUTRA_NUM_ROLES] = {"input_columnwise", "weight_columnwise",
                                                         "grad_output_columnwise"};
  CHECK_ARG(out->count + 2 * LUTRA_NUM_ROLES <= LUTRA_MODULE_MAX_QUANTIZERS,
            "a module owns more than %d quantizers", LUTRA_MODULE_MAX_QUANTIZERS);
  lutra_quantizer *fresh[LUTRA_NUM_ROLES] = {0}, *fresh_col[LUTRA_NUM_ROLES] = {0};
  lutra_quantizer *const *q = c->q, *const *qc = c->qc;
  if (build_for) {
    CHECK_STATE(!c->quantized_for_recipe || c->qkey == build_for->key,
                "the module's quantizers were built for another recipe than the one given");
    if (!c->quantized_for_recipe) {
      /* a factory recipe's choice is the module's, made at its first forward under it */
      CHECK_STATE(build_for->kind != LUTRA_RECIPE_FACTORY ||
                      (c->choice.set && c->choice.key == build_for->key),
                  "a factory recipe chooses a module's quantizers at its first forward: run one "
                  "forward under the recipe before loading its FP8 state");
      TRY(lutra_linear_core_build_quantizers(c, lutra_linear_core_roles(c, build_for), fresh,
                                             fresh_col, fn));
      out->fresh = true;
      q = fresh;
      qc = fresh_col;
    }
  }
  for (int i = 0; i < LUTRA_NUM_ROLES; i++)
    if (qc[i] && names) {
      if (out->fresh) {
        lutra_linear_core_free_quantizers(fresh);
        lutra_linear_core_free_quantizers(fresh_col);
        out->fresh = false;
      }
      return lutra_error(LUTRA_EINVAL, fn,
                         "a hybrid quantizer (columnwise_format) of a module "
                         "with several Linears cannot be checkpointed yet");
    }
  for (int i = 0; i < LUTRA_NUM_ROLES; i++) {
    if (!q[i]) continue;
    out->name[out->count] = names ? names[i] : roles[i];
    out->slot[out->count] = i;
    out->q[out->count++] = q[i];
  }
  for (int i = 0; i < LUTRA_NUM_ROLES; i++) {
    if (!qc[i]) continue;
    out->name[out->count] = col_roles[i];
    out->slot[out->count] = LUTRA_NUM_ROLES + i;
    out->q[out->count++] = qc[i];
  }
  return LUTRA_OK;
}

/* delayed scaling: a quantizer with an amax history, whose scale a save records as it is now,
 * not as it was when the cached weight was quantized */
static bool delayed(lutra_quantizer *q) {
  lutra_quantizer_state_view v;
  return q && lutra_quantizer_state(q, &v) == LUTRA_OK && v.amax_history;
}

bool lutra_linear_core_in_accumulation_window(const lutra_linear_core *c) {
  if (!c->weight_cached || !c->cache_opens_window || (c->weight->flags & LUTRA_TENSOR_UPDATED))
    return false;
  return delayed(c->q[LUTRA_ROLE_WEIGHT]) || delayed(c->qc[LUTRA_ROLE_WEIGHT]);
}

void lutra_linear_core_adopt_quantizers(lutra_linear_core *c, const lutra_recipe *r,
                                        const lutra_module_quantizers *q) {
  lutra_quantizer *fresh[2 * LUTRA_NUM_ROLES] = {0};
  for (int i = 0; i < q->count; i++)
    fresh[q->slot[i]] = q->q[i];
  lutra_linear_core_install_quantizers(c, r, fresh, fresh + LUTRA_NUM_ROLES);
}
