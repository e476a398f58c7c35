/* The GEMM front: checks shapes, turns FP8 GEMMs into TN through columnwise copies, finds the
 * plan for the shape in a hash table (created once per key, where a backend would run its
 * algorithm heuristic) and hands the backend a workspace that was sized when the plan was
 * made. A steady loop does one hash lookup and no allocation per GEMM.
 *
 * Plans are per thread: a plan's descriptor is written per call (scale and bias pointers) and
 * its one-GEMM graphs are captured on the thread's stream, so two threads never share one.
 * Workspaces are per stream where the backend has streams (gemm_workspace: CUDA keeps one per
 * thread and stream), else per thread (a thread is the CPU analogue of a stream): two GEMMs
 * that may run at once never share scratch memory. A thread's plans and CPU workspace are
 * freed when it exits (a pthread key destructor).
 *
 * The plans of a thread and device are bounded: shapes that keep changing (GroupedLinear's
 * per-expert GEMMs, one shape per split size, when the routing changes every step) would grow
 * the table without end, each plan with its descriptors and one-GEMM graphs. At the limit
 * (LUTRA_GEMM_PLAN_LIMIT in the environment at load, default 4096) the next new shape first
 * frees them all; the ones still in use are made again (a heuristic query each) as they come.
 * The lookup itself pays nothing for the bound. A graph a freed plan captured is destroyed
 * safely while a launch of it still runs (CUDA frees it when that completes). */
#include "gemm/gemm.h"
#include "backend/backend.h"
#include "backend/determinism.h"
#include "backend/device.h"
#include "core/capture.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/object.h"
#include "core/trace.h"
#include "runtime/tensor.h"

#ifdef LUTRA_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct plan_cache {
  lutra_gemm_plan **slots; /* open addressing, power-of-two capacity */
  int cap, count;
} plan_cache;

typedef struct workspace {
  void *ptr;
  size_t bytes;
} workspace;

enum { NUM_DEVICES = 2 };
typedef struct thread_gemm {
  plan_cache caches[NUM_DEVICES];
  workspace workspaces[NUM_DEVICES];          /* for backends without gemm_workspace */
  const lutra_backend *backends[NUM_DEVICES]; /* which frees the plans and workspace */
  bool registered;                            /* the exit destructor will run */
} thread_gemm;
static _Thread_local thread_gemm tg;

static int plan_limit = 4096;

__attribute__((constructor)) static void read_plan_limit(void) {
  const char *v = getenv("LUTRA_GEMM_PLAN_LIMIT");
  long n = v ? strtol(v, NULL, 10) : 0;
  if (n > 0 && n <= (1L << 24)) plan_limit = (int)n;
}

static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t exit_key;
static bool key_ok;
static atomic_int live_threads; /* threads whose plans or workspace are not freed yet */

/* Thread exit: the plans (their cuBLASLt descriptors and one-GEMM graphs; a graph the GPU
 * still runs is released when it completes) and the per-thread workspace. Nothing here is
 * reachable from another thread. */
static void free_plans(const lutra_backend *be, plan_cache *c) {
  for (int i = 0; i < c->cap; i++) {
    lutra_gemm_plan *p = c->slots[i];
    if (!p) continue;
    if (be && be->gemm_plan_free) be->gemm_plan_free(p);
    free(p);
    c->slots[i] = NULL;
  }
  c->count = 0;
}

static void thread_exit(void *arg) {
  (void)arg;
  for (int d = 0; d < NUM_DEVICES; d++) {
    const lutra_backend *be = tg.backends[d];
    plan_cache *c = &tg.caches[d];
    free_plans(be, c);
    free(c->slots);
    *c = (plan_cache){0};
    if (tg.workspaces[d].ptr && be) be->free(tg.workspaces[d].ptr);
    tg.workspaces[d] = (workspace){0};
  }
  tg.registered = false;
  atomic_fetch_sub(&live_threads, 1);
}

