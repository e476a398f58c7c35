/* nn.Embedding (lutra/embedding.h): a lookup table. The forward gathers weight rows into an owned
 * output kept per ids' shape; the backward writes the weight gradient through the backend's
 * deterministic scatter (rows summed in increasing position order: lutra_embedding_args), with a
 * scratch the backend sizes once per number of ids and the module keeps (grown only), so a
 * training step with stable shapes allocates nothing and captures as a CUDA graph. On a device,
 * out-of-range ids set a flag the module owns (as the cross-entropy loss's bad_label), read and
 * cleared by lutra_embedding_check. */
#include "backend/backend.h"
#include "backend/device.h"
#include "core/capture.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/object.h"
#include "nn/module.h"
#include "parallel/group.h"
#include "runtime/tensor.h"
#include "runtime/tensor_cache.h"

#include <stdlib.h>

typedef struct embedding {
  lutra_module base;
  int64_t vocab, dim;
  int32_t dtype, device;
  bool accumulate_main_grad;
  bool forward_grad, forward_done, backward_done;
  const lutra_backend *be;
  lutra_tensor *weight, *wgrad, *main_grad;
  /* weight tying: the state of the weight a Linear may share (nn/tie.h), and this module's
   * stamp of its last forward */
  lutra_tie tie;
  uint64_t forward_at;
  /* the last forward's output, held: a failed forward's new shape may evict it from the cache */
  const lutra_tensor *y;
  lutra_tensor_cache y_cache;
  const lutra_tensor *ids; /* the last forward's, held for the backward */
  lutra_tensor *bad_id;    /* on a device: i32 [1] (lutra_embedding_args.bad_id) */
  lutra_tensor *scratch;   /* the backward's, bytes for scratch_n ids (grown only) */
  int64_t scratch_n;
  size_t scratch_bytes;
} embedding;

static const lutra_module_ops embedding_ops;

static int emb_forward(lutra_module *m, const lutra_tensor *ids, const lutra_forward_args *fa,
                       lutra_tensor **y) {
  static const char fn[] = "lutra_embedding_forward";
  embedding *e = (embedding *)m;
  CHECK_ARG(ids->dtype == LUTRA_I32, "ids must be i32, not %s", lutra_dtype_name(ids->dtype));
  CHECK_ARG(ids->device == e->device, "ids are on another device than the module");
  CHECK_ARG(ids->ndim >= 1 && ids->ndim <= 3, "ids must have 1 to 3 dims (got %d)", (int)ids->ndim);
  CHECK_ARG(ids->numel > 0, "ids are empty");
  CHECK_ARG(ids->numel <= INT32_MAX, "%lld ids (at most 2^31 - 1)", (long long)ids->numel);
  int64_t shape[LUTRA_MAX_DIMS];
  for (int i = 0; i < ids->ndim; i++)
    shape[i] = ids->shape[i];
  shape[ids->ndim] = e->dim;
  lutra_tensor *out;
  TRY(lutra_tensor_cache_get(&e->y_cache, PLAIN_TENSOR(e->dtype, ids->ndim + 1, shape, e->device),
                             &out, fn));
  const lutra_embedding_args a = {.ids = ids->data,
                                  .weight = e->weight->data,
                                  .out = out->data,
                                  .dtype = e->dtype,
                                  .n = ids->numel,
                                  .dim = e->dim,
                                  .vocab = e->vocab,
                                  .bad_id = e->bad_id ? e->bad_id->data : NULL};
  int st = e->be->embedding_forward(&a);
  if (st != LUTRA_OK) return lutra_error_wrap(st, fn);
  lutra_tensor_hold(&e->y, out);
  e->forward_done = true;
  e->forward_grad = fa->grad != 0;
  e->backward_done = false;
  if (fa->grad) e->forward_at = lutra_tie_forward(&e->tie);
  lutra_tensor_hold(&e->ids, fa->grad ? ids : NULL);
  *y = out;
  return LUTRA_OK;
}

/* the backend's scratch for n ids: its size asked once per n, the buffer grown only */
static int ensure_scratch(embedding *e, int64_t n, const char *fn) {
  if (n == e->scratch_n) return LUTRA_OK;
  size_t bytes = 0;
  TRY(e->be->embedding_scratch(n, e->vocab, &bytes));
  if (!e->scratch || bytes > e->scratch_bytes) {
    /* raw bytes, as f32 words (any 4-byte dtype would do; the backend reads it as bytes) */
    int64_t words = (int64_t)((bytes + 3) / 4);
    lutra_tensor_spec spec = *PLAIN_TENSOR(LUTRA_F32, 1, &words, e->device);
    spec.flags = LUTRA_TENSOR_BORROWED;
    lutra_tensor *t;
    TRY(lutra_tensor_make(&spec, &t, fn));
    lutra_tensor_owner_drop(e->scratch);
    e->scratch = t;
    e->scratch_bytes = (size_t)words * 4;
  }
  e->scratch_n = n;
  return LUTRA_OK;
}

