/* The CUDA backend: memory from the stream-ordered pool, copies, and the table that routes
 * every backend call to its kernel launcher (kernels/) or to cuBLASLt (gemm_cuda.c).
 *
 * One device (the current one at first use). Every thread has its own stream, created at its
 * first call, and its own cuBLASLt handle: two threads training their own models must not
 * order each other's work, nor see each other's one-GEMM captures (gemm_graphs.c captures the
 * thread's stream). lutra_cuda_set_stream replaces the calling thread's stream only.
 * Allocation is cudaMallocAsync on the thread's stream with the pool's release threshold
 * raised, so freed memory is reused and a steady training loop makes no driver allocations.
 *
 * Scratch that kernels fill and read later in stream order (the GEMM workspace with its
 * dequantized operands, the bias-gradient and loss partials, the fused dbias sums) is kept
 * per thread and stream (stream_state): shared between two streams, two threads' kernels run
 * at once on the same bytes. A thread's states, its stream and its handle are released by a
 * pthread key destructor when the thread exits. */
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
  lk_scratch reduce;    /* bias-gradient and loss partials (kernels.h) */
  void *reduce_block;   /* the one allocation behind reduce */
  float *dbias;         /* fused quantize + bias gradient: column partial sums */
  int64_t dbias_floats; /* ... and the per-strip tile counts the kernel leaves at zero */
  uint32_t *dbias_count;
  int64_t dbias_counters;
} stream_state;

typedef struct thread_ctx {
  stream_state *cur;  /* the stream this thread's calls go to */
  stream_state *list; /* the own stream's state first, then callers' streams seen */
  cublasLtHandle_t lt;
} thread_ctx;

static _Thread_local thread_ctx *tctx;
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
  void *ptrs[] = {st->workspace, st->reduce_block, st->dbias, st->dbias_count};
  for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++)
    if (ptrs[i]) cudaFreeAsync(ptrs[i], on);
  free(st);
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
  if (c->lt) cublasLtDestroy(c->lt);
  lutra_cuda_deferred_release();
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
  cublasStatus_t ls = cublasLtCreate(&c->lt);
  int st = ls == CUBLAS_STATUS_SUCCESS ? state_new(s, true, &c->list, fn)
                                       : lutra_cublas_status(ls, fn, "cublasLtCreate");
  if (st == LUTRA_OK && pthread_setspecific(cuda.exit_key, c) != 0) {
    state_release(c->list, s);
    st = lutra_error(LUTRA_EBACKEND, fn, "pthread_setspecific failed");
  }
  if (st != LUTRA_OK) {
    if (c->lt) cublasLtDestroy(c->lt);
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

extern const lutra_backend lutra_cuda_table;

int lutra_cuda_backend(const lutra_backend **out, const char *fn) {
  pthread_once(&cuda.once, init_once);
  if (cuda.status != LUTRA_OK)
    return lutra_error(cuda.status, fn, "device 'cuda': %s", cuda.message);
  if (!tctx) TRY(make_ctx(fn));
  *out = &lutra_cuda_table;
  return LUTRA_OK;
}

/* Calls a CUDA graph cannot contain: refused while this thread captures one. */
static int refuse_in_capture(const char *fn, const char *what) {
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
  TRY(refuse_in_capture(fn, "changing the stream"));
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
    TRY(refuse_in_capture(fn, "growing the GEMM workspace (a GEMM of a new shape)"));
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

const lk_scratch *lutra_cuda_reduce_scratch(void) {
  return &cur_state()->reduce;
}

/* ---- memory ---------------------------------------------------------------------------- */

static int cuda_alloc(size_t bytes, void **out) {
  TRY(refuse_in_capture("lutra_cuda_alloc", "a device allocation"));
  return lutra_cuda_status(cudaMallocAsync(out, bytes ? bytes : 256, lutra_cuda_stream()),
                           "lutra_cuda_alloc", "cudaMallocAsync");
}

/* Frees that arrive while this thread captures a graph (a :free(), or the garbage collector
 * finalizing a tensor from before the capture) must not become free nodes of the graph, which
 * would free the buffer again at every replay: they wait until the capture ends. */
static _Thread_local struct {
  void **ptrs;
  size_t count, cap;
} deferred;

static void cuda_free(void *p) {
  if (!p) return;
  if (lutra_capture_active) {
    if (deferred.count == deferred.cap) {
      size_t cap = deferred.cap ? 2 * deferred.cap : 64;
      void **grown = realloc(deferred.ptrs, cap * sizeof *grown);
      if (!grown) return; /* cannot defer: leaking is safe, freeing into the graph is not */
      deferred.ptrs = grown;
      deferred.cap = cap;
    }
    deferred.ptrs[deferred.count++] = p;
    return;
  }
  cudaFreeAsync(p, lutra_cuda_stream());
}

void lutra_cuda_free_deferred(void) {
  for (size_t i = 0; i < deferred.count; i++)
    cudaFreeAsync(deferred.ptrs[i], lutra_cuda_stream());
  deferred.count = 0;
}

void lutra_cuda_deferred_release(void) {
  free(deferred.ptrs);
  deferred.ptrs = NULL;
  deferred.count = deferred.cap = 0;
}

static int cuda_sync(void) {
  TRY(refuse_in_capture("lutra_device_synchronize", "a synchronization"));
  return lutra_cuda_status(cudaStreamSynchronize(lutra_cuda_stream()), "lutra_device_synchronize",
                           "cudaStreamSynchronize");
}

/* Host transfers synchronize: the host buffer may be reused as soon as the call returns. */
static int cuda_from_host(void *dst, const void *src, size_t bytes) {
  TRY(refuse_in_capture("lutra_cuda_from_host", "a host-to-device copy (it waits for the copy)"));
  TRY(lutra_cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, lutra_cuda_stream()),
                        "lutra_cuda_from_host", "cudaMemcpyAsync"));
  return cuda_sync();
}

