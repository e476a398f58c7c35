/* nn.RotaryEmbedding (lutra/rope.h): the rotary position embedding. The module owns the (cos,
 * sin) table of max_seq positions, computed in f64 on the host once and uploaded, and its output
 * and input-gradient buffers per shape; forward, backward and the fused QKV call are one backend
 * call each (lutra_rope_args), with the tensors addressed through strides so that bshd, sbhd and
 * the q and k heads of a packed QKV buffer take the same entry. Nothing is allocated per call
 * once a shape was seen, and the table never moves, so steps capture as CUDA graphs. */
#include "backend/backend.h"
#include "backend/device.h"
#include "core/capture.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/object.h"
#include "nn/module.h"
#include "runtime/tensor.h"
#include "runtime/tensor_cache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct rope {
  lutra_module base;
  lutra_rope_desc desc; /* as made, rotary_dim filled in */
  int64_t offset;
  const lutra_backend *be;
  lutra_tensor *table; /* f32 [max_seq, rotary_dim / 2, 2]: (cos, sin) */
  lutra_tensor_cache y_cache, dx_cache;
  /* what the backward needs of the last forward: its shape and its first position */
  bool forward_done, forward_grad;
  int64_t forward_shape[4], forward_offset;
} rope;

static const lutra_module_ops rope_ops;

/* x's layout as the backend takes it: heads of head_dim contiguous, token elements between one
 * (batch, sequence) position and the next; BSHD or SBHD orders the two outer dims */
static lutra_rope_args args_of(const rope *r, const lutra_tensor *x, int64_t heads, int64_t token,
                               int64_t offset) {
  const bool sbhd = r->desc.qkv_format == LUTRA_ROPE_SBHD;
  lutra_rope_args a = {.table = r->table->data,
                       .b = x->shape[sbhd ? 1 : 0],
                       .s = x->shape[sbhd ? 0 : 1],
                       .h = heads,
                       .d = r->desc.head_dim,
                       .rotary_dim = r->desc.rotary_dim,
                       .position_offset = offset,
                       .table_rows = r->desc.max_seq,
                       .dtype = r->desc.dtype,
                       .interleaved = r->desc.interleaved};
  const int64_t stride[4] = {sbhd ? token : a.s * token, sbhd ? a.b * token : token,
                             r->desc.head_dim, 1};
  memcpy(a.in_stride, stride, sizeof stride);
  memcpy(a.out_stride, stride, sizeof stride);
  return a;
}

/* the checks every tensor the module takes passes: dtype, device, plain (not FP8) data */
static int check_tensor(const rope *r, const lutra_tensor *t, const char *what, const char *fn) {
  CHECK_ARG(t->dtype == r->desc.dtype, "%s dtype %s does not match the module's %s", what,
            lutra_dtype_name(t->dtype), lutra_dtype_name(r->desc.dtype));
  CHECK_ARG(t->device == r->desc.device, "%s is on another device than the module", what);
  CHECK_ARG(t->data != NULL, "%s has no rowwise data", what);
  return LUTRA_OK;
}

/* the sequence length of x (its T dim), checked against the table's rows */
static int check_positions(const rope *r, const lutra_tensor *x, int64_t offset, const char *fn) {
  const int64_t seq = x->shape[r->desc.qkv_format == LUTRA_ROPE_SBHD ? 0 : 1];
  CHECK_ARG(seq <= r->desc.max_seq - offset,
            "positions %lld .. %lld (offset %lld + T %lld) pass max_seq %lld: make the module "
            "with a larger max_seq",
            (long long)offset, (long long)(offset + seq - 1), (long long)offset, (long long)seq,
            (long long)r->desc.max_seq);
  return LUTRA_OK;
}

static int check_input(const rope *r, const lutra_tensor *x, const char *what, const char *fn) {
  TRY(check_tensor(r, x, what, fn));
  CHECK_ARG(x->ndim == 4 && x->shape[3] == r->desc.head_dim,
            "%s must be [%s, H, %lld] (4 dims, the last head_dim)", what,
            r->desc.qkv_format == LUTRA_ROPE_SBHD ? "T, B" : "B, T", (long long)r->desc.head_dim);
  return LUTRA_OK;
}

static int run(const rope *r, const lutra_rope_args *a, const char *fn) {
  int st = r->be->rope(a);
  return st == LUTRA_OK ? LUTRA_OK : lutra_error_wrap(st, fn);
}