static void make_key(void) {
  key_ok = pthread_key_create(&exit_key, thread_exit) == 0;
}

/* Arms the exit destructor the first time this thread keeps something (any non-NULL value). */
static void register_thread(const lutra_backend *be) {
  tg.backends[be->device] = be;
  if (tg.registered) return;
  pthread_once(&key_once, make_key);
  if (key_ok && pthread_setspecific(exit_key, &tg) == 0) {
    tg.registered = true;
    atomic_fetch_add(&live_threads, 1);
  }
}

/* Threads whose GEMM plans (or per-thread workspace) are still held: each thread's are freed
 * when it exits. For the thread checks (spec/native/threads_check.c: lutra_thread_caches). */
static int gemm_live_threads(void) {
  return atomic_load(&live_threads);
}

/* FNV-1a over the key's 8-byte words (the key is a whole number of them, without padding):
 * a fifth of the instructions of the byte-wise loop on the per-GEMM path */
static uint64_t key_hash(const lutra_gemm_key *k) {
  _Static_assert(sizeof *k % 8 == 0, "lutra_gemm_key must be a whole number of 8-byte words");
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < sizeof *k; i += 8) {
    uint64_t w;
    memcpy(&w, (const unsigned char *)k + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29; /* fold the high bits down: the table index uses the low ones */
  }
  return h;
}

/* the keys compared as 8-byte words (no padding: the _Static_asserts), inline: a memcmp call
 * costs more than the compare on every GEMM */
static bool key_equal(const lutra_gemm_key *a, const lutra_gemm_key *b) {
  uint64_t diff = 0;
  for (size_t i = 0; i < sizeof *a; i += 8) {
    uint64_t x, y;
    memcpy(&x, (const char *)a + i, 8);
    memcpy(&y, (const char *)b + i, 8);
    diff |= x ^ y;
  }
  return diff == 0;
}

static lutra_gemm_plan *cache_find(const plan_cache *c, const lutra_gemm_key *k, uint64_t h) {
  if (!c->cap) return NULL;
  for (int i = (int)(h & (uint64_t)(c->cap - 1));; i = (i + 1) & (c->cap - 1)) {
    lutra_gemm_plan *p = c->slots[i];
    if (!p) return NULL;
    if (key_equal(&p->key, k)) return p;
  }
}

static void cache_put(plan_cache *c, lutra_gemm_plan *p) {
  int i = (int)(key_hash(&p->key) & (uint64_t)(c->cap - 1));
  while (c->slots[i])
    i = (i + 1) & (c->cap - 1);
  c->slots[i] = p;
  c->count++;
}

static int cache_grow(plan_cache *c, const char *fn) {
  if (2 * (c->count + 1) <= c->cap) return LUTRA_OK;
  int cap = c->cap ? 2 * c->cap : 64;
  lutra_gemm_plan **slots = calloc((size_t)cap, sizeof *slots);
  if (!slots) return lutra_error(LUTRA_ENOMEM, fn, "cannot grow the GEMM plan cache");
  plan_cache bigger = {slots, cap, 0};
  for (int i = 0; i < c->cap; i++)
    if (c->slots[i]) cache_put(&bigger, c->slots[i]);
  free(c->slots);
  *c = bigger;
  return LUTRA_OK;
}

static int ensure_workspace(const lutra_backend *be, size_t bytes, const char *fn) {
  if (be->gemm_workspace) {
    void *p;
    size_t have;
    return be->gemm_workspace(bytes, &p, &have);
  }
  workspace *w = &tg.workspaces[be->device];
  if (w->bytes >= bytes) return LUTRA_OK;
  void *p;
  if (be->alloc(bytes, &p) != LUTRA_OK)
    return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a %zu-byte GEMM workspace", bytes);
  if (w->ptr) be->free(w->ptr);
  w->ptr = p;
  w->bytes = bytes;
  return LUTRA_OK;
}

