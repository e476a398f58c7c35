/* Recipes: validated once at creation, immutable afterwards. A recipe is reduced to one
 * quantizer spec per tensor role, which is all that quantizers and modules ever read. */
#include "fp8/recipe.h"
#include "core/error.h"
#include "core/object.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

void lutra_delayed_defaults(lutra_delayed_desc *d) {
  if (!d) return;
  memset(d, 0, sizeof *d);
  d->fp8_format = LUTRA_FORMAT_HYBRID;
  d->margin = 0;
  d->amax_history_len = 1024;
  d->amax_compute_algo = LUTRA_AMAX_MAX;
  d->reduce_amax = 1;
}

void lutra_current_defaults(lutra_current_desc *d) {
  if (!d) return;
  memset(d, 0, sizeof *d);
  d->fp8_format = LUTRA_FORMAT_HYBRID;
}

void lutra_mxfp8_defaults(lutra_mxfp8_desc *d) {
  if (!d) return;
  memset(d, 0, sizeof *d);
  d->fp8_format = LUTRA_FORMAT_E4M3;
}

void lutra_block_defaults(lutra_block_desc *d) {
  if (!d) return;
  memset(d, 0, sizeof *d);
  d->fp8_format = LUTRA_FORMAT_E4M3;
  for (int i = 0; i < LUTRA_NUM_ROLES; i++)
    d->power_2_scale[i] = 1;
  d->block_dim[LUTRA_ROLE_INPUT] = 1;
  d->block_dim[LUTRA_ROLE_WEIGHT] = 2;
  d->block_dim[LUTRA_ROLE_GRAD_OUTPUT] = 1;
}

/* every recipe starts with these (recipe_options.c makes recipes with others) */
void lutra_recipe_options_defaults(lutra_recipe_options *o) {
  if (!o) return;
  *o = (lutra_recipe_options){.use_split_accumulator = {0, 1, 1},
                              .backward_override = LUTRA_BACKWARD_FP8};
}

void lutra_custom_defaults(lutra_custom_desc *d) {
  if (!d) return;
  memset(d, 0, sizeof *d);
  for (int i = 0; i < LUTRA_NUM_ROLES; i++) {
    d->kind[i] = LUTRA_QUANT_CURRENT;
    d->format[i] = i == LUTRA_ROLE_GRAD_OUTPUT ? LUTRA_E5M2 : LUTRA_E4M3;
  }
  d->amax_history_len = 1024;
  d->amax_compute_algo = LUTRA_AMAX_MAX;
  d->reduce_amax = 1;
  d->rht_signs = LUTRA_NVFP4_TE_SIGNS;
}

static const char *const role_names[LUTRA_NUM_ROLES] = {"input", "weight", "grad_output"};

/* HYBRID: E4M3 forward, E5M2 for gradients. Pure E5M2 training is refused, as TE does. */
static int format_dtypes(int format, int dtypes[LUTRA_NUM_ROLES], const char *fn) {
  if (format == LUTRA_FORMAT_E5M2)
    return lutra_error(LUTRA_EINVAL, fn,
                       "fp8_format E5M2 is not supported (pure E5M2 training; use HYBRID or E4M3)");
  if (format != LUTRA_FORMAT_E4M3 && format != LUTRA_FORMAT_HYBRID)
    return lutra_error(LUTRA_EINVAL, fn, "unknown fp8_format %d", format);
  dtypes[LUTRA_ROLE_INPUT] = LUTRA_E4M3;
  dtypes[LUTRA_ROLE_WEIGHT] = LUTRA_E4M3;
  dtypes[LUTRA_ROLE_GRAD_OUTPUT] = format == LUTRA_FORMAT_HYBRID ? LUTRA_E5M2 : LUTRA_E4M3;
  return LUTRA_OK;
}

/* scale = fp8_max / 2^margin / amax. With margin <= 32 the scale is a normal float for every
 * amax up to 2^100 (E4M3: 448 / 2^32 / 2^100 > FLT_MIN) and scale_inv stays finite; a margin
 * of 200 made 2^margin infinite, the scale 0 and scale_inv inf. */