static int rope_forward(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *fa,
                        lutra_tensor **y) {
  static const char fn[] = "lutra_rope_forward";
  rope *r = (rope *)m;
  TRY(check_input(r, x, "input", fn));
  TRY(check_positions(r, x, r->offset, fn));
  lutra_tensor *out;
  TRY(lutra_tensor_cache_get(&r->y_cache, PLAIN_TENSOR(x->dtype, 4, x->shape, x->device), &out,
                             fn));
  lutra_rope_args a = args_of(r, x, x->shape[2], x->shape[2] * r->desc.head_dim, r->offset);
  a.in = x->data;
  a.out = out->data;
  TRY(run(r, &a, fn));
  r->forward_done = true;
  r->forward_grad = fa->grad != 0;
  memcpy(r->forward_shape, x->shape, sizeof r->forward_shape);
  r->forward_offset = r->offset;
  *y = out;
  return LUTRA_OK;
}

static int rope_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  static const char fn[] = "lutra_rope_backward";
  rope *r = (rope *)m;
  CHECK_STATE(r->forward_done, "backward called before forward");
  CHECK_STATE(r->forward_grad, "the last forward ran with grad = false (inference): it kept "
                               "nothing for a backward");
  TRY(check_input(r, dy, "grad_output", fn));
  CHECK_ARG(memcmp(dy->shape, r->forward_shape, sizeof r->forward_shape) == 0,
            "grad_output shape does not match the forward output");
  if (!dx) return LUTRA_OK; /* no parameters: nothing else to compute */
  lutra_tensor *out;
  TRY(lutra_tensor_cache_get(&r->dx_cache, PLAIN_TENSOR(dy->dtype, 4, dy->shape, dy->device), &out,
                             fn));
  lutra_rope_args a =
      args_of(r, dy, dy->shape[2], dy->shape[2] * r->desc.head_dim, r->forward_offset);
  a.in = dy->data;
  a.out = out->data;
  a.inverse = 1;
  TRY(run(r, &a, fn));
  *dx = out;
  return LUTRA_OK;
}

static void rope_release(lutra_module *m) {
  rope *r = (rope *)m;
  lutra_tensor_cache_release(&r->y_cache);
  lutra_tensor_cache_release(&r->dx_cache);
  lutra_tensor_owner_drop(r->table);
  r->table = NULL;
  r->forward_done = false;
}

static const lutra_module_ops rope_ops = {.kind = "rotary_embedding",
                                          .forward = rope_forward,
                                          .backward = rope_backward,
                                          .num_params = lutra_module_no_params,
                                          .param = lutra_module_no_param,
                                          .release = rope_release,
                                          .checkpoint = &lutra_checkpoint_stateless};

void lutra_rope_defaults(lutra_rope_desc *d) {
  if (!d) return;
  *d = (lutra_rope_desc){.max_seq = 4096, .base = 10000.0, .dtype = LUTRA_F32, .device = LUTRA_CPU};
}

/* (cos, sin) of p * base^(-2i / r) for every position and pair, in f64, rounded once to f32 */
static int build_table(rope *r, const char *fn) {
  const int64_t half = r->desc.rotary_dim / 2, rows = r->desc.max_seq;
  int64_t shape[3] = {rows, half, 2};
  lutra_tensor_spec spec = *PLAIN_TENSOR(LUTRA_F32, 3, shape, r->desc.device);
  spec.flags = LUTRA_TENSOR_BORROWED;
  TRY(lutra_tensor_make(&spec, &r->table, fn));
  const size_t bytes = (size_t)(rows * half * 2) * sizeof(float);
  float *host = malloc(bytes);
  if (!host) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate %zu bytes", bytes);
  for (int64_t i = 0; i < half; i++) {
    const double inv_freq = pow(r->desc.base, -2.0 * (double)i / (double)r->desc.rotary_dim);
    for (int64_t p = 0; p < rows; p++) {
      const double angle = (double)p * inv_freq;
      host[(p * half + i) * 2] = (float)cos(angle);
      host[(p * half + i) * 2 + 1] = (float)sin(angle);
    }
  }
  int st = r->be->from_host(r->table->data, host, bytes);
  free(host);
  return st;
}

