/* The CUDA backend's device and per-thread contexts (cuda_backend.h): the one-time device
 * check, each thread's stream, cuBLASLt handle and per-stream scratch.
 *
 * One device (the current one at first use). Every thread has its own stream, created at its
 * first call, and its own cuBLASLt handle: two threads training their own models must not
 * order each other's work, nor see each other's one-GEMM captures (call_graphs.c captures the
 * thread's stream). lutra_cuda_set_stream replaces the calling thread's stream only.
 *
 * Scratch that kernels fill and read later in stream order (the GEMM workspace with its
 * dequantized operands, the bias-gradient and loss partials, the fused dbias sums) is kept
 * per thread and stream (stream_state): shared between two streams, two threads' kernels run
 * at once on the same bytes. A thread's states and its stream are released by a pthread key
 * destructor when the thread exits; its handle goes back to a list for the next thread. So is
 * the thread's list of frees deferred during a capture (lutra_cuda_defer_free). */
#include "cuda_backend.h"

#include "kernels.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static struct {
  pthread_once_t once;
  int status; /* of the one-time initialization */
  char message[256];
  int device;
  pthread_key_t exit_key; /* its destructor releases a thread's context */
} cuda = {.once = PTHREAD_ONCE_INIT};

/* What lutra keeps for one stream of one thread. Nothing here is shared with another thread,
 * so none of it needs a lock; the device memory is used in this stream's order only. */
typedef struct stream_state {
  struct stream_state *next;
  cudaStream_t stream;
  bool own; /* the thread's own stream (else a caller's, from lutra_cuda_set_stream) */
  void *workspace;
  size_t workspace_bytes;
  lk_scratch reduce;  /* bias-gradient and loss partials (kernels.h) */
  void *reduce_block; /* the one allocation behind reduce */
  float *dbias;       /* fused quantize + bias gradient: column partial sums */
  int64_t dbias_floats;
  float *norm_stats; /* the fused norm + FP8 cast's row statistics when none are kept */
  int64_t norm_stat_floats;
  /* the kernel launchers' cached graphs, one cache per launcher: their keys hold this stream's
   * scratch pointers, which live as long as the state. Opaque here; released with the state by
   * the function their maker handed over (lutra_cuda_launch_graphs) */
  lutra_call_graphs *launches[LUTRA_LAUNCHERS];
  void (*release_launches)(lutra_call_graphs *);
} stream_state;

typedef struct thread_ctx {
  stream_state *cur;  /* the stream this thread's calls go to */
  stream_state *list; /* the own stream's state first, then callers' streams seen */
  cublasLtHandle_t lt;
} thread_ctx;

static _Thread_local thread_ctx *tctx;

/* The cuBLASLt handles of exited threads, which later threads take before making new ones. A
 * handle is never destroyed: cublasLtDestroy synchronizes the whole context, which is not safe
 * while another thread captures a graph of its own stream (a thread exiting while the others
 * still trained crashed inside the driver under spec/native/threads_check.c, docs/lab/). There
 * are never more handles than threads that ran at once. */
static struct {
  pthread_mutex_t lock;
  cublasLtHandle_t *idle;
  int count, cap;
} handles = {.lock = PTHREAD_MUTEX_INITIALIZER};

static cublasStatus_t handle_take(cublasLtHandle_t *h) {
  pthread_mutex_lock(&handles.lock);
  const bool have = handles.count > 0;
  if (have) *h = handles.idle[--handles.count];
  pthread_mutex_unlock(&handles.lock);
  return have ? CUBLAS_STATUS_SUCCESS : cublasLtCreate(h);
}

/* where the list cannot grow the handle is dropped: a leak, never a destroy */
static void handle_give(cublasLtHandle_t h) {
  pthread_mutex_lock(&handles.lock);
  if (handles.count == handles.cap) {
    const int cap = handles.cap ? 2 * handles.cap : 8;
    cublasLtHandle_t *grown = realloc(handles.idle, (size_t)cap * sizeof *grown);
    if (grown) {
      handles.idle = grown;
      handles.cap = cap;
    }
  }
  if (handles.count < handles.cap) handles.idle[handles.count++] = h;
  pthread_mutex_unlock(&handles.lock);
}