static int cuda_to_host(void *dst, const void *src, size_t bytes) {
  TRY(refuse_in_capture("lutra_cuda_to_host",
                        "reading device memory on the host (e.g. a loss value)"));
  TRY(lutra_cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, lutra_cuda_stream()),
                        "lutra_cuda_to_host", "cudaMemcpyAsync"));
  return cuda_sync();
}

static int cuda_copy(void *dst, const void *src, size_t bytes) {
  return lutra_cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, lutra_cuda_stream()),
                           "lutra_cuda_copy", "cudaMemcpyAsync");
}

static int cuda_memset(void *dst, int value, size_t bytes) {
  return lutra_cuda_status(cudaMemsetAsync(dst, value, bytes, lutra_cuda_stream()), "lutra_cuda_memset",
                           "cudaMemsetAsync");
}

/* ---- kernels: each wrapper turns the launch status into a lutra status ------------------ */

#define LAUNCH(name, call) lutra_cuda_status((call), "lutra_cuda_" #name, "kernel " #name)

static int k_convert(const void *src, int sd, void *dst, int dd, int64_t n) {
  return LAUNCH(convert, lk_convert(src, sd, dst, dd, n, lutra_cuda_stream()));
}
static int k_fill(void *dst, int dtype, int64_t n, float v) {
  return LAUNCH(fill, lk_fill(dst, dtype, n, v, lutra_cuda_stream()));
}
static int k_amax(const void *x, int dtype, int64_t n, float *amax) {
  return LAUNCH(amax, lk_amax(x, dtype, n, amax, lutra_cuda_stream()));
}
static int k_current_scale(const void *x, int dtype, int64_t n, float fp8_max, int pow2, float eps,
                           float *amax, float *scale, uint32_t *work, const int32_t *skip) {
  return LAUNCH(current_scale, lk_current_scale(x, dtype, n, fp8_max, pow2, eps, amax, scale, work,
                                                skip, lutra_cuda_stream()));
}
/* Scratch of a fused quantize + bias gradient (stream_state): the partial column sums, and the
 * per-strip tile counts the kernel leaves at zero. Each grows to the largest shape seen on the
 * stream (stream-ordered, so an old buffer is reused only after the kernels queued before it),
 * so a steady loop does not allocate; new counts are zeroed once. */