int lutra_rope_new(const lutra_rope_desc *d, lutra_module **out) {
  static const char fn[] = "lutra_rope_new";
  CHECK_ARG(d, "desc is NULL");
  CHECK_ARG(out, "out is NULL");
  CHECK_ARG(d->head_dim >= 2 && d->head_dim <= (1 << 20) && d->head_dim % 2 == 0,
            "head_dim %lld must be even, 2 .. 2^20", (long long)d->head_dim);
  const int64_t rotary_dim = d->rotary_dim ? d->rotary_dim : d->head_dim;
  CHECK_ARG(rotary_dim >= 2 && rotary_dim <= d->head_dim && rotary_dim % 2 == 0,
            "rotary_dim %lld must be even, 2 .. head_dim %lld", (long long)rotary_dim,
            (long long)d->head_dim);
  CHECK_ARG(d->max_seq >= 1 && d->max_seq <= INT32_MAX, "max_seq %lld is outside 1 .. 2^31 - 1",
            (long long)d->max_seq);
  CHECK_ARG(d->max_seq * rotary_dim <= ((int64_t)1 << 31),
            "a table of max_seq %lld x rotary_dim %lld values is over 2^31", (long long)d->max_seq,
            (long long)rotary_dim);
  CHECK_ARG(isfinite(d->base) && d->base > 1.0, "base %g must be finite and above 1", d->base);
  CHECK_ARG(d->interleaved == 0 || d->interleaved == 1, "interleaved must be 0 or 1");
  CHECK_ARG(d->qkv_format == LUTRA_ROPE_BSHD || d->qkv_format == LUTRA_ROPE_SBHD,
            "qkv_format %d is not LUTRA_ROPE_BSHD or LUTRA_ROPE_SBHD", (int)d->qkv_format);
  CHECK_ARG(lutra_dtype_is_float(d->dtype), "dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(d->dtype));
  const lutra_backend *be;
  TRY(lutra_backend_get(d->device, &be, fn));
  CHECK_ARG(be->rope, "the %s backend has no rotary embedding", be->name);
  rope *r = calloc(1, sizeof *r);
  if (!r) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  lutra_module_init(&r->base, &rope_ops);
  r->desc = *d;
  r->desc.rotary_dim = rotary_dim;
  r->be = be;
  int st = build_table(r, fn);
  if (st != LUTRA_OK) {
    rope_release(&r->base);
    free(r);
    return st;
  }
  *out = &r->base;
  return LUTRA_OK;
}

static int check_rope(const lutra_module *m, const char *fn) {
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(m->ops == &rope_ops, "module is a %s, not a rotary_embedding", m->ops->kind);
  return LUTRA_OK;
}

int lutra_rope_set_offset(lutra_module *m, int64_t offset) {
  static const char fn[] = "lutra_rope_set_offset";
  TRY(check_rope(m, fn));
  rope *r = (rope *)m;
  CHECK_ARG(offset >= 0 && offset < r->desc.max_seq, "offset %lld is outside 0 .. max_seq %lld - 1",
            (long long)offset, (long long)r->desc.max_seq);
  r->offset = offset;
  return LUTRA_OK;
}

int lutra_rope_get(const lutra_module *m, lutra_rope_desc *out, int64_t *offset) {
  static const char fn[] = "lutra_rope_get";
  TRY(check_rope(m, fn));
  CHECK_ARG(out, "out is NULL");
  const rope *r = (const rope *)m;
  *out = r->desc;
  if (offset) *offset = r->offset;
  return LUTRA_OK;
}

/* a captured graph drops its reference to the module through this */
static int release_module(void *p) {
  return lutra_module_unref(p);
}

int lutra_rope_apply_qkv(lutra_module *m, lutra_tensor *qkv, int64_t num_heads,
                         int64_t num_gqa_groups, int inverse) {
  static const char fn[] = "lutra_rope_apply_qkv";
  TRY(check_rope(m, fn));
  TRY(lutra_check_tensor(qkv, fn, "qkv"));
  rope *r = (rope *)m;
  CHECK_ARG(num_heads >= 1 && num_heads <= (1 << 24) && num_gqa_groups >= 1 &&
                num_gqa_groups <= num_heads && num_heads % num_gqa_groups == 0,
            "num_gqa_groups %lld must divide num_heads %lld (1 .. 2^24)", (long long)num_gqa_groups,
            (long long)num_heads);
  TRY(check_tensor(r, qkv, "qkv", fn));
  const int64_t heads = num_heads + 2 * num_gqa_groups, width = heads * r->desc.head_dim;
  CHECK_ARG((qkv->ndim == 3 && qkv->shape[2] == width) ||
                (qkv->ndim == 4 && qkv->shape[2] == heads && qkv->shape[3] == r->desc.head_dim),
            "qkv must be [%s, %lld] or [%s, %lld, %lld]: (num_heads + 2 num_gqa_groups) heads of "
            "head_dim",
            r->desc.qkv_format == LUTRA_ROPE_SBHD ? "T, B" : "B, T", (long long)width,
            r->desc.qkv_format == LUTRA_ROPE_SBHD ? "T, B" : "B, T", (long long)heads,
            (long long)r->desc.head_dim);
  TRY(check_positions(r, qkv, r->offset, fn));
  /* the q heads and the k heads after them are one run of heads: one call rotates both */
  lutra_rope_args a = args_of(r, qkv, num_heads + num_gqa_groups, width, r->offset);
  a.in = a.out = qkv->data;
  a.inverse = inverse != 0;
  TRY(run(r, &a, fn));
  if (LUTRA_CAPTURING()) {
    TRY(lutra_capture_hold_object(m, release_module, fn));
    TRY(lutra_capture_hold_tensor(qkv, fn));
  }
  return LUTRA_OK;
}