enum { MAX_MARGIN = 32 };
static int check_margin(int margin, const char *fn) {
  CHECK_ARG(margin >= 0 && margin <= MAX_MARGIN,
            "margin must be in 0..%d so that the scale fp8_max / amax / 2^margin stays a normal "
            "float (got %d)",
            MAX_MARGIN, margin);
  return LUTRA_OK;
}

static int check_delayed_fields(int margin, int history_len, int algo, const char *fn) {
  TRY(check_margin(margin, fn));
  CHECK_ARG(history_len >= 1, "amax_history_len must be >= 1 (got %d)", history_len);
  CHECK_ARG(history_len <= 1 << 20, "amax_history_len %d is too long", history_len);
  CHECK_ARG(algo == LUTRA_AMAX_MAX || algo == LUTRA_AMAX_MOST_RECENT,
            "unknown amax_compute_algo %d (expected 'max' or 'most_recent')", algo);
  return LUTRA_OK;
}

static int check_epsilon(const float eps[LUTRA_NUM_ROLES], const char *fn) {
  for (int i = 0; i < LUTRA_NUM_ROLES; i++)
    CHECK_ARG(isfinite(eps[i]) && eps[i] >= 0, "amax_epsilon for %s must be finite and >= 0",
              role_names[i]);
  return LUTRA_OK;
}

static uint64_t fnv1a(const void *p, size_t n, uint64_t h) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

/* The key covers every field that changes numerics; the struct is zero-filled, so padding and
 * unused fields hash the same for equal recipes. */
int lutra_recipe_finish(lutra_recipe *tmpl, lutra_recipe **out, const char *fn) {
  CHECK_ARG(out, "out is NULL");
  lutra_recipe *r = malloc(sizeof *r);
  if (!r) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a recipe");
  *r = *tmpl;
  r->obj.magic = LUTRA_MAGIC_RECIPE;
  r->obj.refs = 1;
  uint64_t h = 0xcbf29ce484222325ull;
  h = fnv1a(&r->kind, sizeof r->kind, h);
  h = fnv1a(&r->reduce_amax, sizeof r->reduce_amax, h);
  h = fnv1a(&r->factory, sizeof r->factory, h);
  h = fnv1a(&r->options, sizeof r->options, h);
  r->key = fnv1a(r->roles, sizeof r->roles, h);
  *out = r;
  return LUTRA_OK;
}

static void init(lutra_recipe *r, int kind) {
  memset(r, 0, sizeof *r);
  r->kind = kind;
  lutra_recipe_options_defaults(&r->options);
}

int lutra_recipe_delayed(const lutra_delayed_desc *d, lutra_recipe **out) {
  static const char fn[] = "lutra_recipe_delayed";
  CHECK_ARG(d, "desc is NULL");
  int dt[LUTRA_NUM_ROLES];
  TRY(format_dtypes(d->fp8_format, dt, fn));
  TRY(check_delayed_fields(d->margin, d->amax_history_len, d->amax_compute_algo, fn));
  CHECK_ARG(d->rule >= 0, "rule must be >= 0 (an id from the rule's registrar; 0: none)");
  lutra_recipe r;
  init(&r, LUTRA_RECIPE_DELAYED);
  r.reduce_amax = d->reduce_amax != 0;
  for (int i = 0; i < LUTRA_NUM_ROLES; i++) {
    lutra_quantizer_spec *s = &r.roles[i];
    s->kind = LUTRA_QUANT_DELAYED;
    s->dtype = dt[i];
    s->margin = d->margin;
    s->amax_history_len = d->amax_history_len;
    s->amax_compute_algo = d->amax_compute_algo;
    s->rule = d->rule;
  }
  return lutra_recipe_finish(&r, out, fn);
}