static int plan_for(const lutra_backend *be, const lutra_gemm_key *k, const lutra_gemm_plan **out,
                    const char *fn) {
  plan_cache *c = &tg.caches[be->device];
  uint64_t h = key_hash(k);
  lutra_gemm_plan *p = cache_find(c, k, h);
  if (p) {
    *out = p;
    return LUTRA_OK;
  }
  CHECK_STATE(!lutra_capture_active,
              "a GEMM of a new shape (%lldx%lldx%lld) while capturing a CUDA graph: run the step "
              "once eagerly with the same shapes before capturing",
              (long long)k->m, (long long)k->n, (long long)k->k);
  register_thread(be);
  if (c->count >= plan_limit) free_plans(be, c); /* the bound (see the top of the file) */
  TRY(cache_grow(c, fn));
  p = calloc(1, sizeof *p);
  if (!p) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a GEMM plan");
  p->key = *k;
  int st = be->gemm_plan(p);
  if (st == LUTRA_OK) st = ensure_workspace(be, p->workspace_bytes, fn);
  if (st != LUTRA_OK) {
    if (be->gemm_plan_free) be->gemm_plan_free(p);
    free(p);
    return st;
  }
  cache_put(c, p);
  *out = p;
  return LUTRA_OK;
}

static void operand_of(const lutra_tensor *t, int trans, lutra_gemm_operand *o) {
  o->data = t->data;
  o->scale_inv = t->scale_inv;
  o->dtype = t->dtype;
  o->scaling = t->scaling;
  o->rows = lutra_rows(t);
  o->cols = lutra_cols(t);
  o->trans = trans;
}

/* Hopper runs FP8 GEMMs only as TN: an FP8 operand used the other way is replaced by its
 * columnwise copy (the transpose), used the TN way. */
static int to_tn(const lutra_tensor *t, int want_trans, lutra_gemm_operand *o, const char *name,
                 const char *fn) {
  if (o->trans == want_trans) {
    CHECK_ARG(o->data, "operand %s has no rowwise data for this layout", name);
    return LUTRA_OK;
  }
  CHECK_ARG(t->col_data, "FP8 operand %s needs its columnwise copy for this layout", name);
  o->data = t->col_data;
  o->scale_inv = t->col_scale_inv;
  o->rows = lutra_cols(t);
  o->cols = lutra_rows(t);
  o->trans = want_trans;
  return LUTRA_OK;
}

static const char *layout_name(int transa, int transb) {
  static const char *const names[4] = {"NN", "NT", "TN", "TT"};
  return names[(transa ? 2 : 0) + (transb ? 1 : 0)];
}

/* plans are found by comparing the key's bytes: it must have no padding bytes */
_Static_assert(sizeof(lutra_gemm_key) == 3 * sizeof(int64_t) + 16 * sizeof(int32_t),
               "lutra_gemm_key has padding: add or remove an int32_t field");

static const char *epilogue_name(int kind) {
  static const char *const names[LUTRA_NUM_EPILOGUES] = {"NONE",  "GELU",        "GELU_AUX",
                                                         "DGELU", "DGELU_BGRAD", "BGRADB"};
  return kind >= 0 && kind < LUTRA_NUM_EPILOGUES ? names[kind] : "?";
}

/* an output that would overwrite an operand's data (rowwise or columnwise) */
static bool shares_data(const lutra_tensor *out, const lutra_tensor *in) {
  return out->data && (out->data == in->data || out->data == in->col_data);
}

/* The combination rules of lutra_gemm_epilogue (lutra.h), checked before anything runs.
 * D is [m, n]; fp8 says the operands are FP8. */