static int emb_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  static const char fn[] = "lutra_embedding_backward";
  embedding *e = (embedding *)m;
  CHECK_STATE(e->forward_done, "backward called before forward");
  CHECK_STATE(e->forward_grad, "the last forward ran with grad = false (inference): it kept "
                               "nothing for a backward");
  CHECK_STATE(!(e->backward_done && e->accumulate_main_grad),
              "a second backward of one forward would add its gradients into main_grad twice: "
              "run a forward before each backward");
  CHECK_STATE(!(e->ids->flags & LUTRA_TENSOR_FREED), "the ids saved by forward were freed");
  CHECK_STATE(!(e->y->flags & LUTRA_TENSOR_FREED), "the output of the last forward was freed");
  CHECK_ARG(dy->dtype == e->dtype, "grad_output dtype %s does not match the module's %s",
            lutra_dtype_name(dy->dtype), lutra_dtype_name(e->dtype));
  CHECK_ARG(dy->device == e->device, "grad_output is on another device than the module");
  CHECK_ARG(lutra_same_shape(dy, e->y), "grad_output shape does not match the forward output");
  TRY(ensure_scratch(e, e->ids->numel, fn));
  lutra_tensor *g = e->accumulate_main_grad ? e->main_grad : e->wgrad;
  /* a tied Linear that wrote the gradient since this forward: add to its part (nn/tie.h) */
  const bool adds = lutra_tie_adds(&e->tie, &e->forward_at);
  const lutra_embedding_args a = {.ids = e->ids->data,
                                  .dy = dy->data,
                                  .wgrad = g->data,
                                  .dtype = e->dtype,
                                  .accumulate = e->accumulate_main_grad ? LUTRA_EMBEDDING_ADD_F32
                                                : adds                  ? LUTRA_EMBEDDING_ADD
                                                                        : LUTRA_EMBEDDING_OVERWRITE,
                                  .n = e->ids->numel,
                                  .dim = e->dim,
                                  .vocab = e->vocab,
                                  .bad_id = e->bad_id ? e->bad_id->data : NULL,
                                  .scratch = e->scratch->data,
                                  .scratch_bytes = (int64_t)e->scratch_bytes};
  int st = e->be->embedding_backward(&a);
  if (st != LUTRA_OK) return lutra_error_wrap(st, fn);
  if (LUTRA_CAPTURING()) {
    TRY(lutra_capture_hold_tensor(e->ids, fn));
    TRY(lutra_capture_hold_tensor(e->scratch, fn));
  }
  e->backward_done = true;
  if (lutra_tie_wrote(&e->tie, &e->forward_at, adds)) lutra_dist_grad_ready(g);
  if (dx) *dx = NULL; /* ids are data: no input gradient */
  return LUTRA_OK;
}

static int emb_num_params(const lutra_module *m) {
  (void)m;
  return 1;
}

static int emb_param(const lutra_module *m, int i, lutra_param *out) {
  const embedding *e = (const embedding *)m;
  (void)i;
  *out = (lutra_param){e->weight, e->wgrad, e->main_grad};
  return LUTRA_OK;
}

static void emb_release(lutra_module *m) {
  embedding *e = (embedding *)m;
  lutra_tensor_hold(&e->ids, NULL);
  lutra_tensor_hold(&e->y, NULL);
  lutra_tensor_cache_release(&e->y_cache);
  lutra_tensor *owned[] = {e->weight, e->wgrad, e->main_grad, e->bad_id, e->scratch};
  for (size_t i = 0; i < sizeof owned / sizeof *owned; i++)
    lutra_tensor_owner_drop(owned[i]);
  e->weight = e->wgrad = e->main_grad = e->bad_id = e->scratch = NULL;
  e->scratch_n = 0;
}

static lutra_tie *emb_tie(lutra_module *m, int i) {
  return i == 0 ? &((embedding *)m)->tie : NULL;
}

/* a leaf: parameter 0 is "weight" (<m>weight in checkpoints); no FP8 state */
static const lutra_checkpoint_ops embedding_checkpoint = {0};

