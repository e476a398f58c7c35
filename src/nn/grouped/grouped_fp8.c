/* GroupedLinear under FP8: one scaling state per expert and role (delayed scaling: one amax
 * history per expert and role, each a meta of the scope's single fused update), the experts'
 * inputs quantized by one grouped call (each expert with its own amax and scale, its rows padded
 * to the recipe's alignment inside the call) and likewise their weights, which are cached across
 * micro-batches as a Linear's are. */
#include "nn/grouped/grouped_fp8.h"
#include "backend/grouped_layout.h"
#include "core/capture.h"
#include "core/error.h"
#include "fp8/autocast.h"
#include "fp8/quantizer.h"
#include "runtime/skip_flag.h"
#include "runtime/tensor.h"

#include <stdlib.h>
#include <string.h>

static int scaling_of(int kind) {
  switch (kind) {
  case LUTRA_QUANT_DELAYED:
  case LUTRA_QUANT_CURRENT:
    return LUTRA_SCALING_TENSOR;
  case LUTRA_QUANT_MXFP8:
    return LUTRA_SCALING_MXFP8;
  case LUTRA_QUANT_BLOCK_1D:
    return LUTRA_SCALING_BLOCK_1D;
  case LUTRA_QUANT_BLOCK_2D:
    return LUTRA_SCALING_BLOCK_2D;
  default:
    return LUTRA_SCALING_NONE;
  }
}

bool lutra_grouped_cast_takes_act(const lutra_quantizer_spec *s) {
  return s->kind == LUTRA_QUANT_DELAYED || s->kind == LUTRA_QUANT_CURRENT;
}

bool lutra_grouped_uses_delayed(const lutra_recipe *r) {
  for (int i = 0; i < LUTRA_NUM_ROLES; i++)
    if (r->roles[i].kind == LUTRA_QUANT_DELAYED) return true;
  return false;
}

/* ---- scaling state --------------------------------------------------------------------------- */

/* the roles of a recipe, replaced only once all are built */
static int ensure_roles(grouped_linear *g, const lutra_recipe *rec, const char *fn) {
  if (g->roles_built && g->qkey == rec->key) return LUTRA_OK;
  CHECK_STATE(!LUTRA_CAPTURING(), "a GroupedLinear's first FP8 forward (or a new recipe) while "
                                  "capturing a CUDA graph: run the step once eagerly first");
  grouped_role fresh[LUTRA_NUM_ROLES];
  TRY(lutra_grouped_roles_build(g, rec, fresh, fn));
  lutra_grouped_roles_install(g, rec, fresh);
  return LUTRA_OK;
}

/* ---- packed buffers ---------------------------------------------------------------------------
 */

static void buf_free(grouped_linear *g, grouped_fp8_buf *b) {
  void *p[] = {b->q.data, b->q.col_data, b->q.scale_inv, b->q.col_scale_inv};
  for (int i = 0; i < 4; i++)
    if (p[i]) g->be->free(p[i]);
  memset(b, 0, sizeof *b);
}

/* Buffers for experts whose rows sum to at most rows (each padded to align); grown, never
 * shrunk. Scale arrays start zeroed (block layouts' padding entries are never written). */
static int buf_ensure(grouped_linear *g, grouped_fp8_buf *b, const lutra_quantizer_spec *s,
                      int64_t rows, int align, int64_t cols, const char *fn) {
  const int scaling = scaling_of(s->kind);
  const int64_t cap = lutra_grouped_rows_cap(rows, g->num, align);
  if (b->q.data && b->q.scaling == scaling && b->q.dtype == s->dtype && b->q.align == align &&
      b->rows_cap >= cap)
    return LUTRA_OK;
  CHECK_STATE(!LUTRA_CAPTURING(), "a GroupedLinear's FP8 buffers would grow while capturing a "
                                  "CUDA graph: run the step once eagerly with these shapes first");
  grouped_fp8_buf fresh = {.q = {.dtype = s->dtype, .scaling = scaling, .align = align},
                           .rows_cap = cap};
  const size_t ss = (size_t)lutra_grouped_scale_size(scaling);
  const size_t data_bytes = (size_t)(cap * cols);
  const size_t sb = ss * (size_t)lutra_grouped_scale_cap(scaling, rows, g->num, align, cols, false);
  const size_t cb = ss * (size_t)lutra_grouped_scale_cap(scaling, rows, g->num, align, cols, true);
  int st = g->be->alloc(data_bytes ? data_bytes : 1, &fresh.q.data);
  if (st == LUTRA_OK) st = g->be->alloc(data_bytes ? data_bytes : 1, &fresh.q.col_data);
  if (st == LUTRA_OK) st = g->be->alloc(sb, &fresh.q.scale_inv);
  if (st == LUTRA_OK) st = g->be->alloc(cb, &fresh.q.col_scale_inv);
  if (st == LUTRA_OK) st = g->be->memset(fresh.q.scale_inv, 0, sb);
  if (st == LUTRA_OK) st = g->be->memset(fresh.q.col_scale_inv, 0, cb);
  if (st != LUTRA_OK) {
    buf_free(g, &fresh);
    return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate grouped FP8 buffers for %lld rows",
                       (long long)cap);
  }
  buf_free(g, b);
  *b = fresh;
  return LUTRA_OK;
}