static int check_epilogue(const lutra_gemm_epilogue *epi, const lutra_tensor *a,
                          const lutra_tensor *b, const lutra_tensor *d, const lutra_tensor *bias,
                          int accumulate, bool fp8, int64_t m, int64_t n, const char *fn) {
  const int kind = epi->kind;
  CHECK_ARG(kind >= 0 && kind < LUTRA_NUM_EPILOGUES, "unknown epilogue kind %d (expected 0..%d)",
            kind, LUTRA_NUM_EPILOGUES - 1);
  const char *name = epilogue_name(kind);
  const bool gelu = kind == LUTRA_EPILOGUE_GELU || kind == LUTRA_EPILOGUE_GELU_AUX;
  const bool dgelu = kind == LUTRA_EPILOGUE_DGELU || kind == LUTRA_EPILOGUE_DGELU_BGRAD;
  const bool wants_aux = kind == LUTRA_EPILOGUE_GELU_AUX || dgelu;
  const bool wants_dbias = kind == LUTRA_EPILOGUE_DGELU_BGRAD || kind == LUTRA_EPILOGUE_BGRADB;
  CHECK_ARG(!(gelu || dgelu) || !accumulate,
            "epilogue %s cannot accumulate into D (the activation would apply to D + op(B) op(A)); "
            "only NONE and BGRADB accumulate",
            name);
  CHECK_ARG(!bias || kind <= LUTRA_EPILOGUE_GELU_AUX,
            "epilogue %s takes no bias (only NONE, GELU and GELU_AUX add one)", name);
  CHECK_ARG(!fp8 || kind != LUTRA_EPILOGUE_BGRADB,
            "epilogue %s needs f32, bf16 or f16 operands (its bias gradient sums op(B))", name);
  if (!wants_aux) {
    CHECK_ARG(!epi->aux, "epilogue %s takes no aux tensor", name);
  } else {
    const lutra_tensor *aux = epi->aux;
    CHECK_ARG(aux, "epilogue %s needs an aux tensor [%lld, %lld] (%s)", name, (long long)m,
              (long long)n,
              kind == LUTRA_EPILOGUE_GELU_AUX ? "it receives the pre-activation"
                                              : "the pre-activation saved by GELU_AUX");
    TRY(lutra_check_tensor(aux, fn, "aux"));
    CHECK_ARG(lutra_rows(aux) == m && lutra_cols(aux) == n,
              "aux is %lldx%lld, expected %lldx%lld (the shape of D)", (long long)lutra_rows(aux),
              (long long)lutra_cols(aux), (long long)m, (long long)n);
    CHECK_ARG(aux->dtype == d->dtype, "aux dtype %s differs from D's %s",
              lutra_dtype_name(aux->dtype), lutra_dtype_name(d->dtype));
    CHECK_ARG(aux->device == d->device, "aux is on another device than D");
    CHECK_ARG(aux != d && (aux->data != d->data || m * n == 0), "aux must not be D itself");
    CHECK_ARG(aux->data || m * n == 0, "aux has no data");
    CHECK_ARG(kind != LUTRA_EPILOGUE_GELU_AUX || !(shares_data(aux, a) || shares_data(aux, b)),
              "aux (an output of GELU_AUX) must not be operand A or B");
  }
  if (!wants_dbias) {
    CHECK_ARG(!epi->dbias, "epilogue %s takes no dbias tensor", name);
  } else {
    const lutra_tensor *db = epi->dbias;
    const bool rows = kind == LUTRA_EPILOGUE_BGRADB;
    const int64_t want = rows ? m : n;
    CHECK_ARG(db, "epilogue %s needs a dbias tensor of %lld elements", name, (long long)want);
    TRY(lutra_check_tensor(db, fn, "dbias"));
    CHECK_ARG(lutra_dtype_is_float(db->dtype), "dbias dtype %s is not f32, bf16 or f16",
              lutra_dtype_name(db->dtype));
    CHECK_ARG(db->numel == want, "dbias has %lld elements, expected %lld (%s)",
              (long long)db->numel, (long long)want,
              rows ? "D's rows: op(B) summed over k" : "D's columns");
    CHECK_ARG(db->device == d->device, "dbias is on another device than D");
    CHECK_ARG(db != d && (db->data != d->data || want == 0), "dbias must not be D itself");
    CHECK_ARG(!epi->aux || db != epi->aux, "dbias must not be the aux tensor");
    CHECK_ARG(db->data || want == 0, "dbias has no data");
    CHECK_ARG(!(shares_data(db, a) || shares_data(db, b)), "dbias must not be operand A or B");
  }
  return LUTRA_OK;
}

