/* GroupedLinear's core: the arguments every grouped call shares, the wgrad pass, and the
 * scaling state of a recipe's roles (one allocation per role for all experts), which the module
 * code, its FP8 passes, its per-expert path and its checkpoint entry all call down into. */
#include "nn/grouped/grouped_core.h"
#include "core/error.h"
#include "fp8/autocast.h"

#include <stdlib.h>
#include <string.h>

void lutra_grouped_common(const grouped_linear *g, int64_t rows, lutra_grouped_gemm_args *a) {
  *a = (lutra_grouped_gemm_args){.num = g->num,
                                 .splits = g->splits_dev->data,
                                 .bad_split = g->bad_split ? g->bad_split->data : NULL,
                                 .scratch = g->scratch,
                                 .total_rows = rows,
                                 .in = g->in,
                                 .out = g->out,
                                 .dtype = g->dtype,
                                 .w = (const void *const *)g->ptrs,
                                 .bias = g->has_bias ? (const void *const *)g->ptrs + g->num : NULL,
                                 .bias_dtype = g->dtype,
                                 /* a cache the backend keeps for the module, not its state */
                                 .call_graphs = (void **)&g->call_graphs};
  if (g->skip_forward_bias) a->bias = NULL;
}

void lutra_grouped_forward_splits(const grouped_linear *g, lutra_grouped_gemm_args *a) {
  a->pass = LUTRA_GROUPED_FPROP;
  a->splits = lutra_grouped_splits_now(g);
  a->save_splits = g->splits_in ? g->splits_dev->data : NULL;
}

int lutra_grouped_wgrad(const grouped_linear *g, lutra_grouped_gemm_args *ga, void *const *db,
                        const char *fn) {
  ga->pass = LUTRA_GROUPED_WGRAD;
  ga->dw = g->ptrs + 2 * g->num;
  ga->dw_dtype = g->accumulate_main_grad ? LUTRA_F32 : g->dtype;
  ga->accumulate = g->accumulate_main_grad;
  ga->db = db;
  ga->bias_dtype = g->accumulate_main_grad ? LUTRA_F32 : g->dtype;
  int st = g->be->grouped_gemm(ga);
  return st == LUTRA_OK ? LUTRA_OK : lutra_error_wrap(st, fn);
}

/* ---- scaling state of the roles ------------------------------------------------------------ */

static void role_free(grouped_linear *g, grouped_role *r) {
  if (r->metas)
    for (int e = 0; e < g->num; e++)
      lutra_autocast_forget(&r->metas[e]);
  free(r->metas);
  if (r->state) g->be->free(r->state);
  memset(r, 0, sizeof *r);
}

static int64_t history_of(const lutra_quantizer_spec *s) {
  return s->kind == LUTRA_QUANT_DELAYED ? s->amax_history_len : 0;
}

static int role_build(grouped_linear *g, const lutra_quantizer_spec *s, grouped_role *r,
                      const char *fn) {
  memset(r, 0, sizeof *r);
  r->spec = *s;
  if (s->kind != LUTRA_QUANT_DELAYED && s->kind != LUTRA_QUANT_CURRENT) return LUTRA_OK;
  /* current scaling: two more words, the tickets of the CUDA cast (quant_args) */
  const int64_t n = g->num, h = history_of(s),
                floats = 12 * n + n * h + (s->kind == LUTRA_QUANT_CURRENT ? 2 : 0);
  float *host = calloc((size_t)floats, sizeof(float));
  if (!host) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate scaling state");
  for (int64_t e = 0; e < n; e++)
    host[4 * e] = host[4 * n + 4 * e] = 1.0f; /* scale, scale_inv */
  int st = g->be->alloc((size_t)floats * sizeof(float), (void **)&r->state);
  if (st == LUTRA_OK) st = g->be->from_host(r->state, host, (size_t)floats * sizeof(float));
  free(host);
  if (st == LUTRA_OK && s->kind == LUTRA_QUANT_DELAYED) {
    r->metas = calloc((size_t)n, sizeof *r->metas);
    if (!r->metas) st = lutra_error(LUTRA_ENOMEM, fn, "cannot allocate scaling metas");
    for (int64_t e = 0; r->metas && e < n; e++)
      r->metas[e] = (lutra_scale_meta){.scale = r->state + 4 * e,
                                       .scale_inv = r->state + 4 * n + 4 * e,
                                       .amax_history = r->state + 12 * n + e * h,
                                       .history_len = (int32_t)h,
                                       .amax_compute_algo = s->amax_compute_algo,
                                       .fp8_max = lutra_dtype_max(s->dtype),
                                       .margin = s->margin};
  }
  if (st != LUTRA_OK) role_free(g, r);
  return st == LUTRA_OK ? LUTRA_OK : lutra_error_wrap(st, fn);
}

int lutra_grouped_roles_build(grouped_linear *g, const lutra_recipe *rec,
                              grouped_role fresh[LUTRA_NUM_ROLES], const char *fn) {
  for (int i = 0; i < LUTRA_NUM_ROLES; i++) {
    int st = role_build(g, &rec->roles[i], &fresh[i], fn);
    if (st != LUTRA_OK) {
      for (int j = 0; j < i; j++)
        role_free(g, &fresh[j]);
      return st;
    }
  }
  return LUTRA_OK;
}

void lutra_grouped_roles_free(grouped_linear *g, grouped_role roles[LUTRA_NUM_ROLES]) {
  for (int i = 0; i < LUTRA_NUM_ROLES; i++)
    role_free(g, &roles[i]);
}

void lutra_grouped_roles_install(grouped_linear *g, const lutra_recipe *rec,
                                 grouped_role fresh[LUTRA_NUM_ROLES]) {
  for (int i = 0; i < LUTRA_NUM_ROLES; i++) {
    role_free(g, &g->roles[i]);
    g->roles[i] = fresh[i];
  }
  g->qkey = rec->key;
  g->roles_built = true;
  g->weight_cached = false;
}

int lutra_grouped_chosen_recipe(grouped_linear *g, const lutra_recipe *r, bool ask,
                                const lutra_recipe **out, const char *fn) {
  if (r->kind != LUTRA_RECIPE_FACTORY) {
    *out = r;
    return LUTRA_OK;
  }
  CHECK_STATE(ask || (g->choice.set && g->choice.key == r->key),
              "a factory recipe chooses a module's quantizers at its first forward: run one "
              "forward under the recipe before loading its FP8 state");
  const lutra_quantizer_spec *roles;
  TRY(lutra_factory_roles(r, &g->choice, &roles, fn));
  if (!g->chosen_set || g->chosen.key != r->key) {
    g->chosen = *r;
    memset(&g->chosen.obj, 0, sizeof g->chosen.obj);
    g->chosen.kind = LUTRA_RECIPE_CUSTOM;
    memcpy(g->chosen.roles, roles, sizeof g->chosen.roles);
    g->chosen_set = true;
  }
  *out = &g->chosen;
  return LUTRA_OK;
}
