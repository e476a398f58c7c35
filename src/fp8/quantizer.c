/* Quantizers: one per tensor role, built from a recipe's spec. A quantizer owns its scaling
 * state (delayed: scale, scale_inv and the amax history; current: an amax and a scale) in one
 * backend allocation, and its output tensor, which is reused while the input shape stays. */
#include "fp8/quantizer.h"
#include "backend/backend.h"
#include "backend/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/fp4.h"
#include "core/object.h"
#include "core/trace.h"
#include "fp8/autocast.h"
#include "fp8/recipe.h"
#include "runtime/tensor.h"
#include "runtime/tensor_cache.h"

#include <stdlib.h>
#include <string.h>

struct lutra_quantizer {
  lutra_object obj;
  lutra_quantizer_spec spec;
  int32_t device;
  bool rowwise, columnwise;
  bool user_owned; /* made by lutra_quantizer_new; else owned by a module */
  int32_t held;    /* references lutra_quantizer_retain took (lutra_quantizer_unref drops) */
  const lutra_backend *be;
  lutra_scale_meta meta;   /* delayed scaling; current scaling uses meta.scale and amax */
  float *amax;             /* current scaling: this call's amax */
  uint32_t *work;          /* current scaling: 2 words, zero between calls (current_scale) */
  void *state;             /* one backend allocation behind meta, amax and work */
  lutra_tensor *out;       /* the last output: one of outs */
  lutra_tensor_cache outs; /* the outputs, one per shape and layout seen */
  uint64_t calls;          /* NVFP4: quantizations so far (each draws its own SR seed) */
};

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
  case LUTRA_QUANT_ROWWISE:
    return LUTRA_SCALING_ROWWISE;
  case LUTRA_QUANT_NVFP4:
    return LUTRA_SCALING_NVFP4;
  default:
    return LUTRA_SCALING_NONE;
  }
}

/* State layout, each slot 16-byte aligned for cuBLASLt: scale | scale_inv | amax | history. The
 * amax slot's words 1 and 2 are current scaling's work words (zeroed here, left zero by every
 * current_scale call). */
enum { SLOT = 4 };

int lutra_quantizer_create(const lutra_quantizer_spec *s, int rowwise, int columnwise, int device,
                           lutra_quantizer **out, const char *fn) {
  CHECK_ARG(s->kind != LUTRA_QUANT_NONE, "this role is kept in high precision by the recipe");
  CHECK_ARG(rowwise || columnwise, "at least one of rowwise and columnwise output is needed");
  const lutra_backend *be;
  TRY(lutra_backend_get(device, &be, fn));
  lutra_quantizer *q = calloc(1, sizeof *q);
  if (!q) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a quantizer");
  q->obj.magic = LUTRA_MAGIC_QUANTIZER;
  q->obj.refs = 1;
  q->spec = *s;
  q->device = device;
  q->rowwise = rowwise != 0;
  q->columnwise = columnwise != 0;
  q->be = be;
  int hist = s->kind == LUTRA_QUANT_DELAYED ? s->amax_history_len : 0;
  size_t nfloats = 3 * SLOT + (size_t)hist;
  float *init = calloc(nfloats, sizeof(float));
  bool backend_failed = init != NULL;
  /* the backend's own status and message reach the caller (a failed transfer is no ENOMEM) */
  int st = init ? be->alloc(nfloats * sizeof(float), &q->state)
                : lutra_error(LUTRA_ENOMEM, fn, "cannot allocate quantizer state");
  if (st == LUTRA_OK) {
    init[0] = 1.0f;    /* scale */
    init[SLOT] = 1.0f; /* scale_inv */
    st = be->from_host(q->state, init, nfloats * sizeof(float));
  }
  free(init);
  if (st != LUTRA_OK) {
    if (q->state) be->free(q->state);
    free(q);
    return backend_failed ? lutra_error_wrap(st, fn) : st;
  }
  float *f = q->state;
  q->meta.scale = f;
  q->meta.scale_inv = f + SLOT;
  q->amax = f + 2 * SLOT;
  q->work = (uint32_t *)(f + 2 * SLOT + 1);
  q->meta.amax_history = hist ? f + 3 * SLOT : NULL;
  q->meta.history_len = hist;
  q->meta.amax_compute_algo = s->amax_compute_algo;
  q->meta.fp8_max = lutra_dtype_max(s->dtype);
  q->meta.margin = s->margin;
  q->meta.rule = s->rule;
  *out = q;
  return LUTRA_OK;
}