/* An addend C (lutra_gemm_op.c): D's shape and dtype, its own buffer, no activation after it. */
static int check_addend(const lutra_tensor *c, const lutra_tensor *d, int kind, bool accumulate,
                        const char *fn) {
  CHECK_ARG(kind == LUTRA_EPILOGUE_NONE && !accumulate,
            "an addend C needs epilogue NONE and no accumulate (D = op(B) op(A) + bias + C)");
  CHECK_ARG(c->dtype == d->dtype && c->scaling == LUTRA_SCALING_NONE,
            "the addend C is %s, D is %s: they must match", lutra_dtype_name(c->dtype),
            lutra_dtype_name(d->dtype));
  CHECK_ARG(c->numel == d->numel && lutra_cols(c) == lutra_cols(d),
            "the addend C is %lldx%lld, D is %lldx%lld", (long long)lutra_rows(c),
            (long long)lutra_cols(c), (long long)lutra_rows(d), (long long)lutra_cols(d));
  CHECK_ARG(c->device == d->device, "the addend C is on another device than D");
  CHECK_ARG(c->numel == 0 || (c->data && c->data != d->data),
            "the addend C must have data of its own (not D's)");
  return LUTRA_OK;
}

int lutra_gemm_run(const lutra_gemm_op *op, const char *fn) {
  const lutra_tensor *a = op->a, *b = op->b, *bias = op->bias;
  lutra_tensor *d = op->d;
  const lutra_gemm_epilogue *epi = op->epilogue;
  const bool transa = op->transa, transb = op->transb, accumulate = op->accumulate;
  static const lutra_gemm_epilogue none = {LUTRA_EPILOGUE_NONE, 0, NULL, NULL};
  if (!epi) epi = &none;
  int64_t ra = lutra_rows(a), ca = lutra_cols(a), rb = lutra_rows(b), cb = lutra_cols(b);
  int64_t n = transa ? ra : ca, ka = transa ? ca : ra;
  int64_t m = transb ? cb : rb, kb = transb ? rb : cb;
  CHECK_ARG(ka == kb, "inner dims differ: A is %lldx%lld, B is %lldx%lld in layout %s",
            (long long)ra, (long long)ca, (long long)rb, (long long)cb,
            layout_name(transa, transb));
  CHECK_ARG(lutra_rows(d) == m && lutra_cols(d) == n,
            "D is %lldx%lld, expected %lldx%lld for layout %s", (long long)lutra_rows(d),
            (long long)lutra_cols(d), (long long)m, (long long)n, layout_name(transa, transb));
  CHECK_ARG(lutra_dtype_is_float(d->dtype), "D dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(d->dtype));
  bool fp8a = lutra_dtype_is_quantized(a->dtype), fp8b = lutra_dtype_is_quantized(b->dtype);
  CHECK_ARG(fp8a || lutra_dtype_is_float(a->dtype), "A dtype %s cannot be a GEMM operand",
            lutra_dtype_name(a->dtype));
  CHECK_ARG(fp8b || lutra_dtype_is_float(b->dtype), "B dtype %s cannot be a GEMM operand",
            lutra_dtype_name(b->dtype));
  CHECK_ARG(fp8a == fp8b, "A is %s and B is %s: both operands must be FP8 or neither",
            lutra_dtype_name(a->dtype), lutra_dtype_name(b->dtype));
  CHECK_ARG(!(a->dtype == LUTRA_E5M2 && b->dtype == LUTRA_E5M2),
            "E5M2 x E5M2 GEMMs are not supported");
  CHECK_ARG((a->dtype == LUTRA_E2M1) == (b->dtype == LUTRA_E2M1),
            "A is %s and B is %s: an NVFP4 (e2m1) operand needs an NVFP4 partner",
            lutra_dtype_name(a->dtype), lutra_dtype_name(b->dtype));
  CHECK_ARG(a->device == d->device && b->device == d->device, "operands on different devices");
  if (bias) {
    CHECK_ARG(lutra_dtype_is_float(bias->dtype), "bias dtype %s is not f32, bf16 or f16",
              lutra_dtype_name(bias->dtype));
    CHECK_ARG(bias->numel == n, "bias has %lld elements, D has %lld columns",
              (long long)bias->numel, (long long)n);
    CHECK_ARG(bias->device == d->device, "bias is on another device");
  }
  TRY(check_epilogue(epi, a, b, d, bias, accumulate, fp8a, m, n, fn));
  if (op->c) TRY(check_addend(op->c, d, epi->kind, accumulate, fn));
  const lutra_backend *be;
  TRY(lutra_backend_get(d->device, &be, fn));

  lutra_gemm_args g = {0};
  operand_of(a, transa, &g.a);
  operand_of(b, transb, &g.b);
  if (fp8a) {
    TRY(to_tn(a, 1, &g.a, "A", fn));
    TRY(to_tn(b, 0, &g.b, "B", fn));
  } else {
    CHECK_ARG(a->data && b->data, "operands have no data");
  }
  g.d = d->data;
  g.d_dtype = d->dtype;
  g.accumulate = accumulate != 0;
  g.c = op->c ? op->c->data : NULL;
  g.m = m;
  g.n = n;
  g.k = ka;
  g.bias = bias ? bias->data : NULL;
  g.bias_dtype = bias ? bias->dtype : -1;
  g.epilogue = epi->kind;
  g.aux = epi->aux ? epi->aux->data : NULL;
  g.aux_dtype = epi->aux ? epi->aux->dtype : -1;
  g.dbias = epi->dbias ? epi->dbias->data : NULL;
  g.dbias_dtype = epi->dbias ? epi->dbias->dtype : -1;
  g.bias_first = op->bias_first;

  lutra_gemm_key k;
  memset(&k, 0, sizeof k);
  k.m = m;
  k.n = n;
  k.k = ka;
  k.a_dtype = a->dtype;
  k.b_dtype = b->dtype;
  k.d_dtype = d->dtype;
  k.bias_dtype = g.bias_dtype;
  k.a_scaling = a->scaling;
  k.b_scaling = b->scaling;
  k.transa = g.a.trans;
  k.transb = g.b.trans;
  k.accumulate = g.accumulate || g.c; /* C beside D: the same plan, beta 1 */
  k.fast_accum = op->fast_accum;
  k.device = d->device;
  k.epilogue = g.epilogue;
  k.aux_dtype = g.aux_dtype;
  k.dbias_dtype = g.dbias_dtype;
  k.deterministic = lutra_deterministic_on();
  TRY(plan_for(be, &k, &g.plan, fn));
  if (op->epilogue_declined) {
    *op->epilogue_declined = g.plan->epilogue_after;
    if (g.plan->epilogue_after) return LUTRA_OK;
  }
  if (be->gemm_workspace) {
    /* the plan may have been made on another of this thread's streams */
    TRY(be->gemm_workspace(g.plan->workspace_bytes, &g.workspace, &g.workspace_bytes));
  } else {
    workspace *w = &tg.workspaces[be->device];
    g.workspace = w->ptr;
    g.workspace_bytes = w->bytes;
  }
  RANGE_PUSH("lutra.gemm");
  int st = be->gemm(&g);
  RANGE_POP();
  return st;
}

/* The CPU GEMM writes D while it still reads A and B: D sharing a buffer with either gives
 * wrong results (and the CUDA one is undefined), so the public entries refuse it. */
static bool shares(const lutra_tensor *d, const lutra_tensor *x) {
  if (!x) return false;
  if (d == x) return true;
  const void *dp[] = {d->data, d->col_data};
  const void *xp[] = {x->data, x->col_data};
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++)
      if (dp[i] && dp[i] == xp[j]) return true;
  return false;
}