int lutra_recipe_current(const lutra_current_desc *d, lutra_recipe **out) {
  static const char fn[] = "lutra_recipe_current";
  CHECK_ARG(d, "desc is NULL");
  int dt[LUTRA_NUM_ROLES];
  TRY(format_dtypes(d->fp8_format, dt, fn));
  TRY(check_epsilon(d->amax_epsilon, fn));
  lutra_recipe r;
  init(&r, LUTRA_RECIPE_CURRENT);
  for (int i = 0; i < LUTRA_NUM_ROLES; i++) {
    lutra_quantizer_spec *s = &r.roles[i];
    s->kind = LUTRA_QUANT_CURRENT;
    s->dtype = dt[i];
    s->power_2_scale = d->power_2_scale[i] != 0;
    s->amax_epsilon = d->amax_epsilon[i];
  }
  return lutra_recipe_finish(&r, out, fn);
}

int lutra_recipe_mxfp8(const lutra_mxfp8_desc *d, lutra_recipe **out) {
  static const char fn[] = "lutra_recipe_mxfp8";
  CHECK_ARG(d, "desc is NULL");
  int dt[LUTRA_NUM_ROLES];
  TRY(format_dtypes(d->fp8_format, dt, fn));
  /* TE keeps the field but MXFP8 scales ignore it: refuse what would be silently dropped */
  CHECK_ARG(d->margin == 0, "margin must be 0 for MXFP8 (got %d)", d->margin);
  lutra_recipe r;
  init(&r, LUTRA_RECIPE_MXFP8);
  for (int i = 0; i < LUTRA_NUM_ROLES; i++) {
    r.roles[i].kind = LUTRA_QUANT_MXFP8;
    r.roles[i].dtype = dt[i];
    r.roles[i].margin = d->margin;
  }
  return lutra_recipe_finish(&r, out, fn);
}

int lutra_recipe_block(const lutra_block_desc *d, lutra_recipe **out) {
  static const char fn[] = "lutra_recipe_block";
  CHECK_ARG(d, "desc is NULL");
  int dt[LUTRA_NUM_ROLES];
  TRY(format_dtypes(d->fp8_format, dt, fn));
  TRY(check_epsilon(d->amax_epsilon, fn));
  lutra_recipe r;
  init(&r, LUTRA_RECIPE_BLOCK);
  for (int i = 0; i < LUTRA_NUM_ROLES; i++) {
    CHECK_ARG(d->block_dim[i] == 1 || d->block_dim[i] == 2,
              "block_dim for %s must be 1 (1x128) or 2 (128x128), got %d", role_names[i],
              d->block_dim[i]);
    lutra_quantizer_spec *s = &r.roles[i];
    s->kind = d->block_dim[i] == 1 ? LUTRA_QUANT_BLOCK_1D : LUTRA_QUANT_BLOCK_2D;
    s->dtype = dt[i];
    s->power_2_scale = d->power_2_scale[i] != 0;
    s->amax_epsilon = d->amax_epsilon[i];
    s->block_dim = d->block_dim[i];
  }
  return lutra_recipe_finish(&r, out, fn);
}

/* The quantizer specs of a custom recipe's desc, validated (also for the choices of a factory
 * recipe, lutra/factory.h). */
