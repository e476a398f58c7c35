/* GroupedLinear in checkpoints (lutra_checkpoint_ops): each expert's parameters named as TE's
 * GroupedLinear names them, "weight0".."weight<num-1>" and "bias0".., and one scaling state per
 * expert and role, "fp8.input0", "fp8.weight0", "fp8.grad_output0", ... (scale, scale_inv, and
 * under delayed scaling the expert's amax_history), views into the role's one allocation. */
#include "nn/grouped/grouped_checkpoint.h"
#include "core/error.h"
#include "fp8/quantizer.h"

#include <stdio.h>
#include <stdlib.h>

int lutra_grouped_param_names(grouped_linear *g, const char *fn) {
  int per = g->has_bias ? 2 : 1;
  g->param_names = calloc((size_t)g->num * (size_t)per, sizeof *g->param_names);
  if (!g->param_names) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate parameter names");
  for (int e = 0; e < g->num; e++) {
    snprintf(g->param_names[e * per], sizeof *g->param_names, "weight%d", e);
    if (g->has_bias) snprintf(g->param_names[e * per + 1], sizeof *g->param_names, "bias%d", e);
  }
  return LUTRA_OK;
}

static const char *grouped_param_name(const lutra_module *m, int i) {
  return ((const grouped_linear *)m)->param_names[i];
}

static int report(const grouped_linear *g, const grouped_role *roles,
                  const lutra_fp8_state_sink *sink, const char *fn) {
  static const char *const role_names[LUTRA_NUM_ROLES] = {"input", "weight", "grad_output"};
  const int64_t n = g->num;
  for (int r = 0; r < LUTRA_NUM_ROLES; r++) {
    const grouped_role *role = &roles[r];
    if (!role->state) continue; /* a role with no per-tensor scaling state (MXFP8, blocks) */
    const int32_t h = role->spec.kind == LUTRA_QUANT_DELAYED ? role->spec.amax_history_len : 0;
    for (int64_t e = 0; e < n; e++) {
      char name[40];
      snprintf(name, sizeof name, "%s%lld", role_names[r], (long long)e);
      lutra_quantizer_state_view v = {.scale = role->state + 4 * e,
                                      .scale_inv = role->state + 4 * n + 4 * e,
                                      .amax_history = h ? role->state + 12 * n + e * h : NULL,
                                      .history_len = h,
                                      .be = g->be};
      TRY(sink->add(sink->ctx, name, &v, fn));
    }
  }
  return LUTRA_OK;
}

static int grouped_fp8_state(lutra_module *m, const lutra_recipe *build_for,
                             const lutra_fp8_state_sink *sink, void **fresh, const char *fn) {
  grouped_linear *g = (grouped_linear *)m;
  *fresh = NULL;
  if (build_for) TRY(lutra_grouped_chosen_recipe(g, build_for, false, &build_for, fn));
  if (build_for && !g->roles_built) {
    grouped_role *f = calloc(LUTRA_NUM_ROLES, sizeof *f);
    if (!f) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate scaling state");
    int st = lutra_grouped_roles_build(g, build_for, f, fn);
    if (st == LUTRA_OK) st = report(g, f, sink, fn);
    if (st != LUTRA_OK) {
      lutra_grouped_roles_free(g, f);
      free(f);
      return st;
    }
    *fresh = f;
    return LUTRA_OK;
  }
  CHECK_STATE(!build_for || g->qkey == build_for->key,
              "the module's quantizers were built for another recipe than the one given");
  return g->roles_built ? report(g, g->roles, sink, fn) : LUTRA_OK;
}

static void grouped_adopt_fp8_state(lutra_module *m, const lutra_recipe *r, void *fresh) {
  lutra_grouped_roles_install((grouped_linear *)m, r, fresh);
  free(fresh);
}

static void grouped_drop_fp8_state(lutra_module *m, void *fresh) {
  lutra_grouped_roles_free((grouped_linear *)m, fresh);
  free(fresh);
}

static bool grouped_in_window(const lutra_module *m) {
  const grouped_linear *g = (const grouped_linear *)m;
  if (!g->weight_cached || !g->cache_opens_window || !g->roles_built ||
      g->roles[LUTRA_ROLE_WEIGHT].spec.kind != LUTRA_QUANT_DELAYED)
    return false;
  for (int64_t e = 0; e < g->num; e++)
    if (g->weight[e]->flags & LUTRA_TENSOR_UPDATED) return false;
  return true;
}

const lutra_checkpoint_ops lutra_grouped_checkpoint = {
    .param_name = grouped_param_name,
    .fp8_state = grouped_fp8_state,
    .adopt_fp8_state = grouped_adopt_fp8_state,
    .drop_fp8_state = grouped_drop_fp8_state,
    .in_accumulation_window = grouped_in_window,
};