static int check_public(const lutra_tensor *a, int transa, const lutra_tensor *b, int transb,
                        const lutra_tensor *d, const lutra_tensor *bias, const char *fn) {
  TRY(lutra_check_tensor(a, fn, "A"));
  TRY(lutra_check_tensor(b, fn, "B"));
  TRY(lutra_check_tensor(d, fn, "D"));
  if (bias) TRY(lutra_check_tensor(bias, fn, "bias"));
  CHECK_ARG(transa == 0 || transa == 1, "transa must be 0 or 1 (got %d)", transa);
  CHECK_ARG(transb == 0 || transb == 1, "transb must be 0 or 1 (got %d)", transb);
  CHECK_ARG(!shares(d, a), "D aliases A (the output must be a separate tensor)");
  CHECK_ARG(!shares(d, b), "D aliases B (the output must be a separate tensor)");
  CHECK_ARG(!shares(d, bias), "D aliases bias (the output must be a separate tensor)");
  return LUTRA_OK;
}

int lutra_gemm(const lutra_tensor *a, int transa, const lutra_tensor *b, int transb,
               lutra_tensor *d, const lutra_tensor *bias, int accumulate) {
  static const char fn[] = "lutra_gemm";
  TRY(check_public(a, transa, b, transb, d, bias, fn));
  return lutra_gemm_run(&(lutra_gemm_op){.a = a,
                                         .b = b,
                                         .d = d,
                                         .bias = bias,
                                         .transa = transa,
                                         .transb = transb,
                                         .accumulate = accumulate != 0},
                        fn);
}