static void thread_exit(void *arg);
static atomic_int live_contexts; /* threads holding a context, for lutra_cuda_live_threads */
int lutra_cuda_status(cudaError_t e, const char *fn, const char *what) {
  if (e == cudaSuccess) return LUTRA_OK;
  return lutra_error(e == cudaErrorMemoryAllocation ? LUTRA_ENOMEM : LUTRA_EBACKEND, fn,
                     "%s failed: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

int lutra_cublas_status(cublasStatus_t s, const char *fn, const char *what) {
  if (s == CUBLAS_STATUS_SUCCESS) return LUTRA_OK;
  return lutra_error(s == CUBLAS_STATUS_NOT_SUPPORTED ? LUTRA_EUNSUPPORTED : LUTRA_EBACKEND, fn,
                     "%s failed: cuBLASLt status %d (%s)", what, (int)s,
                     cublasLtGetStatusString(s));
}

/* Valid after lutra_cuda_backend succeeded on this thread, which every call through the
 * backend table does first (lutra_backend_get). */
cudaStream_t lutra_cuda_stream(void) {
  return tctx->cur->stream;
}
cublasLtHandle_t lutra_cuda_lt(void) {
  return tctx->lt;
}
static stream_state *cur_state(void) {
  return tctx->cur;
}

static void init_once(void) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    snprintf(cuda.message, sizeof cuda.message, "no CUDA device is available (%s)",
             e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
    cuda.status = LUTRA_EUNSUPPORTED;
    return;
  }
  const char *step = "cudaGetDevice";
  e = cudaGetDevice(&cuda.device);
  /* the kernels are built for sm_89 and later (their FP8 conversions need it): an older GPU
   * would fail every launch, so it is reported as unavailable instead */
  int cc_major = 0, cc_minor = 0;
  if (e == cudaSuccess) {
    step = "cudaDeviceGetAttribute";
    e = cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, cuda.device);
  }
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, cuda.device);
  if (e == cudaSuccess && cc_major * 10 + cc_minor < 89) {
    snprintf(cuda.message, sizeof cuda.message,
             "CUDA device %d has compute capability %d.%d; lutra's kernels need 8.9 or later "
             "(Ada, Hopper, Blackwell)",
             cuda.device, cc_major, cc_minor);
    cuda.status = LUTRA_EUNSUPPORTED;
    return;
  }
  cudaMemPool_t pool;
  if (e == cudaSuccess) {
    step = "cudaDeviceGetDefaultMemPool";
    e = cudaDeviceGetDefaultMemPool(&pool, cuda.device);
  }
  if (e == cudaSuccess) {
    step = "cudaMemPoolSetAttribute";
    uint64_t keep = UINT64_MAX; /* never give pool memory back to the driver on sync */
    e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  }
  if (e != cudaSuccess) {
    snprintf(cuda.message, sizeof cuda.message, "CUDA initialization failed in %s: %s", step,
             cudaGetErrorString(e));
    cuda.status = LUTRA_EBACKEND;
    return;
  }
  if (pthread_key_create(&cuda.exit_key, thread_exit) != 0) {
    snprintf(cuda.message, sizeof cuda.message, "pthread_key_create failed");
    cuda.status = LUTRA_EBACKEND;
    return;
  }
  cuda.status = LUTRA_OK;
}

/* A stream's scratch for the reducing kernels, allocated with the state (not at first use), so
 * that a graph capture never meets an allocation; loss_done starts at zero. */
static cudaError_t state_init(stream_state *st) {
  const size_t bias = (size_t)LK_BIAS_PARTIALS * sizeof(double);
  const size_t loss = (size_t)LK_LOSS_PARTIALS * sizeof(double);
  void *p;
  cudaError_t e = cudaMallocAsync(&p, bias + loss + 256, st->stream);
  if (e != cudaSuccess) return e;
  e = cudaMemsetAsync((char *)p + bias + loss, 0, 256, st->stream);
  if (e != cudaSuccess) {
    cudaFreeAsync(p, st->stream);
    return e;
  }
  st->reduce_block = p;
  st->reduce = (lk_scratch){.bias_partial = p,
                            .loss_partial = (double *)((char *)p + bias),
                            .loss_done = (unsigned *)((char *)p + bias + loss)};
  return cudaSuccess;
}

/* Frees a state's device memory in on's order (its own stream, or the thread's own stream
 * once everything that could still use the memory has finished). */
static void state_release(stream_state *st, cudaStream_t on) {
  for (int i = 0; i < LUTRA_LAUNCHERS; i++)
    if (st->launches[i]) st->release_launches(st->launches[i]);
  void *ptrs[] = {st->workspace, st->reduce_block, st->dbias, st->norm_stats};
  for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++)
    if (ptrs[i]) cudaFreeAsync(ptrs[i], on);
  free(st);
}

/* Frees that arrive while this thread captures a graph (a :free(), or the garbage collector
 * finalizing a tensor from before the capture) must not become free nodes of the graph, which
 * would free the buffer again at every replay: they wait until the capture ends. The list is
 * the thread's, released with its context. */