/* rows of each expert's tokens are padded alike for the input and grad_output (wgrad pairs
 * their columnwise copies) */
static int token_align(const grouped_linear *g) {
  int a = lutra_grouped_align(scaling_of(g->roles[LUTRA_ROLE_INPUT].spec.kind));
  int b = lutra_grouped_align(scaling_of(g->roles[LUTRA_ROLE_GRAD_OUTPUT].spec.kind));
  return a > b ? a : b;
}

static int weight_align(const lutra_quantizer_spec *s) {
  return s->kind == LUTRA_QUANT_MXFP8 ? 32 : 16;
}

/* ---- grouped quantization ---------------------------------------------------------------------
 */

static lutra_grouped_quant_args quant_args(const grouped_linear *g, const grouped_role *r,
                                           bool record_amax, const grouped_fp8_buf *b) {
  const lutra_quantizer_spec *s = &r->spec;
  const int64_t n = g->num;
  lutra_grouped_quant_args a = {
      .num = g->num,
      .kind = s->kind,
      /* the input's rows are this forward's (in place before its GEMM saves them) */
      .splits =
          r == &g->roles[LUTRA_ROLE_INPUT] ? lutra_grouped_splits_now(g) : g->splits_dev->data,
      .bad_split = g->bad_split ? g->bad_split->data : NULL,
      .scratch = g->scratch,
      .x_dtype = g->dtype,
      .power_2_scale = s->power_2_scale,
      .amax_epsilon = s->amax_epsilon,
      .fp8_max = lutra_dtype_max(s->dtype),
      .block_dim = s->block_dim,
      .out =
          b ? b->q
            : (lutra_grouped_fp8){.dtype = s->dtype, .scaling = LUTRA_SCALING_TENSOR, .align = 16}};
  if (s->kind == LUTRA_QUANT_DELAYED) {
    a.scale = r->state;
    a.amax = record_amax ? r->state + 12 * n : NULL;
    a.amax_stride = s->amax_history_len;
  } else if (s->kind == LUTRA_QUANT_CURRENT) {
    a.scale = r->state;
    a.amax = r->state + 8 * n;
    a.amax_stride = 4;
    a.work = (uint32_t *)(r->state + 8 * n + 1);
    a.tickets = (uint32_t *)(r->state + 12 * n);
  }
  return a;
}

static int note_all(grouped_linear *g, const grouped_role *r, bool backward, const char *fn) {
  if (!r->metas) return LUTRA_OK;
  return backward ? lutra_autocast_note_backward_n(r->metas, g->num, g->device, fn)
                  : lutra_autocast_note_forward_n(r->metas, g->num, g->device, fn);
}

/* x: the rows quantized, or with act the activation's output (forward: its shape) or output
 * gradient (backward: the matrix quantized has the shape of act->pre) */
static int quantize_tokens(grouped_linear *g, const grouped_role *r, const lutra_tensor *x,
                           grouped_fp8_buf *b, void *const *dbias, const grouped_act *act,
                           const char *fn) {
  lutra_grouped_quant_args a = quant_args(g, r, true, b);
  a.total_rows = lutra_rows(x);
  a.cols = act && !act->forward ? lutra_cols(act->pre) : lutra_cols(x);
  a.x = act && act->forward ? NULL : x->data;
  if (act) {
    a.act = act->pre->data;
    a.act_kind = act->kind;
    a.act_forward = act->forward;
    a.act_out = act->out ? act->out->data : NULL;
  }
  a.dbias = dbias;
  a.dbias_dtype = g->accumulate_main_grad ? LUTRA_F32 : g->dtype;
  a.dbias_accumulate = g->accumulate_main_grad;
  int st = g->be->grouped_quantize(&a);
  return st == LUTRA_OK ? LUTRA_OK : lutra_error_wrap(st, fn);
}

