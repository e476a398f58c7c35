/* nn.DotProductAttention (lutra/attention.h): scaled dot-product attention over the backend's
 * attention entries. Both ways in (q, k, v, or one packed QKV tensor) become one
 * lutra_attention_args addressing the tensors through strides, so the packed input is read and
 * its gradient written in place. Per (shape, strides, dtype, causal, dropout) the backend's plan
 * and its workspace are built once and kept (nn/attention_plans.h); outputs, statistics and
 * gradients come from per-shape caches; so a step with stable shapes builds and allocates
 * nothing and captures as a CUDA graph. The last forward's arguments (its dropout offset
 * included) and tensors are kept for the backward; a refused call changes nothing. An fp8
 * module's forward inside a delayed-scaling scope goes through nn/attention_fp8.h around the
 * same backend calls. Under the determinism switch (lutra/determinism.h) every call asks for
 * the deterministic backward (a plan key of its own).
 *
 * Dropout's generator: on the CPU the host's (seed, next_offset), advanced per forward with
 * grad. On CUDA the module also holds them in device memory (rng: seed, and the offset of the
 * last forward with dropout), which the backend advances on the stream before each forward
 * draws (args_attention.h), so a captured step replayed K times draws the masks of K eager
 * steps. The device copy is then the truth: next_offset follows it in eager steps, not across
 * replays, so whoever reads the state (lutra_attention_rng_state, checkpoints) reads it back
 * from the device (rng_now); a state set on the host is written to the device by the next
 * forward with dropout (rng_synced false until then), which refuses to do so inside a capture. */
#include "backend/backend.h"
#include "backend/determinism.h"
#include "backend/device.h"
#include "core/capture.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/object.h"
#include "nn/attention_fp8.h"
#include "nn/attention_plans.h"
#include "nn/module.h"
#include "runtime/tensor.h"
#include "runtime/tensor_cache.h"

#include <math.h>
#include <stdlib.h>

typedef struct attention {
  lutra_module base;
  lutra_attention_desc desc; /* defaults filled in */
  const lutra_backend *be;
  uint64_t next_offset; /* the dropout offset of the next forward with grad */
  /* CUDA with dropout: the device's (seed, offset of the last forward with dropout) as int64
   * words; rng_synced: it holds desc.seed and next_offset - OFFSET_STEP */
  lutra_tensor *rng;
  bool rng_synced;
  /* the last forward with grad: its kind (LUTRA_ATTENTION_*), arguments, plan slot and tensors
   * (q holds the packed input), held so that a backward never reads a freed buffer */
  int32_t last;
  int plan_slot;
  lutra_attention_args fwd;
  const lutra_tensor *q, *k, *v, *out, *stats;
  lutra_tensor_cache out_cache, stats_cache, dq_cache, dk_cache, dv_cache;
  attention_plans plans;
  attention_fp8 fp8;
} attention;

static const lutra_module_ops attention_ops;

/* strides (batch, seq, head, dim) of a contiguous [B, T, heads, D] (sbhd: [T, B, ...]) whose
 * rows hold width elements, the heads starting at the row's element first */
static void strides(const attention *m, int64_t b, int64_t t, int64_t width, int64_t st[4]) {
  const bool sbhd = m->desc.qkv_format == LUTRA_QKV_SBHD;
  st[0] = sbhd ? width : t * width;
  st[1] = sbhd ? b * width : width;
  st[2] = m->desc.head_dim;
  st[3] = 1;
}

static int check_input(const attention *m, const lutra_tensor *t, int ndim, const char *what,
                       const char *fn) {
  CHECK_ARG(t->dtype == m->desc.dtype, "%s dtype %s does not match the module's %s", what,
            lutra_dtype_name(t->dtype), lutra_dtype_name(m->desc.dtype));
  CHECK_ARG(t->device == m->desc.device, "%s is on another device than the module", what);
  CHECK_ARG(t->ndim == ndim, "%s must have %d dims (got %d)", what, ndim, (int)t->ndim);
  CHECK_ARG(t->numel > 0, "%s is empty", what);
  return LUTRA_OK;
}