static _Thread_local struct {
  void **ptrs;
  size_t count, cap;
} deferred;

void lutra_cuda_defer_free(void *p) {
  if (deferred.count == deferred.cap) {
    size_t cap = deferred.cap ? 2 * deferred.cap : 64;
    void **grown = realloc(deferred.ptrs, cap * sizeof *grown);
    if (!grown) return; /* cannot defer: leaking is safe, freeing into the graph is not */
    deferred.ptrs = grown;
    deferred.cap = cap;
  }
  deferred.ptrs[deferred.count++] = p;
}

void lutra_cuda_free_deferred(void) {
  for (size_t i = 0; i < deferred.count; i++)
    cudaFreeAsync(deferred.ptrs[i], lutra_cuda_stream());
  deferred.count = 0;
}

static void deferred_release(void) {
  free(deferred.ptrs);
  deferred.ptrs = NULL;
  deferred.count = deferred.cap = 0;
}

/* Thread exit (pthread key destructor). Work this thread queued may still run: the own stream
 * is drained before its memory is freed and it is destroyed. A caller's stream may already be
 * destroyed by now, so nothing is queued on it: the device is synchronized once instead, after
 * which its scratch is idle and freed in the own stream's order. */
static void thread_exit(void *arg) {
  thread_ctx *c = arg;
  stream_state *own = c->list;
  bool callers = own->next != NULL;
  if (callers) cudaDeviceSynchronize();
  for (stream_state *st = own->next, *next; st; st = next) {
    next = st->next;
    state_release(st, own->stream);
  }
  cudaStream_t s = own->stream;
  state_release(own, s);
  cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  if (c->lt) handle_give(c->lt);
  deferred_release();
  free(c);
  tctx = NULL;
  (void)cudaGetLastError();
  atomic_fetch_sub(&live_contexts, 1);
}

static int state_new(cudaStream_t s, bool own, stream_state **out, const char *fn) {
  stream_state *st = calloc(1, sizeof *st);
  if (!st) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a stream's state");
  st->stream = s;
  st->own = own;
  cudaError_t e = state_init(st);
  if (e != cudaSuccess) {
    free(st);
    return lutra_cuda_status(e, fn, "allocating the stream's kernel scratch");
  }
  *out = st;
  return LUTRA_OK;
}

/* This thread's context: its stream, handle and the own stream's state, made at its first
 * call. */
static int make_ctx(const char *fn) {
  thread_ctx *c = calloc(1, sizeof *c);
  if (!c) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate the thread's CUDA context");
  cudaStream_t s;
  cudaError_t e = cudaSetDevice(cuda.device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    free(c);
    return lutra_cuda_status(e, fn, "creating the thread's stream");
  }
  cublasStatus_t ls = handle_take(&c->lt);
  int st = ls == CUBLAS_STATUS_SUCCESS ? state_new(s, true, &c->list, fn)
                                       : lutra_cublas_status(ls, fn, "cublasLtCreate");
  if (st == LUTRA_OK && pthread_setspecific(cuda.exit_key, c) != 0) {
    state_release(c->list, s);
    st = lutra_error(LUTRA_EBACKEND, fn, "pthread_setspecific failed");
  }
  if (st != LUTRA_OK) {
    if (c->lt) handle_give(c->lt);
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    free(c);
    return st;
  }
  c->cur = c->list;
  tctx = c;
  atomic_fetch_add(&live_contexts, 1);
  return LUTRA_OK;
}

int lutra_cuda_live_threads(void) {
  return atomic_load(&live_contexts);
}

int lutra_cuda_backend(const lutra_backend **out, const char *fn) {
  pthread_once(&cuda.once, init_once);
  if (cuda.status != LUTRA_OK)
    return lutra_error(cuda.status, fn, "device 'cuda': %s", cuda.message);
  if (!tctx) TRY(make_ctx(fn));
  *out = &lutra_cuda_table;
  return LUTRA_OK;
}

int lutra_cuda_refuse_in_capture(const char *fn, const char *what) {
  if (!lutra_capture_active) return LUTRA_OK;
  return lutra_error(LUTRA_ESTATE, fn,
                     "%s while capturing a CUDA graph: do it before lutra_graph_begin or after "
                     "lutra_graph_end",
                     what);
}

/* A caller's stream gets its own state on this thread, kept until the thread exits, so that
 * switching back and forth neither reallocates nor invalidates the one-GEMM graphs keyed by
 * the workspace. */