static int quantize_weights(grouped_linear *g, const int32_t *skip, const char *fn) {
  const grouped_role *r = &g->roles[LUTRA_ROLE_WEIGHT];
  lutra_grouped_quant_args a = quant_args(g, r, true, &g->wq);
  a.splits = NULL;
  a.xs = (const void *const *)g->ptrs;
  a.rows_each = g->out;
  a.total_rows = (int64_t)g->num * g->out;
  a.cols = g->in;
  a.skip = skip;
  int st = g->be->grouped_quantize(&a);
  return st == LUTRA_OK ? LUTRA_OK : lutra_error_wrap(st, fn);
}

static int check_dims(const grouped_linear *g, const lutra_recipe *rec, const char *fn) {
  static const char *const role_names[LUTRA_NUM_ROLES] = {"input", "weight", "grad_output"};
  const lutra_quantizer_spec *w = &rec->roles[LUTRA_ROLE_WEIGHT];
  CHECK_ARG(w->kind != LUTRA_QUANT_NONE,
            "a recipe that quantizes the input must quantize the weight too");
  for (int i = 0; i < LUTRA_NUM_ROLES; i++) {
    if (rec->roles[i].kind == LUTRA_QUANT_NONE) continue;
    /* NVFP4 would take grouped kernels for its casts (1x16 blocks with E4M3 scales, 16x16
     * weight blocks, the Hadamard transform of the wgrad operands) that lutra has per tensor
     * only, and Hopper would still run the GEMMs as BF16 of the dequantized operands */
    CHECK_ARG(rec->roles[i].kind != LUTRA_QUANT_NVFP4,
              "GroupedLinear has no NVFP4 quantization: its casts have no grouped kernels and "
              "Hopper has no FP4 tensor cores (the GEMMs would run in BF16 anyway); Linear and "
              "the norm-fused modules take NVFP4 for prototyping, GroupedLinear every FP8 recipe");
    /* per-row scales: a grouped cast would have to keep each expert's rows' scales apart, and
     * Hopper runs these GEMMs as BF16 of the dequantized operands as well */
    CHECK_ARG(rec->roles[i].kind != LUTRA_QUANT_ROWWISE,
              "GroupedLinear has no rowwise quantization: its casts have no grouped kernels and "
              "Hopper runs rowwise GEMMs in BF16 anyway; Linear and the norm-fused modules take "
              "it, GroupedLinear the per-tensor, MXFP8 and block recipes");
    /* its grouped casts write the rowwise and columnwise copies in one format */
    CHECK_ARG(rec->roles[i].col_dtype == 0,
              "GroupedLinear has no hybrid roles: the %s role's columnwise copy is in another "
              "format than its rowwise one (columnwise_format), and its grouped casts write both "
              "in one; Linear and the norm-fused modules take hybrid recipes",
              role_names[i]);
    int mult = rec->roles[i].kind == LUTRA_QUANT_MXFP8 ? 32 : 16;
    CHECK_ARG(g->in % mult == 0 && g->out % mult == 0,
              "FP8 needs in_features and out_features to be multiples of %d (got %lld, %lld)", mult,
              (long long)g->in, (long long)g->out);
  }
  return LUTRA_OK;
}