int lutra_recipe_custom_specs(const lutra_custom_desc *d,
                              lutra_quantizer_spec roles[LUTRA_NUM_ROLES], const char *fn) {
  TRY(check_epsilon(d->amax_epsilon, fn));
  /* margin is checked even without a delayed role: a value no recipe could use is a mistake */
  TRY(check_margin(d->margin, fn));
  CHECK_ARG(d->rule >= 0, "rule must be >= 0 (an id from the rule's registrar; 0: none)");
  lutra_quantizer_spec out[LUTRA_NUM_ROLES];
  memset(out, 0, sizeof out);
  for (int i = 0; i < LUTRA_NUM_ROLES; i++) {
    int k = d->kind[i];
    CHECK_ARG(k >= LUTRA_QUANT_NONE && k <= LUTRA_QUANT_NVFP4, "unknown quantizer kind %d for %s",
              k, role_names[i]);
    if (k == LUTRA_QUANT_NVFP4) TRY(lutra_nvfp4_check_role(d, i, role_names[i], fn));
    CHECK_ARG(k == LUTRA_QUANT_NONE || k == LUTRA_QUANT_NVFP4 || d->format[i] == LUTRA_E4M3 ||
                  d->format[i] == LUTRA_E5M2,
              "format for %s must be e4m3 or e5m2", role_names[i]);
    if (k == LUTRA_QUANT_DELAYED)
      TRY(check_delayed_fields(d->margin, d->amax_history_len, d->amax_compute_algo, fn));
    lutra_quantizer_spec *s = &out[i];
    s->kind = k;
    if (k == LUTRA_QUANT_NONE) continue;
    s->dtype = d->format[i];
    if (k == LUTRA_QUANT_CURRENT || k == LUTRA_QUANT_BLOCK_1D || k == LUTRA_QUANT_BLOCK_2D ||
        k == LUTRA_QUANT_ROWWISE) {
      s->power_2_scale = d->power_2_scale[i] != 0;
      s->amax_epsilon = d->amax_epsilon[i];
    }
    if (k == LUTRA_QUANT_DELAYED) {
      s->margin = d->margin;
      s->amax_history_len = d->amax_history_len;
      s->amax_compute_algo = d->amax_compute_algo;
      s->rule = d->rule;
    }
    if (k == LUTRA_QUANT_BLOCK_1D || k == LUTRA_QUANT_BLOCK_2D)
      s->block_dim = k == LUTRA_QUANT_BLOCK_1D ? 1 : 2;
    if (k == LUTRA_QUANT_NVFP4) {
      s->nvfp4 = d->nvfp4[i];
      s->rht_signs = d->rht_signs;
      s->seed = d->nvfp4_seed;
    }
    const int cf = d->columnwise_format[i];
    CHECK_ARG(cf == 0 || cf == LUTRA_E4M3 || cf == LUTRA_E5M2,
              "columnwise_format for %s must be e4m3 or e5m2", role_names[i]);
    s->col_dtype = cf && cf != s->dtype ? cf : 0;
  }
  /* Hopper's FP8 GEMMs (cuBLASLt) take E4M3 x E4M3 or E4M3 x E5M2, never E5M2 x E5M2: check
   * the three GEMMs of a Linear now rather than at the first backward that would run them,
   * each with the copies it reads (fprop: the rowwise input and weight; dgrad: the rowwise
   * gradient and the columnwise weight; wgrad: the columnwise gradient and input) */
  static const struct {
    int a, b;
    bool a_col, b_col;
    const char *gemm;
  } pairs[] = {{LUTRA_ROLE_INPUT, LUTRA_ROLE_WEIGHT, false, false, "fprop"},
               {LUTRA_ROLE_GRAD_OUTPUT, LUTRA_ROLE_WEIGHT, false, true, "dgrad"},
               {LUTRA_ROLE_GRAD_OUTPUT, LUTRA_ROLE_INPUT, true, true, "wgrad"}};
  for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
    const lutra_quantizer_spec *x = &out[pairs[i].a], *y = &out[pairs[i].b];
    const int xd = pairs[i].a_col && x->col_dtype ? x->col_dtype : x->dtype;
    const int yd = pairs[i].b_col && y->col_dtype ? y->col_dtype : y->dtype;
    CHECK_ARG(!(x->kind != LUTRA_QUANT_NONE && y->kind != LUTRA_QUANT_NONE && xd == LUTRA_E5M2 &&
                yd == LUTRA_E5M2),
              "%s%s and %s%s cannot both be e5m2 (the %s GEMM would be E5M2 x E5M2, which FP8 "
              "GEMMs do not run)",
              role_names[pairs[i].a],
              x->col_dtype ? (pairs[i].a_col ? " (columnwise)" : " (rowwise)") : "",
              role_names[pairs[i].b],
              y->col_dtype ? (pairs[i].b_col ? " (columnwise)" : " (rowwise)") : "", pairs[i].gemm);
  }
  TRY(lutra_nvfp4_check_pairs(out, role_names, fn));
  CHECK_ARG((out[LUTRA_ROLE_INPUT].kind == LUTRA_QUANT_NONE) ==
                (out[LUTRA_ROLE_WEIGHT].kind == LUTRA_QUANT_NONE),
            "input and weight must both be quantized or both be kept in high precision");
  memcpy(roles, out, sizeof out);
  return LUTRA_OK;
}