/* the arguments every call shares; the caller fills shapes, strides and pointers */
static lutra_attention_args base_args(const attention *m, const lutra_forward_args *fa) {
  return (lutra_attention_args){.h = m->desc.num_heads,
                                .h_kv = m->desc.num_gqa_groups,
                                .d = m->desc.head_dim,
                                .scale = m->desc.softmax_scale,
                                /* an inference forward runs without dropout */
                                .dropout = fa->grad ? m->desc.dropout : 0.0f,
                                .seed = m->desc.seed,
                                .offset = m->next_offset,
                                .dtype = m->desc.dtype,
                                .causal = m->desc.causal,
                                .deterministic = lutra_deterministic_on()};
}

/* the device's generator brought in line with the host's before a forward draws from it */
static int sync_rng(attention *m, const char *fn) {
  if (m->rng_synced) return LUTRA_OK;
  CHECK_STATE(
      !LUTRA_CAPTURING(),
      "dropout's (seed, offset) were set since the last forward (a checkpoint load or "
      "set_rng_state) and a CUDA graph capture cannot write them: run a step eagerly first");
  const int64_t words[2] = {(int64_t)m->desc.seed,
                            (int64_t)(m->next_offset - LUTRA_ATTENTION_OFFSET_STEP)};
  int st = m->be->from_host(m->rng->data, words, sizeof words);
  if (st != LUTRA_OK) return lutra_error_wrap(st, fn);
  m->rng_synced = true;
  return LUTRA_OK;
}

/* the (seed, offset) the next forward with dropout draws from: the device's where it has them */
static int rng_now(const attention *m, uint64_t *seed, uint64_t *offset, const char *fn) {
  *seed = m->desc.seed;
  *offset = m->next_offset;
  if (!m->rng || !m->rng_synced) return LUTRA_OK;
  int64_t words[2];
  int st = m->be->to_host(words, m->rng->data, sizeof words);
  if (st != LUTRA_OK) return lutra_error_wrap(st, fn);
  *offset = (uint64_t)words[1] + LUTRA_ATTENTION_OFFSET_STEP;
  return LUTRA_OK;
}

/* what both forwards share once their arguments are set: the plan, the output and statistics
 * buffers, the backend call (in FP8 between its casts), and the state a backward needs */