int lutra_cuda_use_stream(void *stream) {
  static const char fn[] = "lutra_cuda_set_stream";
  const lutra_backend *be;
  TRY(lutra_cuda_backend(&be, fn));
  TRY(lutra_cuda_refuse_in_capture(fn, "changing the stream"));
  thread_ctx *c = tctx;
  if (!stream) {
    c->cur = c->list;
    return LUTRA_OK;
  }
  for (stream_state *st = c->list; st; st = st->next)
    if (st->stream == (cudaStream_t)stream) {
      c->cur = st;
      return LUTRA_OK;
    }
  stream_state *st;
  TRY(state_new((cudaStream_t)stream, false, &st, fn));
  st->next = c->list->next;
  c->list->next = st;
  c->cur = st;
  return LUTRA_OK;
}

/* The GEMM workspace of this thread's stream, grown to bytes (stream-ordered: the old one is
 * reused only after the GEMMs queued before). bytes 0 asks for the current size. */
int lutra_cuda_workspace(size_t bytes, void **ptr, size_t *have) {
  static const char fn[] = "lutra_cuda_gemm";
  stream_state *st = cur_state();
  if (st->workspace_bytes < bytes) {
    TRY(lutra_cuda_refuse_in_capture(fn, "growing the GEMM workspace (a GEMM of a new shape)"));
    void *p;
    if (cudaMallocAsync(&p, bytes, st->stream) != cudaSuccess) {
      (void)cudaGetLastError();
      return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a %zu-byte GEMM workspace", bytes);
    }
    if (st->workspace) cudaFreeAsync(st->workspace, st->stream);
    st->workspace = p;
    st->workspace_bytes = bytes;
  }
  *ptr = st->workspace;
  *have = st->workspace_bytes;
  return LUTRA_OK;
}

bool lutra_cuda_stream_private(void) {
  return cur_state()->own;
}

lutra_call_graphs **lutra_cuda_launch_graphs(int launcher, void (*release)(lutra_call_graphs *)) {
  /* the caches' maker says how to release them: the context sits below it and calls no cache
   * function itself (one store into this thread's state) */
  stream_state *st = cur_state();
  st->release_launches = release;
  return &st->launches[launcher];
}

const lk_scratch *lutra_cuda_reduce_scratch(void) {
  return &cur_state()->reduce;
}

/* Scratch of a fused quantize + bias gradient (stream_state): the partial column sums, and the
 * per-strip tile counts the kernel leaves at zero; and of a fused norm + FP8 cast. Each grows to
 * the largest shape seen on the stream (stream-ordered, so an old buffer is reused only after the
 * kernels queued before it), so a steady loop does not allocate; new counts are zeroed once. */
static int grow_scratch(void **ptr, int64_t *have, int64_t need, size_t elem, bool zero) {
  static const char fn[] = "lutra_cuda_scratch";
  if (need <= *have) return LUTRA_OK;
  TRY(lutra_cuda_refuse_in_capture(fn, "growing a kernel's scratch (a new shape)"));
  void *p;
  TRY(lutra_cuda_status(cudaMallocAsync(&p, (size_t)need * elem, lutra_cuda_stream()), fn,
                        "cudaMallocAsync"));
  if (zero) {
    cudaError_t e = cudaMemsetAsync(p, 0, (size_t)need * elem, lutra_cuda_stream());
    if (e != cudaSuccess) {
      cudaFreeAsync(p, lutra_cuda_stream());
      return lutra_cuda_status(e, fn, "cudaMemsetAsync");
    }
  }
  if (*ptr) cudaFreeAsync(*ptr, lutra_cuda_stream());
  *ptr = p;
  *have = need;
  return LUTRA_OK;
}

int lutra_cuda_dbias_scratch(int64_t rows, int64_t cols, lutra_quant_args *q) {
  stream_state *st = cur_state();
  TRY(grow_scratch((void **)&st->dbias, &st->dbias_floats, lutra_dbias_scratch_floats(rows, cols),
                   sizeof(float), false));
  q->dbias_scratch = st->dbias;
  return LUTRA_OK;
}

int lutra_cuda_norm_stats_scratch(int64_t rows, float **mean, float **rstd) {
  stream_state *st = cur_state();
  *mean = *rstd = NULL;
  if (2 * rows > st->norm_stat_floats && LUTRA_CAPTURING()) return LUTRA_OK;
  TRY(grow_scratch((void **)&st->norm_stats, &st->norm_stat_floats, 2 * rows, sizeof(float),
                   false));
  *mean = st->norm_stats;
  *rstd = st->norm_stats + rows;
  return LUTRA_OK;
}