static int grow_scratch(void **ptr, int64_t *have, int64_t need, size_t elem, bool zero) {
  static const char fn[] = "lutra_cuda_quantize_dbias";
  if (need <= *have) return LUTRA_OK;
  TRY(refuse_in_capture(fn, "growing the bias-gradient scratch"));
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

static int dbias_scratch_for(int64_t rows, int64_t cols, lutra_quant_args *q) {
  stream_state *st = cur_state();
  TRY(grow_scratch((void **)&st->dbias, &st->dbias_floats, lutra_dbias_scratch_floats(rows, cols),
                   sizeof(float), false));
  TRY(grow_scratch((void **)&st->dbias_count, &st->dbias_counters, lutra_dbias_counters(cols),
                   sizeof(uint32_t), true));
  q->dbias_scratch = st->dbias;
  q->dbias_count = st->dbias_count;
  return LUTRA_OK;
}

typedef cudaError_t (*quantize_launcher)(const lutra_quant_args *, cudaStream_t);

/* A quantization with its bias gradient: fused into the tiled kernel when it writes a
 * columnwise output (the kernel reads every column there anyway), else a bias-gradient kernel
 * after the quantization. */
static int quantize_with_dbias(quantize_launcher launch, bool can_fuse, const lutra_quant_args *a,
                               const char *name) {
  if (!a->dbias) return lutra_cuda_status(launch(a, lutra_cuda_stream()), name, "kernel");
  lutra_quant_args q = *a;
  if (can_fuse && a->col_data && a->rows > 0 && a->cols > 0) {
    TRY(dbias_scratch_for(a->rows, a->cols, &q));
    return lutra_cuda_status(launch(&q, lutra_cuda_stream()), name, "kernel with dbias");
  }
  q.dbias = NULL;
  TRY(lutra_cuda_status(launch(&q, lutra_cuda_stream()), name, "kernel"));
  const lutra_bias_grad_args b = {.dy = a->x,
                                  .dtype = a->x_dtype,
                                  .rows = a->rows,
                                  .cols = a->cols,
                                  .db = a->dbias,
                                  .db_dtype = a->dbias_dtype,
                                  .accumulate = a->dbias_accumulate,
                                  .skip = a->skip};
  return LAUNCH(bias_grad, lk_bias_grad(&b, lutra_cuda_reduce_scratch(), lutra_cuda_stream()));
}

/* an activation inside the cast (lutra_quant_args.act) is the per-tensor casts' (the block
 * kernels read no activation); its bias gradient comes from the tiled kernel's columnwise pass */
static int check_cast_act(const lutra_quant_args *a, bool per_tensor, const char *fn) {
  if (!a || !a->act) return LUTRA_OK;
  if (!per_tensor)
    return lutra_error(LUTRA_EUNSUPPORTED, fn,
                       "an activation inside the cast is for per-tensor scaling only");
  if (a->dbias && !a->col_data)
    return lutra_error(LUTRA_EUNSUPPORTED, fn,
                       "an activation's bias gradient inside the cast needs a columnwise output");
  return LUTRA_OK;
}
static int k_current_scale_act(const lutra_quant_args *a, float fp8_max, float *amax, float *scale,
                               uint32_t *work) {
  return LAUNCH(current_scale_act,
                lk_current_scale_act(a, fp8_max, amax, scale, work, lutra_cuda_stream()));
}
static int k_cast(const lutra_quant_args *a) {
  TRY(check_cast_act(a, true, "lutra_cuda_cast"));
  return quantize_with_dbias(lk_cast, true, a, "lutra_cuda_cast");
}
static int k_mxfp8(const lutra_quant_args *a) {
  TRY(check_cast_act(a, false, "lutra_cuda_quantize_mxfp8"));
  return quantize_with_dbias(lk_quantize_mxfp8, true, a, "lutra_cuda_quantize_mxfp8");
}
static int k_block(const lutra_quant_args *a) {
  TRY(check_cast_act(a, false, "lutra_cuda_quantize_block"));
  return quantize_with_dbias(lk_quantize_block, false, a, "lutra_cuda_quantize_block");
}
static int k_dequantize(const lutra_dequant_args *a) {
  return LAUNCH(dequantize, lk_dequantize(a, lutra_cuda_stream()));
}
static int k_delayed_update(lutra_scale_meta *const *metas, int n) {
  return LAUNCH(delayed_update, lk_delayed_update(metas, n, lutra_cuda_stream()));
}
/* The kernels answer an unknown kind with cudaErrorInvalidValue only; the message is given
 * here, where it can say which kind. */
static int check_act(const lutra_act_args *a, const char *fn) {
  CHECK_ARG(a != NULL, "arguments are NULL");
  if (a->act <= LUTRA_ACT_NONE || a->act >= LUTRA_ACT_COUNT)
    return lutra_error(LUTRA_EINVAL, fn, "unknown activation kind %d (expected 1..%d)",
                       (int)a->act, LUTRA_ACT_COUNT - 1);
  if (lutra_act_is_gated(a->act))
    CHECK_ARG(a->rows >= 0 && a->cols >= 0 && a->cols % 2 == 0,
              "gated activation input [%lld, %lld]: the last dim must be even (2h)",
              (long long)a->rows, (long long)a->cols);
  return LUTRA_OK;
}
static int k_activation_forward(const lutra_act_args *a) {
  TRY(check_act(a, "lutra_cuda_activation_forward"));
  return LAUNCH(activation_forward, lk_activation_forward(a, lutra_cuda_stream()));
}
static int k_activation_backward(const lutra_act_args *a) {
  TRY(check_act(a, "lutra_cuda_activation_backward"));
  return LAUNCH(activation_backward, lk_activation_backward(a, lutra_cuda_stream()));
}
static int k_bias_grad(const lutra_bias_grad_args *a) {
  return LAUNCH(bias_grad, lk_bias_grad(a, lutra_cuda_reduce_scratch(), lutra_cuda_stream()));
}
static int k_mse(const lutra_loss_args *a) {
  return LAUNCH(mse, lk_mse(a, lutra_cuda_reduce_scratch(), lutra_cuda_stream()));
}
static int k_xent(const lutra_loss_args *a) {
  return LAUNCH(softmax_xent, lk_softmax_xent(a, lutra_cuda_reduce_scratch(), lutra_cuda_stream()));
}
static int k_sgd(const lutra_optim_args *a) {
  return LAUNCH(sgd_step, lk_sgd_step(a, lutra_cuda_stream()));
}
static int k_adamw(const lutra_optim_args *a) {
  return LAUNCH(adamw_step, lk_adamw_step(a, lutra_cuda_stream()));
}

/* norms: the kernels' limits are refused here with a message (kernels.h) */
static int check_norm(const lutra_norm_args *a, const char *fn) {
  CHECK_ARG(a != NULL, "arguments are NULL");
  CHECK_ARG(a->hidden > 0 && 2 * a->hidden <= LK_BIAS_PARTIALS,
            "hidden %lld is outside the kernels' range 1..%d", (long long)a->hidden,
            LK_BIAS_PARTIALS / 2);
  CHECK_ARG(a->rows >= 0 && a->rows <= 0x7FFFFFFF, "%lld rows (one block per row: at most 2^31-1)",
            (long long)a->rows);
  return LUTRA_OK;
}
static int k_layernorm_forward(const lutra_norm_args *a) {
  TRY(check_norm(a, "lutra_cuda_layernorm_forward"));
  return LAUNCH(layernorm_forward, lk_layernorm_forward(a, lutra_cuda_stream()));
}
static int k_layernorm_backward(const lutra_norm_args *a) {
  TRY(check_norm(a, "lutra_cuda_layernorm_backward"));
  return LAUNCH(layernorm_backward,
                lk_layernorm_backward(a, lutra_cuda_reduce_scratch(), lutra_cuda_stream()));
}

static int k_norm_quantize(const lutra_norm_quant_args *a) {
  static const char fn[] = "lutra_cuda_norm_quantize";
  CHECK_ARG(a != NULL, "arguments are NULL");
  TRY(check_norm(&a->norm, fn));
  CHECK_ARG(a->scaling == LUTRA_SCALING_TENSOR || a->scaling == LUTRA_SCALING_MXFP8 ||
                a->scaling == LUTRA_SCALING_BLOCK_1D,
            "scaling %d is not tensor, mxfp8 or block_1d", (int)a->scaling);
  CHECK_ARG(a->quant.out_dtype == LUTRA_E4M3 || a->quant.out_dtype == LUTRA_E5M2,
            "output dtype %d is not e4m3 or e5m2", (int)a->quant.out_dtype);
  return LAUNCH(norm_quantize, lk_norm_quantize(a, lutra_cuda_stream()));
}

static int k_add(const void *a, const void *b, void *out, int dtype, int64_t n) {
  return LAUNCH(add, lk_add(a, b, out, dtype, n, lutra_cuda_stream()));
}

/* MoE routing: the kernels' limits are refused here with a message (kernels.h) */
static int check_topk(const lutra_topk_args *a, const char *fn) {
  CHECK_ARG(a != NULL, "arguments are NULL");
  CHECK_ARG(lutra_dtype_is_float(a->dtype), "logits dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(a->dtype));
  CHECK_ARG(a->tokens > 0 && a->experts > 0 && a->experts <= LUTRA_MOE_MAX_EXPERTS,
            "logits [%lld, %lld]: tokens must be positive, experts in 1..%d", (long long)a->tokens,
            (long long)a->experts, LUTRA_MOE_MAX_EXPERTS);
  CHECK_ARG(a->k >= 1 && a->k <= LUTRA_MOE_MAX_K && a->k <= a->experts,
            "k = %d is outside 1..min(%d, experts)", (int)a->k, LUTRA_MOE_MAX_K);
  return LUTRA_OK;
}
static int check_permute(const lutra_permute_args *a, const char *fn) {
  CHECK_ARG(a != NULL, "arguments are NULL");
  CHECK_ARG(lutra_dtype_is_float(a->dtype), "rows dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(a->dtype));
  CHECK_ARG(a->tokens > 0 && a->k > 0 && a->hidden > 0 && a->tokens * a->k <= 0x7FFFFFFF,
            "tokens %lld, k %d, hidden %lld: all positive, tokens * k at most 2^31-1",
            (long long)a->tokens, (int)a->k, (long long)a->hidden);
  CHECK_ARG(a->experts >= 1 && a->experts <= LUTRA_MOE_MAX_EXPERTS,
            "experts = %d is outside 1..%d", (int)a->experts, LUTRA_MOE_MAX_EXPERTS);
  return LUTRA_OK;
}
static int k_moe_topk_forward(const lutra_topk_args *a) {
  TRY(check_topk(a, "lutra_cuda_moe_topk_forward"));
  return LAUNCH(moe_topk_forward, lk_moe_topk_forward(a, lutra_cuda_stream()));
}
static int k_moe_topk_backward(const lutra_topk_args *a) {
  TRY(check_topk(a, "lutra_cuda_moe_topk_backward"));
  return LAUNCH(moe_topk_backward, lk_moe_topk_backward(a, lutra_cuda_stream()));
}
static int k_moe_permute(const lutra_permute_args *a) {
  static const char fn[] = "lutra_cuda_moe_permute";
  TRY(check_permute(a, fn));
  CHECK_ARG(a->bad_index && a->scratch && a->m_splits && a->indices,
            "indices, m_splits, scratch and the bad-index flag must not be NULL");
  return LAUNCH(moe_permute, lk_moe_permute(a, lutra_cuda_stream()));
}
static int k_moe_permute_backward(const lutra_permute_args *a) {
  TRY(check_permute(a, "lutra_cuda_moe_permute_backward"));
  return LAUNCH(moe_permute_backward, lk_moe_permute_backward(a, lutra_cuda_stream()));
}
static int k_moe_unpermute(const lutra_permute_args *a) {
  TRY(check_permute(a, "lutra_cuda_moe_unpermute"));
  return LAUNCH(moe_unpermute, lk_moe_unpermute(a, lutra_cuda_stream()));
}
static int k_moe_unpermute_backward(const lutra_permute_args *a) {
  TRY(check_permute(a, "lutra_cuda_moe_unpermute_backward"));
  return LAUNCH(moe_unpermute_backward, lk_moe_unpermute_backward(a, lutra_cuda_stream()));
}

const lutra_backend lutra_cuda_table = {
    .name = "cuda",
    .device = LUTRA_CUDA,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .from_host = cuda_from_host,
    .to_host = cuda_to_host,
    .copy = cuda_copy,
    .memset = cuda_memset,
    .convert = k_convert,
    .fill = k_fill,
    .amax = k_amax,
    .current_scale = k_current_scale,
    .current_scale_act = k_current_scale_act,
    .cast = k_cast,
    .quantize_mxfp8 = k_mxfp8,
    .quantize_block = k_block,
    .dequantize = k_dequantize,
    .delayed_update = k_delayed_update,
    .gemm_plan = lutra_cuda_gemm_plan,
    .gemm_plan_free = lutra_cuda_gemm_plan_free,
    .gemm = lutra_cuda_gemm,
    .gemm_workspace = lutra_cuda_workspace,
    .activation_forward = k_activation_forward,
    .activation_backward = k_activation_backward,
    .bias_grad = k_bias_grad,
    .mse = k_mse,
    .softmax_xent = k_xent,
    .sgd_step = k_sgd,
    .adamw_step = k_adamw,
    .layernorm_forward = k_layernorm_forward,
    .layernorm_backward = k_layernorm_backward,
    .moe_topk_forward = k_moe_topk_forward,
    .moe_topk_backward = k_moe_topk_backward,
    .moe_permute = k_moe_permute,
    .moe_permute_backward = k_moe_permute_backward,
    .moe_unpermute = k_moe_unpermute,
    .moe_unpermute_backward = k_moe_unpermute_backward,
    .synchronize = cuda_sync,
    .capture_begin = lutra_cuda_capture_begin,
    .capture_end = lutra_cuda_capture_end,
    .capture_abort = lutra_cuda_capture_abort,
    .graph_launch = lutra_cuda_graph_launch,
    .graph_destroy = lutra_cuda_graph_destroy,
    .norm_quantize = k_norm_quantize,
    .add = k_add,
    .grouped_quantize = lutra_cuda_grouped_quantize,
    .grouped_gemm = lutra_cuda_grouped_gemm,
    .from_host_async = lutra_cuda_from_host_async,
    .rules_gather = lutra_cuda_rules_gather,
    .rules_apply = lutra_cuda_rules_apply,
};