static int run_forward(attention *m, lutra_attention_args *a, const lutra_forward_args *fa,
                       int kind, const lutra_tensor *q, const lutra_tensor *k,
                       const lutra_tensor *v, int out_ndim, const int64_t *out_shape,
                       lutra_tensor **y, const char *fn) {
  CHECK_ARG(!a->causal || a->s_q == a->s_kv,
            "causal attention needs as many query as key positions (got %lld and %lld)",
            (long long)a->s_q, (long long)a->s_kv);
  bool fp8;
  TRY(attention_fp8_begin(&m->fp8, &m->desc, &fp8, fn));
  if (fp8) { /* the plan's key: FP8 plans are other graphs */
    a->fp8 = 1;
    a->grad_dtype = m->fp8.grad_dtype;
  }
  const int keep = m->last != LUTRA_ATTENTION_NONE ? m->plan_slot : -1;
  int slot;
  TRY(attention_plans_get(&m->plans, m->be, m->desc.device, a, keep, &slot, fn));
  lutra_tensor *ws;
  TRY(attention_plans_use(&m->plans, slot, m->be, m->desc.device, a, &ws, fn));
  if (a->dropout > 0.0f && m->rng) {
    TRY(sync_rng(m, fn));
    a->rng = (int64_t *)m->rng->data;
  }
  lutra_tensor *out, *stats;
  const int64_t stats_shape[3] = {a->b, a->h, a->s_q};
  TRY(lutra_tensor_cache_get(
      &m->out_cache, PLAIN_TENSOR(m->desc.dtype, out_ndim, out_shape, m->desc.device), &out, fn));
  TRY(lutra_tensor_cache_get(&m->stats_cache,
                             PLAIN_TENSOR(LUTRA_F32, 3, stats_shape, m->desc.device), &stats, fn));
  const lutra_tensor *inputs[3] = {q, k, v};
  a->out = out->data;
  if (fp8) TRY(attention_fp8_forward_in(&m->fp8, inputs, k ? 3 : 1, out, a, fn));
  a->stats = (float *)stats->data;
  int st = m->be->attention_forward(a);
  if (st != LUTRA_OK) return lutra_error_wrap(st, fn);
  if (fp8) TRY(attention_fp8_forward_out(&m->fp8, out, fa->grad != 0, fn));
  m->fp8.last = fp8;
  if (LUTRA_CAPTURING()) {
    TRY(lutra_capture_hold_tensor(stats, fn));
    if (ws) TRY(lutra_capture_hold_tensor(ws, fn));
    if (a->rng) TRY(lutra_capture_hold_tensor(m->rng, fn));
    if (fp8) TRY(attention_fp8_capture_hold(&m->fp8, false, fn));
  }
  /* the output is held whatever the kind of forward: a failed later forward with a new shape
   * may evict it from the cache, and a tensor handed out must stay readable until then */
  lutra_tensor_hold(&m->out, out);
  /* an inference forward keeps nothing for a backward */
  const bool grad = fa->grad != 0;
  m->last = grad ? kind : LUTRA_ATTENTION_NONE;
  if (grad) {
    if (a->dropout > 0.0f) /* each forward with dropout draws a fresh mask */
      m->next_offset += LUTRA_ATTENTION_OFFSET_STEP;
    m->plan_slot = slot;
    m->fwd = *a;
  }
  lutra_tensor_hold(&m->q, grad ? q : NULL);
  lutra_tensor_hold(&m->k, grad ? k : NULL);
  lutra_tensor_hold(&m->v, grad ? v : NULL);
  lutra_tensor_hold(&m->stats, grad ? stats : NULL);
  *y = out;
  return LUTRA_OK;
}

/* the module protocol's forward: x packed [B, T, (H + 2 Hkv) D] (sbhd: [T, B, ...]) */
static int attn_forward(lutra_module *mod, const lutra_tensor *x, const lutra_forward_args *fa,
                        lutra_tensor **y) {
  static const char fn[] = "lutra_module_forward (DotProductAttention)";
  attention *m = (attention *)mod;
  const lutra_attention_desc *d = &m->desc;
  TRY(check_input(m, x, 3, "the packed input", fn));
  const int64_t width = (d->num_heads + 2 * d->num_gqa_groups) * d->head_dim;
  CHECK_ARG(x->shape[2] == width,
            "the packed input's last dim %lld is not (num_heads %lld + 2 num_gqa_groups %lld) "
            "head_dim %lld = %lld",
            (long long)x->shape[2], (long long)d->num_heads, (long long)d->num_gqa_groups,
            (long long)d->head_dim, (long long)width);
  const bool sbhd = d->qkv_format == LUTRA_QKV_SBHD;
  lutra_attention_args a = base_args(m, fa);
  a.b = x->shape[sbhd ? 1 : 0];
  a.s_q = a.s_kv = x->shape[sbhd ? 0 : 1];
  strides(m, a.b, a.s_q, width, a.q_stride);
  strides(m, a.b, a.s_q, width, a.k_stride);
  strides(m, a.b, a.s_q, width, a.v_stride);
  strides(m, a.b, a.s_q, d->num_heads * d->head_dim, a.o_stride);
  const size_t esize = lutra_dtype_size(d->dtype);
  a.q = x->data;
  a.k = (const char *)x->data + (size_t)(d->num_heads * d->head_dim) * esize;
  a.v = (const char *)a.k + (size_t)(d->num_gqa_groups * d->head_dim) * esize;
  const int64_t out_shape[3] = {x->shape[0], x->shape[1], d->num_heads * d->head_dim};
  return run_forward(m, &a, fa, LUTRA_ATTENTION_PACKED, x, NULL, NULL, 3, out_shape, y, fn);
}