static void drop_resources(lutra_quantizer *q) {
  lutra_autocast_forget(&q->meta);
  if (q->state) q->be->free(q->state);
  lutra_tensor_cache_release(&q->outs);
  q->state = NULL;
  q->out = NULL;
}

static void drop_ref(lutra_quantizer *q) {
  if (!q || --q->obj.refs > 0) return;
  if (!(q->obj.flags & LUTRA_OBJ_FREED)) drop_resources(q);
  free(q);
}

/* A module letting go of its quantizer (freed, or rebuilt for a new recipe): a handle Lua still
 * holds (module:quantizer()) keeps the struct, marked FREED, so its calls fail cleanly. */
void lutra_quantizer_owner_drop(lutra_quantizer *q) {
  if (!q) return;
  if (q->obj.refs > 1 && !(q->obj.flags & LUTRA_OBJ_FREED)) {
    drop_resources(q);
    q->obj.flags |= LUTRA_OBJ_FREED;
  }
  drop_ref(q);
}

lutra_scale_meta *lutra_quantizer_meta(lutra_quantizer *q) {
  return q->spec.kind == LUTRA_QUANT_DELAYED ? &q->meta : NULL;
}

static int check_dims(const lutra_quantizer_spec *s, int dtype, int64_t rows, int64_t cols,
                      const char *fn) {
  CHECK_ARG(lutra_dtype_is_float(dtype), "input dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(dtype));
  int mult = s->kind == LUTRA_QUANT_MXFP8 ? 32 : 16;
  CHECK_ARG(rows % mult == 0 && cols % mult == 0,
            "%s needs both matrix dims to be multiples of %d (got %lldx%lld)",
            s->kind == LUTRA_QUANT_NVFP4 ? "NVFP4" : "FP8", mult, (long long)rows, (long long)cols);
  return LUTRA_OK;
}

int lutra_quantizer_check_input(const lutra_quantizer_spec *s, const lutra_tensor *x,
                                const char *fn) {
  return check_dims(s, x->dtype, lutra_rows(x), lutra_cols(x), fn);
}

bool lutra_quantizer_takes_act(const lutra_quantizer *q) {
  return q->spec.kind == LUTRA_QUANT_DELAYED ||
         (q->spec.kind == LUTRA_QUANT_CURRENT && q->be->current_scale_act);
}

/* The matrix a quantization with an activation quantizes: its shape (into shape, ndim) after
 * checking the activation's tensors against each other. */
static int act_matrix_shape(const lutra_quantizer *q, const lutra_quantize_op *op, int64_t *shape,
                            int *ndim, const char *fn) {
  const lutra_tensor *x = op->x, *pre = op->act ? op->act : x;
  const int kind = op->act_kind ? op->act_kind : LUTRA_ACT_GELU_TANH;
  CHECK_ARG(kind > LUTRA_ACT_NONE && kind < LUTRA_ACT_COUNT, "unknown activation kind %d", kind);
  CHECK_ARG(lutra_quantizer_takes_act(q),
            "an activation inside the cast needs per-tensor scaling (delayed, or current where "
            "the backend computes the activation's amax)");
  CHECK_ARG(!(op->act && op->act_forward), "act and act_forward are exclusive");
  const bool gated = lutra_act_is_gated(kind);
  CHECK_ARG(pre->ndim >= 1, "the activation's input needs a last dim");
  const int64_t last = pre->shape[pre->ndim - 1];
  CHECK_ARG(!gated || last % 2 == 0,
            "the input's last dim %lld is odd: a gated activation splits it into two halves",
            (long long)last);
  *ndim = pre->ndim;
  memcpy(shape, pre->shape, sizeof(int64_t) * LUTRA_MAX_DIMS);
  if (op->act_forward) {
    if (gated) shape[pre->ndim - 1] = last / 2;
  } else {
    /* x is the gradient of the activation's output: pre's shape, half the last dim if gated */
    bool fits = x->ndim == pre->ndim && x->dtype == pre->dtype && x->device == pre->device;
    for (int i = 0; fits && i < pre->ndim; i++)
      fits = x->shape[i] == (gated && i == pre->ndim - 1 ? last / 2 : pre->shape[i]);
    CHECK_ARG(fits, "the activation's input does not match the gradient in dtype, shape or device");
  }
  if (op->act_out) {
    bool fits = op->act_out->ndim == *ndim && op->act_out->dtype == x->dtype &&
                op->act_out->device == q->device && op->act_out->data;
    for (int i = 0; fits && i < *ndim; i++)
      fits = op->act_out->shape[i] == shape[i];
    CHECK_ARG(fits, "act_out does not match the activation's matrix in dtype, shape or device");
  }
  return LUTRA_OK;
}

/* Calibration: a delayed quantizer records max|x| without quantizing; others have nothing to do. */
static int observe(lutra_quantizer *q, const lutra_tensor *x, const char *fn) {
  CHECK_ARG(x->device == q->device, "input is on another device than the quantizer");
  if (q->spec.kind != LUTRA_QUANT_DELAYED) return LUTRA_OK;
  return q->be->amax(x->data, x->dtype, x->numel, q->meta.amax_history);
}

/* the bias gradient of x summed after a quantization that does not fuse it */
static int unfused_dbias(const lutra_backend *be, const lutra_tensor *x, lutra_tensor *dbias,
                         const lutra_quantize_op *op) {
  return be->bias_grad(&(lutra_bias_grad_args){.dy = x->data,
                                               .dtype = x->dtype,
                                               .rows = lutra_rows(x),
                                               .cols = lutra_cols(x),
                                               .db = dbias->data,
                                               .db_dtype = dbias->dtype,
                                               .accumulate = op->dbias_accumulate,
                                               .skip = op->skip});
}

static int quantize_impl(lutra_quantizer *q, const lutra_quantize_op *op, lutra_tensor **out,
                         const char *fn) {
  if (op->observe) return observe(q, op->x, fn);
  const lutra_quantizer_spec *s = &q->spec;
  const lutra_tensor *x = op->x, *act = op->act;
  lutra_tensor *dbias = op->dbias;
  CHECK_ARG(x->device == q->device, "input is on another device than the quantizer");
  const bool with_act = act || op->act_forward;
  int64_t mshape[LUTRA_MAX_DIMS];
  int mdim = x->ndim;
  memcpy(mshape, x->shape, sizeof mshape);
  if (with_act) TRY(act_matrix_shape(q, op, mshape, &mdim, fn));
  const int64_t cols = mdim ? mshape[mdim - 1] : 1;
  int64_t rows = 1;
  for (int i = 0; i + 1 < mdim; i++)
    rows *= mshape[i];
  TRY(check_dims(s, x->dtype, rows, cols, fn));
  if (s->kind == LUTRA_QUANT_NVFP4) {
    CHECK_ARG(q->be->quantize_nvfp4, "NVFP4 has no %s kernels", q->be->name);
    CHECK_ARG(!with_act, "NVFP4 fuses no activation into its cast");
  }
  if (dbias) {
    CHECK_ARG(lutra_dtype_is_float(dbias->dtype), "dbias dtype %s is not f32, bf16 or f16",
              lutra_dtype_name(dbias->dtype));
    CHECK_ARG(dbias->numel == cols, "dbias has %lld elements, %s has %lld columns",
              (long long)dbias->numel, with_act ? "the activation's matrix" : "x", (long long)cols);
    CHECK_ARG(dbias->device == q->device, "dbias is on another device than the quantizer");
    CHECK_ARG(dbias->data && dbias->data != x->data, "dbias has no data or aliases x");
  }
  TRY(lutra_tensor_cache_get(&q->outs,
                             &(lutra_tensor_spec){.dtype = s->dtype,
                                                  .scaling = scaling_of(s->kind),
                                                  .ndim = mdim,
                                                  .device = q->device,
                                                  .shape = mshape,
                                                  .rowwise = q->rowwise || op->rowwise_only,
                                                  .columnwise = q->columnwise && !op->rowwise_only},
                             &q->out, fn));
  lutra_tensor *o = q->out;
  lutra_quant_args a = {
      .x = op->act_forward ? NULL : x->data,
      .x_dtype = x->dtype,
      .out_dtype = s->dtype,
      .rows = rows,
      .cols = cols,
      .data = o->data,
      .scale_inv = o->scale_inv,
      .col_data = o->col_data,
      .col_scale_inv = o->col_scale_inv,
      .power_2_scale = s->power_2_scale,
      .amax_epsilon = s->amax_epsilon,
      .block_dim = s->block_dim,
      .dbias = dbias ? dbias->data : NULL,
      .dbias_dtype = dbias ? dbias->dtype : 0,
      .dbias_accumulate = op->dbias_accumulate,
      .skip = op->skip,
      .act = act               ? act->data
             : op->act_forward ? x->data
                               : NULL,
      .act_kind = with_act ? (op->act_kind ? op->act_kind : LUTRA_ACT_GELU_TANH) : 0,
      .act_forward = op->act_forward,
      .act_out = op->act_out ? op->act_out->data : NULL,
  };
  const lutra_backend *be = q->be;
  switch (s->kind) {
  case LUTRA_QUANT_DELAYED:
    a.scale = q->meta.scale;
    a.amax = op->record_amax ? q->meta.amax_history : NULL;
    o->amax = q->meta.amax_history;
    TRY(be->cast(&a));
    break;
  case LUTRA_QUANT_CURRENT:
    /* amax and scale in one backend call (one launch on CUDA, no memset: see current_scale);
     * with an activation inside the cast, over the activation's values */
    if (with_act) {
      const lutra_current_scale_act_args c = {.a = a,
                                              .amax = q->amax,
                                              .scale = q->meta.scale,
                                              .work = q->work,
                                              .fp8_max = q->meta.fp8_max};
      TRY(be->current_scale_act(&c));
    } else {
      const lutra_current_scale_args c = {.x = x->data,
                                          .amax = q->amax,
                                          .scale = q->meta.scale,
                                          .work = q->work,
                                          .skip = op->skip,
                                          .dtype = x->dtype,
                                          .power_2_scale = s->power_2_scale,
                                          .fp8_max = q->meta.fp8_max,
                                          .amax_epsilon = s->amax_epsilon,
                                          .n = x->numel};
      TRY(be->current_scale(&c));
    }
    a.scale = q->meta.scale;
    o->amax = q->amax;
    TRY(be->cast(&a));
    break;
  case LUTRA_QUANT_MXFP8:
    TRY(be->quantize_mxfp8(&a));
    break;
  case LUTRA_QUANT_ROWWISE:
    CHECK_ARG(be->quantize_rowwise, "rowwise scaling has no %s kernels (the CPU backend has them)",
              be->name);
    CHECK_ARG(!act, "rowwise scaling fuses no GELU gradient");
    a.dbias = NULL; /* not fused: the bias gradient is summed after */
    TRY(be->quantize_rowwise(&a));
    if (dbias) TRY(unfused_dbias(be, x, dbias, op));
    break;
  case LUTRA_QUANT_NVFP4:
    a.dbias = NULL; /* not fused: the bias gradient is summed after */
    a.nvfp4 = s->nvfp4;
    a.rht_signs = s->rht_signs;
    a.seed = fp4_call_seed(s->seed, q->calls);
    TRY(be->quantize_nvfp4(&a));
    q->calls++;
    if (dbias) TRY(unfused_dbias(be, x, dbias, op));
    break;
  default:
    TRY(be->quantize_block(&a));
    break;
  }
  *out = o;
  return LUTRA_OK;
}

/* every quantization runs inside one NVTX range */
int lutra_quantize_run(lutra_quantizer *q, const lutra_quantize_op *op, lutra_tensor **out,
                       const char *fn) {
  RANGE_PUSH("lutra.quantize");
  int st = quantize_impl(q, op, out, fn);
  RANGE_POP();
  return st;
}

/* ---- the norm writing the quantizer's output (lutra_norm_quant_args) ---------------------- */

bool lutra_quantizer_fuses_norm(const lutra_quantizer *q) {
  const int k = q->spec.kind;
  return q->be->norm_quantize && (k == LUTRA_QUANT_DELAYED || k == LUTRA_QUANT_CURRENT ||
                                  k == LUTRA_QUANT_MXFP8 || k == LUTRA_QUANT_BLOCK_1D);
}

static int quantize_norm_impl(lutra_quantizer *q, const lutra_norm_args *n,
                              const lutra_tensor *shape, bool record_amax, bool rowwise_only,
                              lutra_tensor **out, const char *fn) {
  const lutra_quantizer_spec *s = &q->spec;
  CHECK_ARG(lutra_quantizer_fuses_norm(q),
            "this quantizer's scaling cannot be written by the norm (128x128 tiles, or the "
            "backend has no fused norm)");
  CHECK_ARG(shape->device == q->device, "input is on another device than the quantizer");
  TRY(lutra_quantizer_check_input(s, shape, fn));
  TRY(lutra_tensor_cache_get(&q->outs,
                             &(lutra_tensor_spec){.dtype = s->dtype,
                                                  .scaling = scaling_of(s->kind),
                                                  .ndim = shape->ndim,
                                                  .device = q->device,
                                                  .shape = shape->shape,
                                                  .rowwise = q->rowwise || rowwise_only,
                                                  .columnwise = q->columnwise && !rowwise_only},
                             &q->out, fn));
  lutra_tensor *o = q->out;
  lutra_norm_quant_args a = {
      .norm = *n,
      .quant = {.out_dtype = s->dtype,
                .data = o->data,
                .scale_inv = o->scale_inv,
                .col_data = o->col_data,
                .col_scale_inv = o->col_scale_inv,
                .power_2_scale = s->power_2_scale,
                .amax_epsilon = s->amax_epsilon,
                .block_dim = 1},
      .scaling = scaling_of(s->kind),
  };
  if (s->kind == LUTRA_QUANT_DELAYED) {
    a.quant.scale = q->meta.scale;
    a.quant.amax = record_amax ? q->meta.amax_history : NULL;
    o->amax = q->meta.amax_history;
  } else if (s->kind == LUTRA_QUANT_CURRENT) {
    a.current = 1;
    a.fp8_max = q->meta.fp8_max;
    a.work = q->work;
    a.quant.scale = q->meta.scale;
    a.quant.amax = q->amax;
    o->amax = q->amax;
  }
  TRY(q->be->norm_quantize(&a));
  *out = o;
  return LUTRA_OK;
}

int lutra_quantize_norm_run(lutra_quantizer *q, const lutra_norm_args *n, const lutra_tensor *shape,
                            bool record_amax, bool rowwise_only, lutra_tensor **out,
                            const char *fn) {
  RANGE_PUSH("lutra.norm_quantize");
  int st = quantize_norm_impl(q, n, shape, record_amax, rowwise_only, out, fn);
  RANGE_POP();
  return st;
}

/* ---- public API --------------------------------------------------------------------------- */

int lutra_quantizer_new(const lutra_recipe *r, int role, int rowwise, int columnwise, int device,
                        lutra_quantizer **out) {
  static const char fn[] = "lutra_quantizer_new";
  TRY(lutra_check_object(r, LUTRA_MAGIC_RECIPE, fn, "recipe"));
  CHECK_ARG(role >= 0 && role < LUTRA_NUM_ROLES, "unknown role %d", role);
  CHECK_ARG(out, "out is NULL");
  TRY(lutra_quantizer_create(&r->roles[role], rowwise, columnwise, device, out, fn));
  (*out)->user_owned = true;
  return LUTRA_OK;
}

/* The caller's references: the one lutra_quantizer_new handed out, and one per retain. A
 * module's quantizer counts only the retains, so that a caller cannot drop the module's own. */
void lutra_quantizer_retain(lutra_quantizer *q) {
  if (!q) return;
  q->obj.refs++;
  q->held++;
}

int lutra_quantizer_unref(lutra_quantizer *q) {
  if (!q) return LUTRA_OK;
  if (!q->user_owned && q->held <= 0)
    return lutra_error(LUTRA_ESTATE, "lutra_quantizer_unref",
                       "quantizer is owned by a module and is freed with it");
  if (q->held > 0) q->held--;
  drop_ref(q);
  return LUTRA_OK;
}

int lutra_quantizer_destroy(lutra_quantizer *q) {
  static const char fn[] = "lutra_quantizer_destroy";
  TRY(lutra_check_object(q, LUTRA_MAGIC_QUANTIZER, fn, "quantizer"));
  CHECK_STATE(q->user_owned, "quantizer is owned by a module and is freed with it");
  drop_resources(q);
  q->obj.flags |= LUTRA_OBJ_FREED;
  return LUTRA_OK;
}

int lutra_quantize(lutra_quantizer *q, const lutra_tensor *x, lutra_tensor **out) {
  static const char fn[] = "lutra_quantize";
  TRY(lutra_check_object(q, LUTRA_MAGIC_QUANTIZER, fn, "quantizer"));
  TRY(lutra_check_tensor(x, fn, "x"));
  CHECK_ARG(out, "out is NULL");
  return lutra_quantize_run(q, &(lutra_quantize_op){.x = x, .record_amax = true}, out, fn);
}

int lutra_quantize_dbias(lutra_quantizer *q, const lutra_tensor *x, lutra_tensor *dbias,
                         int accumulate, lutra_tensor **out) {
  static const char fn[] = "lutra_quantize_dbias";
  TRY(lutra_check_object(q, LUTRA_MAGIC_QUANTIZER, fn, "quantizer"));
  TRY(lutra_check_tensor(x, fn, "x"));
  TRY(lutra_check_tensor(dbias, fn, "dbias"));
  CHECK_ARG(out, "out is NULL");
  return lutra_quantize_run(
      q,
      &(lutra_quantize_op){
          .x = x, .record_amax = true, .dbias = dbias, .dbias_accumulate = accumulate != 0},
      out, fn);
}

int lutra_quantize_skip(lutra_quantizer *q, const lutra_tensor *x, const lutra_tensor *skip,
                        lutra_tensor *dbias, int accumulate, lutra_tensor **out) {
  static const char fn[] = "lutra_quantize_skip";
  TRY(lutra_check_object(q, LUTRA_MAGIC_QUANTIZER, fn, "quantizer"));
  TRY(lutra_check_tensor(x, fn, "x"));
  if (dbias) TRY(lutra_check_tensor(dbias, fn, "dbias"));
  CHECK_ARG(out, "out is NULL");
  const int32_t *flag = NULL;
  if (skip) {
    TRY(lutra_check_tensor(skip, fn, "skip"));
    CHECK_ARG(skip->dtype == LUTRA_I32 && skip->numel == 1,
              "skip must be an i32 tensor of one element (got %s, %lld elements)",
              lutra_dtype_name(skip->dtype), (long long)skip->numel);
    CHECK_ARG(skip->device == q->device, "skip is on another device than the quantizer");
    flag = skip->data;
  }
  return lutra_quantize_run(q,
                            &(lutra_quantize_op){.x = x,
                                                 .record_amax = true,
                                                 .dbias = dbias,
                                                 .dbias_accumulate = accumulate != 0,
                                                 .skip = flag},
                            out, fn);
}

static int check_delayed(const lutra_quantizer *q, const char *fn) {
  CHECK_ARG(q->spec.kind == LUTRA_QUANT_DELAYED, "quantizer does not use delayed scaling");
  return LUTRA_OK;
}

int lutra_quantizer_update(lutra_quantizer *q) {
  static const char fn[] = "lutra_quantizer_update";
  TRY(lutra_check_object(q, LUTRA_MAGIC_QUANTIZER, fn, "quantizer"));
  TRY(check_delayed(q, fn));
  lutra_scale_meta *m = &q->meta;
  return q->be->delayed_update(&m, 1);
}

int lutra_quantizer_scale(const lutra_quantizer *q, float *scale, float *scale_inv) {
  static const char fn[] = "lutra_quantizer_scale";
  TRY(lutra_check_object(q, LUTRA_MAGIC_QUANTIZER, fn, "quantizer"));
  CHECK_ARG(scale && scale_inv, "output pointers must not be NULL");
  CHECK_ARG(q->spec.kind == LUTRA_QUANT_DELAYED || q->spec.kind == LUTRA_QUANT_CURRENT,
            "quantizer has per-block scales, not one scale");
  TRY(q->be->to_host(scale, q->meta.scale, sizeof(float)));
  *scale = lutra_canonical_nan(*scale);
  /* current scaling writes 1/scale only into each output tensor; the value is the same */
  if (q->spec.kind == LUTRA_QUANT_CURRENT) {
    *scale_inv = 1.0f / *scale;
    return LUTRA_OK;
  }
  TRY(q->be->to_host(scale_inv, q->meta.scale_inv, sizeof(float)));
  *scale_inv = lutra_canonical_nan(*scale_inv);
  return LUTRA_OK;
}

int lutra_quantizer_history(const lutra_quantizer *q, float *history, int len) {
  static const char fn[] = "lutra_quantizer_history";
  TRY(lutra_check_object(q, LUTRA_MAGIC_QUANTIZER, fn, "quantizer"));
  TRY(check_delayed(q, fn));
  CHECK_ARG(history, "history is NULL");
  CHECK_ARG(len >= 1 && len <= q->meta.history_len, "len %d is out of range 1..%d", len,
            q->meta.history_len);
  TRY(q->be->to_host(history, q->meta.amax_history, (size_t)len * sizeof(float)));
  lutra_canonical_nans(history, len);
  return LUTRA_OK;
}

int lutra_quantizer_history_len(const lutra_quantizer *q, int *len) {
  static const char fn[] = "lutra_quantizer_history_len";
  TRY(lutra_check_object(q, LUTRA_MAGIC_QUANTIZER, fn, "quantizer"));
  TRY(check_delayed(q, fn));
  CHECK_ARG(len, "len is NULL");
  *len = q->meta.history_len;
  return LUTRA_OK;
}

int lutra_quantizer_record_amax(lutra_quantizer *q, float amax) {
  static const char fn[] = "lutra_quantizer_record_amax";
  TRY(lutra_check_object(q, LUTRA_MAGIC_QUANTIZER, fn, "quantizer"));
  TRY(check_delayed(q, fn));
  return q->be->from_host(q->meta.amax_history, &amax, sizeof amax);
}

int lutra_quantizer_state(lutra_quantizer *q, lutra_quantizer_state_view *v) {
  *v = (lutra_quantizer_state_view){.scale = q->meta.scale,
                                    .scale_inv = q->meta.scale_inv,
                                    .amax_history = q->meta.amax_history,
                                    .history_len = q->meta.history_len,
                                    .be = q->be,
                                    .calls = q->spec.kind == LUTRA_QUANT_NVFP4 ? &q->calls : NULL};
  return LUTRA_OK;
}
