/* Quantizers: one per tensor role, built from a recipe's spec. A quantizer owns its scaling
 * state (delayed: scale, scale_inv and the amax history; current: an amax and a scale) in one
 * backend allocation, and its output tensor, which is reused while the input shape stays. */
#include "fp8/quantizer.h"
#include "backend/backend.h"
#include "backend/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/object.h"
#include "core/trace.h"
#include "fp8/autocast.h"
#include "fp8/recipe.h"
#include "runtime/tensor.h"

#include <stdlib.h>
#include <string.h>

struct lutra_quantizer {
  lutra_object obj;
  lutra_quantizer_spec spec;
  int32_t device;
  bool rowwise, columnwise;
  bool user_owned; /* made by lutra_quantizer_new; else owned by a module */
  const lutra_backend *be;
  lutra_scale_meta meta; /* delayed scaling; current scaling uses meta.scale and amax */
  float *amax;           /* current scaling: this call's amax */
  uint32_t *work;        /* current scaling: 2 words, zero between calls (current_scale) */
  void *state;           /* one backend allocation behind meta, amax and work */
  lutra_tensor *out;
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
  lutra_tensor_destroy(q->out);
  q->state = NULL;
  q->out = NULL;
}

void lutra_quantizer_retain(lutra_quantizer *q) {
  if (q) q->obj.refs++;
}

int lutra_quantizer_unref(lutra_quantizer *q) {
  if (!q || --q->obj.refs > 0) return LUTRA_OK;
  if (!(q->obj.flags & LUTRA_OBJ_FREED)) drop_resources(q);
  free(q);
  return LUTRA_OK;
}

/* A module letting go of its quantizer (freed, or rebuilt for a new recipe): a handle Lua still
 * holds (module:quantizer()) keeps the struct, marked FREED, so its calls fail cleanly. */
void lutra_quantizer_destroy(lutra_quantizer *q) {
  if (!q) return;
  if (q->obj.refs > 1 && !(q->obj.flags & LUTRA_OBJ_FREED)) {
    drop_resources(q);
    q->obj.flags |= LUTRA_OBJ_FREED;
  }
  lutra_quantizer_unref(q);
}

lutra_scale_meta *lutra_quantizer_meta(lutra_quantizer *q) {
  return q->spec.kind == LUTRA_QUANT_DELAYED ? &q->meta : NULL;
}