static int check_attention(const lutra_module *m, const char *fn) {
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(m->ops == &attention_ops, "module is a %s, not a dot_product_attention", m->ops->kind);
  return LUTRA_OK;
}

/* a graph replays into these: it keeps the module and the tensors referenced */
static int release_module(void *p) {
  return lutra_module_unref(p);
}
static int hold_captured(lutra_module *m, const lutra_tensor *const *t, int n, const char *fn) {
  TRY(lutra_capture_hold_object(m, release_module, fn));
  for (int i = 0; i < n; i++)
    if (t[i]) TRY(lutra_capture_hold_tensor(t[i], fn));
  return LUTRA_OK;
}

int lutra_attention_forward_ex(lutra_module *mod, const lutra_tensor *q, const lutra_tensor *k,
                               const lutra_tensor *v, const lutra_forward_args *fa,
                               lutra_tensor **out) {
  static const char fn[] = "lutra_attention_forward";
  TRY(check_attention(mod, fn));
  TRY(lutra_check_tensor(q, fn, "q"));
  TRY(lutra_check_tensor(k, fn, "k"));
  TRY(lutra_check_tensor(v, fn, "v"));
  CHECK_ARG(fa, "args is NULL (lutra_forward_defaults gives the defaults)");
  CHECK_ARG(out, "out is NULL");
  attention *m = (attention *)mod;
  const lutra_attention_desc *d = &m->desc;
  TRY(check_input(m, q, 4, "q", fn));
  TRY(check_input(m, k, 4, "k", fn));
  TRY(check_input(m, v, 4, "v", fn));
  CHECK_ARG(lutra_same_shape(k, v), "k and v have different shapes");
  const bool sbhd = d->qkv_format == LUTRA_QKV_SBHD;
  const int bdim = sbhd ? 1 : 0, tdim = sbhd ? 0 : 1;
  CHECK_ARG(q->shape[2] == d->num_heads && q->shape[3] == d->head_dim,
            "q's heads and head_dim are %lld and %lld, the module's %lld and %lld",
            (long long)q->shape[2], (long long)q->shape[3], (long long)d->num_heads,
            (long long)d->head_dim);
  CHECK_ARG(k->shape[2] == d->num_gqa_groups && k->shape[3] == d->head_dim,
            "k's heads and head_dim are %lld and %lld, the module's num_gqa_groups %lld and "
            "head_dim %lld",
            (long long)k->shape[2], (long long)k->shape[3], (long long)d->num_gqa_groups,
            (long long)d->head_dim);
  CHECK_ARG(q->shape[bdim] == k->shape[bdim], "q's batch %lld differs from k's %lld",
            (long long)q->shape[bdim], (long long)k->shape[bdim]);
  lutra_attention_args a = base_args(m, fa);
  a.b = q->shape[bdim];
  a.s_q = q->shape[tdim];
  a.s_kv = k->shape[tdim];
  strides(m, a.b, a.s_q, d->num_heads * d->head_dim, a.q_stride);
  strides(m, a.b, a.s_kv, d->num_gqa_groups * d->head_dim, a.k_stride);
  strides(m, a.b, a.s_kv, d->num_gqa_groups * d->head_dim, a.v_stride);
  strides(m, a.b, a.s_q, d->num_heads * d->head_dim, a.o_stride);
  a.q = q->data;
  a.k = k->data;
  a.v = v->data;
  TRY(run_forward(m, &a, fa, LUTRA_ATTENTION_QKV, q, k, v, 4, q->shape, out, fn));
  if (LUTRA_CAPTURING()) {
    const lutra_tensor *held[] = {q, k, v, *out};
    TRY(hold_captured(mod, held, 4, fn));
  }
  return LUTRA_OK;
}

int lutra_attention_forward(lutra_module *m, const lutra_tensor *q, const lutra_tensor *k,
                            const lutra_tensor *v, lutra_tensor **out) {
  lutra_forward_args a;
  lutra_forward_defaults(&a);
  return lutra_attention_forward_ex(m, q, k, v, &a, out);
}