int lutra_gemm_ex(const lutra_tensor *a, int transa, const lutra_tensor *b, int transb,
                  lutra_tensor *d, const lutra_tensor *bias, int accumulate,
                  const lutra_gemm_epilogue *epi) {
  static const char fn[] = "lutra_gemm_ex";
  TRY(check_public(a, transa, b, transb, d, bias, fn));
  return lutra_gemm_run(&(lutra_gemm_op){.a = a,
                                         .b = b,
                                         .d = d,
                                         .bias = bias,
                                         .epilogue = epi,
                                         .transa = transa,
                                         .transb = transb,
                                         .accumulate = accumulate != 0},
                        fn);
}

int lutra_gemm_cache_stats(int *plans, size_t *workspace_bytes) {
  static const char fn[] = "lutra_gemm_cache_stats";
  CHECK_ARG(plans && workspace_bytes, "output pointers must not be NULL");
  *plans = 0;
  *workspace_bytes = 0;
  for (int i = 0; i < NUM_DEVICES; i++) {
    *plans += tg.caches[i].count;
    const lutra_backend *be = tg.backends[i];
    void *p;
    size_t have = 0;
    if (be && be->gemm_workspace && be->gemm_workspace(0, &p, &have) == LUTRA_OK)
      *workspace_bytes += have;
    else
      *workspace_bytes += tg.workspaces[i].bytes;
  }
  return LUTRA_OK;
}

/* The GEMM graphs are the CUDA backend's (backend/cuda/call_graphs.c); zero elsewhere. */
int lutra_gemm_graph_stats(int64_t *graphs, int64_t *launches) {
  static const char fn[] = "lutra_gemm_graph_stats";
  CHECK_ARG(graphs && launches, "output pointers must not be NULL");
  *graphs = *launches = 0;
#ifdef LUTRA_WITH_CUDA
  lutra_call_graphs_stats(LUTRA_CALLS_GEMM, graphs, launches);
#endif
  return LUTRA_OK;
}

int lutra_thread_caches(int *gemm, int *cuda) {
  static const char fn[] = "lutra_thread_caches";
  CHECK_ARG(gemm && cuda, "output pointers must not be NULL");
  *gemm = gemm_live_threads();
  *cuda = 0;
#ifdef LUTRA_WITH_CUDA
  *cuda = lutra_cuda_live_threads();
#endif
  return LUTRA_OK;
}