int lutra_quantizer_check_input(const lutra_quantizer_spec *s, const lutra_tensor *x,
                                const char *fn) {
  CHECK_ARG(lutra_dtype_is_float(x->dtype), "input dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(x->dtype));
  int64_t rows = lutra_rows(x), cols = lutra_cols(x);
  int mult = s->kind == LUTRA_QUANT_MXFP8 ? 32 : 16;
  CHECK_ARG(rows % mult == 0 && cols % mult == 0,
            "FP8 needs both matrix dims to be multiples of %d (got %lldx%lld)", mult,
            (long long)rows, (long long)cols);
  return LUTRA_OK;
}

bool lutra_quantizer_takes_dgelu(const lutra_quantizer *q) {
  return q->spec.kind == LUTRA_QUANT_DELAYED && (q->columnwise || q->device == LUTRA_CPU);
}

/* Calibration: a delayed quantizer records max|x| without quantizing; others have nothing to do. */
static int observe(lutra_quantizer *q, const lutra_tensor *x, const char *fn) {
  CHECK_ARG(x->device == q->device, "input is on another device than the quantizer");
  if (q->spec.kind != LUTRA_QUANT_DELAYED) return LUTRA_OK;
  return q->be->amax(x->data, x->dtype, x->numel, q->meta.amax_history);
}

static int quantize_impl(lutra_quantizer *q, const lutra_quantize_op *op, lutra_tensor **out,
                         const char *fn) {
  if (op->observe) return observe(q, op->x, fn);
  const lutra_quantizer_spec *s = &q->spec;
  const lutra_tensor *x = op->x, *act = op->act;
  lutra_tensor *dbias = op->dbias;
  CHECK_ARG(x->device == q->device, "input is on another device than the quantizer");
  TRY(lutra_quantizer_check_input(s, x, fn));
  if (act) {
    CHECK_ARG(lutra_quantizer_takes_dgelu(q),
              "a fused GELU gradient needs delayed scaling (the cast's scale is known before it "
              "reads the gradient) and, on cuda, a columnwise output");
    CHECK_ARG(act->dtype == x->dtype && lutra_same_shape(act, x) && act->device == x->device,
              "the GELU input does not match the gradient in dtype, shape or device");
  }
  if (dbias) {
    CHECK_ARG(lutra_dtype_is_float(dbias->dtype), "dbias dtype %s is not f32, bf16 or f16",
              lutra_dtype_name(dbias->dtype));
    CHECK_ARG(dbias->numel == lutra_cols(x), "dbias has %lld elements, x has %lld columns",
              (long long)dbias->numel, (long long)lutra_cols(x));
    CHECK_ARG(dbias->device == q->device, "dbias is on another device than the quantizer");
    CHECK_ARG(dbias->data && dbias->data != x->data, "dbias has no data or aliases x");
  }
  TRY(lutra_tensor_ensure(&q->out,
                          &(lutra_tensor_spec){.dtype = s->dtype,
                                               .scaling = scaling_of(s->kind),
                                               .ndim = x->ndim,
                                               .device = q->device,
                                               .shape = x->shape,
                                               .rowwise = q->rowwise,
                                               .columnwise = q->columnwise},
                          fn));
  lutra_tensor *o = q->out;
  lutra_quant_args a = {
      .x = x->data,
      .x_dtype = x->dtype,
      .out_dtype = s->dtype,
      .rows = lutra_rows(x),
      .cols = lutra_cols(x),
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
      .act = act ? act->data : NULL,
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
    /* amax and scale in one backend call (one launch on CUDA, no memset: see current_scale) */
    TRY(be->current_scale(x->data, x->dtype, x->numel, q->meta.fp8_max, s->power_2_scale,
                          s->amax_epsilon, q->amax, q->meta.scale, q->work, op->skip));
    a.scale = q->meta.scale;
    o->amax = q->amax;
    TRY(be->cast(&a));
    break;
  case LUTRA_QUANT_MXFP8:
    TRY(be->quantize_mxfp8(&a));
    break;
  case LUTRA_QUANT_ROWWISE:
    CHECK_ARG(be->quantize_rowwise, "rowwise scaling has no %s kernels yet (the CPU emulates it)",
              be->name);
    CHECK_ARG(!act, "rowwise scaling fuses no GELU gradient");
    a.dbias = NULL; /* not fused: the bias gradient is summed after */
    TRY(be->quantize_rowwise(&a));
    if (dbias)
      TRY(be->bias_grad(&(lutra_bias_grad_args){.dy = x->data,
                                                .dtype = x->dtype,
                                                .rows = lutra_rows(x),
                                                .cols = lutra_cols(x),
                                                .db = dbias->data,
                                                .db_dtype = dbias->dtype,
                                                .accumulate = op->dbias_accumulate,
                                                .skip = op->skip}));
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

int lutra_quantizer_free(lutra_quantizer *q) {
  if (!q) return LUTRA_OK;
  if (!q->user_owned)
    return lutra_error(LUTRA_ESTATE, "lutra_quantizer_free",
                       "quantizer is owned by a module and is freed with it");
  return lutra_quantizer_unref(q);
}

int lutra_quantizer_release(lutra_quantizer *q) {
  static const char fn[] = "lutra_quantizer_release";
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
  /* current scaling writes 1/scale only into each output tensor; the value is the same */
  if (q->spec.kind == LUTRA_QUANT_CURRENT) {
    *scale_inv = 1.0f / *scale;
    return LUTRA_OK;
  }
  return q->be->to_host(scale_inv, q->meta.scale_inv, sizeof(float));
}

int lutra_quantizer_history(const lutra_quantizer *q, float *history, int len) {
  static const char fn[] = "lutra_quantizer_history";
  TRY(lutra_check_object(q, LUTRA_MAGIC_QUANTIZER, fn, "quantizer"));
  TRY(check_delayed(q, fn));
  CHECK_ARG(history, "history is NULL");
  CHECK_ARG(len >= 1 && len <= q->meta.history_len, "len %d is out of range 1..%d", len,
            q->meta.history_len);
  return q->be->to_host(history, q->meta.amax_history, (size_t)len * sizeof(float));
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