int lutra_recipe_custom(const lutra_custom_desc *d, lutra_recipe **out) {
  static const char fn[] = "lutra_recipe_custom";
  CHECK_ARG(d, "desc is NULL");
  lutra_recipe r;
  init(&r, LUTRA_RECIPE_CUSTOM);
  r.reduce_amax = d->reduce_amax != 0;
  TRY(lutra_recipe_custom_specs(d, r.roles, fn));
  return lutra_recipe_finish(&r, out, fn);
}

/* A factory recipe (lutra/factory.h): the desc's delayed fields are kept for the choices, the
 * roles say "delayed" until a module resolves its own. */
int lutra_recipe_factory(const lutra_factory_desc *d, lutra_recipe **out) {
  static const char fn[] = "lutra_recipe_factory";
  CHECK_ARG(d, "desc is NULL");
  CHECK_ARG(d->factory > 0, "factory must be > 0 (an id from the front's registrar)");
  lutra_custom_desc base;
  lutra_custom_defaults(&base);
  base.margin = d->margin;
  base.amax_history_len = d->amax_history_len;
  base.amax_compute_algo = d->amax_compute_algo;
  base.reduce_amax = d->reduce_amax;
  base.rule = d->rule;
  base.rht_signs = d->rht_signs;
  base.nvfp4_seed = d->nvfp4_seed;
  for (int i = 0; i < LUTRA_NUM_ROLES; i++)
    base.kind[i] = LUTRA_QUANT_DELAYED; /* checks the delayed fields once, here */
  lutra_recipe r;
  init(&r, LUTRA_RECIPE_FACTORY);
  r.reduce_amax = d->reduce_amax != 0;
  TRY(lutra_recipe_custom_specs(&base, r.roles, fn));
  r.factory = d->factory;
  r.factory_base = base;
  return lutra_recipe_finish(&r, out, fn);
}

void lutra_factory_defaults(lutra_factory_desc *d) {
  if (!d) return;
  memset(d, 0, sizeof *d);
  d->amax_history_len = 1024;
  d->amax_compute_algo = LUTRA_AMAX_MAX;
  d->reduce_amax = 1;
  d->rht_signs = LUTRA_NVFP4_TE_SIGNS;
}

/* Autocast scopes hold a reference, so a recipe lives as long as a scope that uses it. */
int lutra_recipe_unref(lutra_recipe *r) {
  if (!r) return LUTRA_OK;
  if (--r->obj.refs <= 0) free(r);
  return LUTRA_OK;
}

/* Recipes own no buffers: release only marks the caller's handle dead. */
int lutra_recipe_destroy(lutra_recipe *r) {
  static const char fn[] = "lutra_recipe_destroy";
  TRY(lutra_check_object(r, LUTRA_MAGIC_RECIPE, fn, "recipe"));
  r->obj.flags |= LUTRA_OBJ_FREED;
  return LUTRA_OK;
}

int lutra_recipe_kind(const lutra_recipe *r, int *kind) {
  static const char fn[] = "lutra_recipe_kind";
  TRY(lutra_check_object(r, LUTRA_MAGIC_RECIPE, fn, "recipe"));
  CHECK_ARG(kind, "kind is NULL");
  *kind = r->kind;
  return LUTRA_OK;
}

int lutra_recipe_role(const lutra_recipe *r, int role, int *quant_kind, int *dtype) {
  static const char fn[] = "lutra_recipe_role";
  TRY(lutra_check_object(r, LUTRA_MAGIC_RECIPE, fn, "recipe"));
  CHECK_ARG(role >= 0 && role < LUTRA_NUM_ROLES, "unknown role %d", role);
  CHECK_ARG(quant_kind && dtype, "output pointers must not be NULL");
  *quant_kind = r->roles[role].kind;
  *dtype = r->roles[role].dtype;
  return LUTRA_OK;
}

int lutra_recipe_key(const lutra_recipe *r, uint64_t *key) {
  static const char fn[] = "lutra_recipe_key";
  TRY(lutra_check_object(r, LUTRA_MAGIC_RECIPE, fn, "recipe"));
  CHECK_ARG(key, "key is NULL");
  *key = r->key;
  return LUTRA_OK;
}