int lutra_grouped_fp8_forward(grouped_linear *g, const lutra_tensor *x, const lutra_recipe *rec,
                              int first_microbatch, const grouped_act *act, const char *fn) {
  TRY(check_dims(g, rec, fn));
  TRY(ensure_roles(g, rec, fn));
  const int32_t *skip = NULL;
  /* a weight loaded since its cast: the cache holds another run's weights, never reused */
  bool loaded = false;
  for (int64_t e = 0; e < g->num; e++)
    loaded = loaded || (g->weight[e]->flags & LUTRA_TENSOR_LOADED) != 0;
  if (first_microbatch == LUTRA_FIRST_MICROBATCH_DEVICE) {
    bool host_skip;
    TRY(lutra_skip_weight_flag(g->device, &skip, &host_skip, fn));
    CHECK_STATE(g->weight_cached || !host_skip,
                "the skip-weight-update flag is set but this GroupedLinear has no quantized "
                "weights yet (first FP8 forward, or the recipe changed): run it with the flag 0 "
                "first");
    CHECK_STATE(!loaded || !host_skip,
                "the skip-weight-update flag is set but this GroupedLinear's weights were loaded "
                "from a checkpoint since they were quantized: run it with the flag 0 first");
  }
  const grouped_role *ri = &g->roles[LUTRA_ROLE_INPUT], *rw = &g->roles[LUTRA_ROLE_WEIGHT];
  TRY(buf_ensure(g, &g->xq, &ri->spec, lutra_rows(x), token_align(g), g->in, fn));
  TRY(buf_ensure(g, &g->wq, &rw->spec, (int64_t)g->num * g->out, weight_align(&rw->spec), g->in,
                 fn));
  TRY(quantize_tokens(g, ri, x, &g->xq, NULL, act, fn));
  TRY(note_all(g, ri, false, fn));
  if (!(first_microbatch == 0 && g->weight_cached && !loaded)) {
    TRY(quantize_weights(g, skip, fn));
    TRY(note_all(g, rw, false, fn));
    g->weight_cached = true;
    g->cache_opens_window = first_microbatch == 1;
    for (int64_t e = 0; e < g->num; e++)
      g->weight[e]->flags &= ~(uint32_t)(LUTRA_TENSOR_UPDATED | LUTRA_TENSOR_LOADED);
  }
  lutra_grouped_gemm_args ga;
  lutra_grouped_common(g, lutra_rows(x), &ga);
  lutra_grouped_forward_splits(g, &ga);
  ga.fp8 = 1;
  ga.fast_accum = 1;
  ga.xq = g->xq.q;
  ga.wq = g->wq.q;
  ga.y = g->y->data;
  int st = g->be->grouped_gemm(&ga);
  return st == LUTRA_OK ? LUTRA_OK : lutra_error_wrap(st, fn);
}

int lutra_grouped_fp8_backward(grouped_linear *g, const lutra_tensor *dy, bool dx_wanted,
                               const grouped_act *act, const char *fn) {
  const grouped_role *rg = &g->roles[LUTRA_ROLE_GRAD_OUTPUT];
  TRY(buf_ensure(g, &g->dyq, &rg->spec, g->rows, token_align(g), g->out, fn));
  void *const *dbias = g->has_bias ? g->ptrs + 3 * g->num : NULL;
  TRY(quantize_tokens(g, rg, dy, &g->dyq, dbias, act, fn));
  TRY(note_all(g, rg, true, fn));
  lutra_grouped_gemm_args ga;
  lutra_grouped_common(g, g->rows, &ga);
  ga.fp8 = 1;
  ga.xq = g->xq.q;
  ga.wq = g->wq.q;
  ga.dyq = g->dyq.q;
  if (dx_wanted) {
    ga.pass = LUTRA_GROUPED_DGRAD;
    ga.dx = g->dx->data;
    int st = g->be->grouped_gemm(&ga);
    if (st != LUTRA_OK) return lutra_error_wrap(st, fn);
  }
  return lutra_grouped_wgrad(g, &ga, NULL, fn);
}

/* calibration: delayed scaling records each expert's amax of input and weight, nothing else */
int lutra_grouped_observe(grouped_linear *g, const lutra_tensor *x, const lutra_recipe *rec,
                          const char *fn) {
  TRY(ensure_roles(g, rec, fn));
  const grouped_role *ri = &g->roles[LUTRA_ROLE_INPUT], *rw = &g->roles[LUTRA_ROLE_WEIGHT];
  if (ri->spec.kind == LUTRA_QUANT_DELAYED) {
    TRY(quantize_tokens(g, ri, x, NULL, NULL, NULL, fn));
    TRY(note_all(g, ri, false, fn));
  }
  if (rw->spec.kind == LUTRA_QUANT_DELAYED) {
    lutra_grouped_quant_args a = quant_args(g, rw, true, NULL);
    a.xs = (const void *const *)g->ptrs;
    a.rows_each = g->out;
    a.total_rows = (int64_t)g->num * g->out;
    a.cols = g->in;
    int st = g->be->grouped_quantize(&a);
    if (st != LUTRA_OK) return lutra_error_wrap(st, fn);
    TRY(note_all(g, rw, false, fn));
  }
  return LUTRA_OK;
}

void lutra_grouped_fp8_release(grouped_linear *g) {
  lutra_grouped_roles_free(g, g->roles);
  buf_free(g, &g->xq);
  buf_free(g, &g->wq);
  buf_free(g, &g->dyq);
  g->roles_built = false;
}