/* the checks every backward makes before it changes anything */
static int check_backward(const attention *m, int kind, const lutra_tensor *dout, const char *fn) {
  CHECK_STATE(m->last != LUTRA_ATTENTION_NONE,
              m->out ? "the last forward ran with grad = false (inference): it kept nothing for "
                       "a backward"
                     : "backward called before forward");
  CHECK_STATE(m->last == kind,
              kind == LUTRA_ATTENTION_PACKED
                  ? "the last forward took q, k and v: its backward is lutra_attention_backward"
                  : "the last forward took the packed input (lutra_module_forward): its backward "
                    "is lutra_module_backward");
  const lutra_tensor *held[] = {m->q, m->k, m->v, m->out, m->stats};
  for (int i = 0; i < 5; i++)
    CHECK_STATE(!held[i] || !(held[i]->flags & LUTRA_TENSOR_FREED),
                "a tensor the last forward read or wrote was freed");
  CHECK_STATE(!m->fwd.fp8 || m->fwd.fp8_state == m->fp8.state,
              "the FP8 state the last forward used was rebuilt since (a forward under another "
              "recipe): run the forward again");
  CHECK_ARG(dout->dtype == m->desc.dtype, "grad_output dtype %s does not match the module's %s",
            lutra_dtype_name(dout->dtype), lutra_dtype_name(m->desc.dtype));
  CHECK_ARG(dout->device == m->desc.device, "grad_output is on another device than the module");
  CHECK_ARG(lutra_same_shape(dout, m->out), "grad_output shape does not match the forward output");
  return LUTRA_OK;
}

/* a gradient buffer of t's shape from a cache */
static int grad_like(attention *m, lutra_tensor_cache *c, const lutra_tensor *t, lutra_tensor **g,
                     const char *fn) {
  return lutra_tensor_cache_get(
      c, PLAIN_TENSOR(m->desc.dtype, (int)t->ndim, t->shape, m->desc.device), g, fn);
}

/* the backward into dq, dk, dv, which address the n gradient tensors g (1: packed) */
static int run_backward(attention *m, const lutra_tensor *dout, lutra_tensor *const *g, int n,
                        void *dq, void *dk, void *dv, const char *fn) {
  lutra_attention_args a = m->fwd;
  lutra_tensor *ws;
  TRY(attention_plans_use(&m->plans, m->plan_slot, m->be, m->desc.device, &a, &ws, fn));
  a.dout = dout->data;
  a.dq = dq;
  a.dk = dk;
  a.dv = dv;
  if (a.fp8) TRY(attention_fp8_backward_in(&m->fp8, dout, g, n, &a, fn));
  int st = m->be->attention_backward(&a);
  if (st != LUTRA_OK) return lutra_error_wrap(st, fn);
  if (a.fp8) TRY(attention_fp8_backward_out(&m->fp8, g, n, fn));
  if (LUTRA_CAPTURING()) {
    const lutra_tensor *held[] = {m->q, m->k, m->v, m->out, m->stats, ws, a.rng ? m->rng : NULL};
    TRY(hold_captured(&m->base, held, 7, fn));
    if (a.fp8) TRY(attention_fp8_capture_hold(&m->fp8, true, fn));
  }
  return LUTRA_OK;
}

/* the module protocol's backward: dx packed as the forward's input */
static int attn_backward(lutra_module *mod, const lutra_tensor *dy, lutra_tensor **dx) {
  static const char fn[] = "lutra_module_backward (DotProductAttention)";
  attention *m = (attention *)mod;
  TRY(check_backward(m, LUTRA_ATTENTION_PACKED, dy, fn));
  if (!dx) return LUTRA_OK; /* no parameters: the input's gradient is all there is */
  lutra_tensor *g;
  TRY(grad_like(m, &m->dq_cache, m->q, &g, fn));
  const size_t esize = lutra_dtype_size(m->desc.dtype);
  char *dk = (char *)g->data + (size_t)(m->desc.num_heads * m->desc.head_dim) * esize;
  char *dv = dk + (size_t)(m->desc.num_gqa_groups * m->desc.head_dim) * esize;
  TRY(run_backward(m, dy, &g, 1, g->data, dk, dv, fn));
  *dx = g;
  return LUTRA_OK;
}