static const lutra_module_ops embedding_ops = {.kind = "embedding",
                                               .forward = emb_forward,
                                               .backward = emb_backward,
                                               .num_params = emb_num_params,
                                               .param = emb_param,
                                               .release = emb_release,
                                               .checkpoint = &embedding_checkpoint,
                                               .tie = emb_tie};

void lutra_embedding_defaults(lutra_embedding_desc *d) {
  if (!d) return;
  *d = (lutra_embedding_desc){.dtype = LUTRA_F32, .device = LUTRA_CPU};
  /* two tables made from the defaults must not start from the same weights */
  lutra_seed_next(&d->seed);
}

static int make(embedding *e, int64_t n0, int64_t n1, int32_t dtype, lutra_tensor **t,
                const char *fn) {
  int64_t shape[2] = {n0, n1};
  lutra_tensor_spec spec = *PLAIN_TENSOR(dtype, n1 ? 2 : 1, shape, e->device);
  spec.flags = LUTRA_TENSOR_BORROWED;
  return lutra_tensor_make(&spec, t, fn);
}

static int init_tensors(embedding *e, uint64_t seed, const char *fn) {
  TRY(make(e, e->vocab, e->dim, e->dtype, &e->weight, fn));
  TRY(make(e, e->vocab, e->dim, e->dtype, &e->wgrad, fn));
  if (e->accumulate_main_grad) TRY(make(e, e->vocab, e->dim, LUTRA_F32, &e->main_grad, fn));
  TRY(lutra_tensor_randn(e->weight, seed, 0.0f, 1.0f));
  TRY(lutra_tensor_fill(e->wgrad, 0.0f));
  if (e->main_grad) TRY(lutra_tensor_fill(e->main_grad, 0.0f));
  if (e->device != LUTRA_CPU) {
    TRY(make(e, 1, 0, LUTRA_I32, &e->bad_id, fn));
    TRY(e->be->memset(e->bad_id->data, 0, sizeof(int32_t)));
  }
  return LUTRA_OK;
}

int lutra_embedding_new(const lutra_embedding_desc *d, lutra_module **out) {
  static const char fn[] = "lutra_embedding_new";
  CHECK_ARG(d, "desc is NULL");
  CHECK_ARG(out, "out is NULL");
  CHECK_ARG(d->num_embeddings >= 1 && d->num_embeddings <= INT32_MAX,
            "num_embeddings %lld is outside 1 .. 2^31 - 1", (long long)d->num_embeddings);
  CHECK_ARG(d->dim >= 1 && d->dim <= INT32_MAX, "dim %lld is outside 1 .. 2^31 - 1",
            (long long)d->dim);
  CHECK_ARG(lutra_dtype_is_float(d->dtype), "dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(d->dtype));
  const lutra_backend *be;
  TRY(lutra_backend_get(d->device, &be, fn));
  CHECK_ARG(be->embedding_forward && be->embedding_backward && be->embedding_scratch,
            "the %s backend has no embedding", be->name);
  embedding *e = calloc(1, sizeof *e);
  if (!e) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  lutra_module_init(&e->base, &embedding_ops);
  e->vocab = d->num_embeddings;
  e->dim = d->dim;
  e->dtype = d->dtype;
  e->device = d->device;
  e->accumulate_main_grad = d->accumulate_main_grad != 0;
  e->be = be;
  int st = init_tensors(e, d->seed, fn);
  if (st != LUTRA_OK) {
    emb_release(&e->base);
    free(e);
    return st;
  }
  *out = &e->base;
  return LUTRA_OK;
}

static int check_embedding(const lutra_module *m, const char *fn) {
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(m->ops == &embedding_ops, "module is a %s, not an embedding", m->ops->kind);
  return LUTRA_OK;
}

int lutra_embedding_check(lutra_module *m) {
  static const char fn[] = "lutra_embedding_check";
  TRY(check_embedding(m, fn));
  embedding *e = (embedding *)m;
  if (!e->bad_id) return LUTRA_OK;
  int32_t bad = 0;
  TRY(e->be->to_host(&bad, e->bad_id->data, sizeof bad));
  if (!bad) return LUTRA_OK;
  TRY(e->be->memset(e->bad_id->data, 0, sizeof bad));
  return lutra_error(LUTRA_EINVAL, fn,
                     "an id of an embedding forward since the last check was outside [0, %lld): "
                     "its output rows are NaN and its backward skipped them",
                     (long long)e->vocab);
}