int lutra_attention_backward(lutra_module *mod, const lutra_tensor *dout, lutra_tensor **dq,
                             lutra_tensor **dk, lutra_tensor **dv) {
  static const char fn[] = "lutra_attention_backward";
  TRY(check_attention(mod, fn));
  TRY(lutra_check_tensor(dout, fn, "dout"));
  attention *m = (attention *)mod;
  TRY(check_backward(m, LUTRA_ATTENTION_QKV, dout, fn));
  lutra_tensor *g[3];
  TRY(grad_like(m, &m->dq_cache, m->q, &g[0], fn));
  TRY(grad_like(m, &m->dk_cache, m->k, &g[1], fn));
  TRY(grad_like(m, &m->dv_cache, m->v, &g[2], fn));
  TRY(run_backward(m, dout, g, 3, g[0]->data, g[1]->data, g[2]->data, fn));
  if (LUTRA_CAPTURING()) {
    const lutra_tensor *held[] = {dout, g[0], g[1], g[2]};
    TRY(hold_captured(mod, held, 4, fn));
  }
  if (dq) *dq = g[0];
  if (dk) *dk = g[1];
  if (dv) *dv = g[2];
  return LUTRA_OK;
}

static void attn_release(lutra_module *mod) {
  attention *m = (attention *)mod;
  const lutra_tensor **held[] = {&m->q, &m->k, &m->v, &m->out, &m->stats};
  for (size_t i = 0; i < sizeof held / sizeof *held; i++)
    lutra_tensor_hold(held[i], NULL);
  lutra_tensor_cache *caches[] = {&m->out_cache, &m->stats_cache, &m->dq_cache, &m->dk_cache,
                                  &m->dv_cache};
  for (size_t i = 0; i < sizeof caches / sizeof *caches; i++)
    lutra_tensor_cache_release(caches[i]);
  attention_fp8_release(&m->fp8);
  attention_plans_release(&m->plans, m->be);
  lutra_tensor_owner_drop(m->rng);
  m->rng = NULL;
  m->last = LUTRA_ATTENTION_NONE;
}

/* checkpoints: the dropout generator's (seed, offset) when the module has dropout, so that a
 * resumed run draws the masks the straight one would (<m>.rng_state, lutra/checkpoint.h); a
 * module without dropout draws no mask and saves none */
static int attn_rng_get(const lutra_module *mod, uint64_t state[2], bool *has, const char *fn) {
  const attention *m = (const attention *)mod;
  *has = m->desc.dropout > 0.0f;
  return *has ? rng_now(m, &state[0], &state[1], fn) : LUTRA_OK;
}

static void set_rng(attention *m, uint64_t seed, uint64_t offset) {
  m->desc.seed = seed;
  m->next_offset = offset;
  m->rng_synced = false;
}

static void attn_rng_set(lutra_module *mod, const uint64_t state[2]) {
  set_rng((attention *)mod, state[0], state[1]);
}

/* FP8 attention's scaling state: <m>.fp8.qkv.scale, ... (nn/attention_fp8.h) */
static int attn_fp8_state(lutra_module *mod, const lutra_recipe *build_for,
                          const lutra_fp8_state_sink *sink, void **fresh, const char *fn) {
  attention *m = (attention *)mod;
  *fresh = NULL;
  if (!m->desc.fp8) return LUTRA_OK;
  return attention_fp8_checkpoint(&m->fp8, build_for, sink, fresh, fn);
}

static void attn_adopt_fp8_state(lutra_module *mod, const lutra_recipe *r, void *fresh) {
  (void)r;
  attention_fp8_adopt(&((attention *)mod)->fp8, fresh);
}

static void attn_drop_fp8_state(lutra_module *mod, void *fresh) {
  (void)mod;
  attention_fp8_drop(fresh);
}

/* no parameters */
static const lutra_checkpoint_ops attention_checkpoint = {.fp8_state = attn_fp8_state,
                                                          .adopt_fp8_state = attn_adopt_fp8_state,
                                                          .drop_fp8_state = attn_drop_fp8_state,
                                                          .rng_get = attn_rng_get,
                                                          .rng_set = attn_rng_set};

static const lutra_module_ops attention_ops = {.kind = "dot_product_attention",
                                               .forward = attn_forward,
                                               .backward = attn_backward,
                                               .num_params = lutra_module_no_params,
                                               .param = lutra_module_no_param,
                                               .release = attn_release,
                                               .checkpoint = &attention_checkpoint};

void lutra_attention_defaults(lutra_attention_desc *d) {
  if (!d) return;
  *d = (lutra_attention_desc){
      .causal = 1, .qkv_format = LUTRA_QKV_BSHD, .dtype = LUTRA_F32, .device = LUTRA_CPU};
  /* two modules made from the defaults must not draw the same dropout masks */
  lutra_seed_next(&d->seed);
}

static int check_desc(const lutra_attention_desc *d, const char *fn) {
  CHECK_ARG(d->num_heads >= 1 && d->num_heads <= INT32_MAX,
            "num_heads %lld is outside 1 .. 2^31 - 1", (long long)d->num_heads);
  CHECK_ARG(d->head_dim >= 1 && d->head_dim <= INT32_MAX, "head_dim %lld is outside 1 .. 2^31 - 1",
            (long long)d->head_dim);
  CHECK_ARG(d->num_gqa_groups >= 0 && d->num_gqa_groups <= d->num_heads &&
                (d->num_gqa_groups == 0 || d->num_heads % d->num_gqa_groups == 0),
            "num_gqa_groups %lld does not divide num_heads %lld", (long long)d->num_gqa_groups,
            (long long)d->num_heads);
  CHECK_ARG(d->causal == 0 || d->causal == 1, "causal must be 0 (no_mask) or 1 (causal), not %d",
            (int)d->causal);
  CHECK_ARG(d->qkv_format == LUTRA_QKV_BSHD || d->qkv_format == LUTRA_QKV_SBHD,
            "unknown qkv_format %d (LUTRA_QKV_BSHD or LUTRA_QKV_SBHD)", (int)d->qkv_format);
  CHECK_ARG(isfinite(d->softmax_scale), "softmax_scale %g is not finite", (double)d->softmax_scale);
  CHECK_ARG(d->dropout >= 0.0f && d->dropout < 1.0f, "dropout %g is outside [0, 1)",
            (double)d->dropout);
  CHECK_ARG(lutra_dtype_is_float(d->dtype), "dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(d->dtype));
  CHECK_ARG(d->dtype != LUTRA_F32 || d->device == LUTRA_CPU,
            "dtype f32 runs on the cpu only (cuDNN's attention takes bf16 and f16)");
  CHECK_ARG(d->fp8 == 0 || d->fp8 == 1, "fp8 must be 0 or 1, not %d", (int)d->fp8);
  CHECK_ARG(d->reserved == 0, "reserved must be 0");
  CHECK_ARG(!d->fp8 || d->head_dim == 128,
            "fp8 attention takes head_dim 128 (cuDNN's FP8 backward on Hopper), not %lld",
            (long long)d->head_dim);
  CHECK_ARG(!d->fp8 || d->dropout == 0.0f,
            "fp8 attention runs without dropout (not yet supported), got dropout %g",
            (double)d->dropout);
  return LUTRA_OK;
}

int lutra_attention_new(const lutra_attention_desc *d, lutra_module **out) {
  static const char fn[] = "lutra_attention_new";
  CHECK_ARG(d, "desc is NULL");
  CHECK_ARG(out, "out is NULL");
  TRY(check_desc(d, fn));
  const lutra_backend *be;
  TRY(lutra_backend_get(d->device, &be, fn));
  CHECK_ARG(be->attention_plan && be->attention_plan_free && be->attention_forward &&
                be->attention_backward,
            "the %s backend has no attention: attention needs cuDNN (this build's %s backend was "
            "made without its cuDNN shim)",
            be->name, be->name);
  attention *m = calloc(1, sizeof *m);
  if (!m) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  lutra_module_init(&m->base, &attention_ops);
  m->desc = *d;
  if (!m->desc.num_gqa_groups) m->desc.num_gqa_groups = d->num_heads;
  if (m->desc.softmax_scale == 0.0f)
    m->desc.softmax_scale = (float)(1.0 / sqrt((double)d->head_dim));
  m->be = be;
  m->fp8.be = be;
  m->fp8.device = d->device;
  if (d->dropout > 0.0f && d->device != LUTRA_CPU) {
    /* two int64 words, as f32 words (the backend reads them as bytes) */
    const int64_t words = 4;
    lutra_tensor_spec spec = *PLAIN_TENSOR(LUTRA_F32, 1, &words, d->device);
    spec.flags = LUTRA_TENSOR_BORROWED;
    int st = lutra_tensor_make(&spec, &m->rng, fn);
    if (st != LUTRA_OK) {
      free(m);
      return st;
    }
  }
  *out = &m->base;
  return LUTRA_OK;
}

int lutra_attention_info(const lutra_module *mod, lutra_attention_desc *d, int32_t *last_forward) {
  static const char fn[] = "lutra_attention_info";
  TRY(check_attention(mod, fn));
  const attention *m = (const attention *)mod;
  if (d) *d = m->desc;
  if (last_forward) *last_forward = m->last;
  return LUTRA_OK;
}

int lutra_attention_rng_state(const lutra_module *mod, uint64_t *seed, uint64_t *offset) {
  static const char fn[] = "lutra_attention_rng_state";
  TRY(check_attention(mod, fn));
  CHECK_ARG(seed && offset, "seed or offset is NULL");
  uint64_t s, o;
  TRY(rng_now((const attention *)mod, &s, &o, fn));
  *seed = s;
  *offset = o;
  return LUTRA_OK;
}

int lutra_attention_set_rng_state(lutra_module *mod, uint64_t seed, uint64_t offset) {
  static const char fn[] = "lutra_attention_set_rng_state";
  TRY(check_attention(mod, fn));
  set_rng((attention *)mod, seed, offset);
  return LUTRA_OK;
}

int lutra_attention_plans(const lutra_module *mod, int *count, int *deterministic) {
  static const char fn[] = "lutra_attention_plans";
  TRY(check_attention(mod, fn));
  const attention *m = (const attention *)mod;
  if (count) *count = attention_plans_count(&m->plans);
  if (deterministic)
    *deterministic =
        m->last != LUTRA_ATTENTION_NONE ? m->plans.slot[m->plan_slot].deterministic : -1;
  return LUTRA_OK;
}

int lutra_attention_fp8_state(const lutra_module *mod, float *scales, float *history,
                              int *history_len, int *last_fp8) {
  static const char fn[] = "lutra_attention_fp8_state";
  TRY(check_attention(mod, fn));
  const attention_fp8 *f = &((const attention *)mod)->fp8;
  const int len = f->history_len;
  for (int t = 0; scales && t < LUTRA_ATTENTION_FP8_TENSORS; t++) {
    if (!len) {
      scales[t] = 1.0f;
      continue;
    }
    int st = f->be->to_host(&scales[t], f->metas[t].scale, sizeof(float));
    if (st != LUTRA_OK) return lutra_error_wrap(st, fn);
  }
  if (history && len) {
    int st = f->be->to_host(history, f->state + LUTRA_ATTN_FP8_HISTORY,
                            (size_t)(LUTRA_ATTENTION_FP8_TENSORS * len) * sizeof(float));
    if (st != LUTRA_OK) return lutra_error_wrap(st, fn);
  }
  if (history_len) *history_len = len;
  if (last_fp8) *last_fp8 = f->last;
  return LUTRA_OK;
}
