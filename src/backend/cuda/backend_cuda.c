/* The CUDA backend: memory from the stream-ordered pool, copies, and the table that routes
 * every backend call to its kernel launcher (kernels/) or to cuBLASLt (gemm_cuda.c).
 *
 * One device (the current one at first use), one stream per process by default (a user
 * stream can be set), one cuBLASLt handle. Allocation is cudaMallocAsync on that stream with
 * the pool's release threshold raised, so freed memory is reused and a steady training loop
 * makes no driver allocations. */
#include "cuda_backend.h"

#include "kernels.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static struct {
  pthread_once_t once;
  int status; /* of the one-time initialization */
  char message[256];
  int device;
  cudaStream_t own_stream;
  cudaStream_t stream;
  cublasLtHandle_t lt;
} cuda = {.once = PTHREAD_ONCE_INIT};

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

cudaStream_t lutra_cuda_stream(void) {
  return cuda.stream;
}
cublasLtHandle_t lutra_cuda_lt(void) {
  return cuda.lt;
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
  if (e == cudaSuccess) {
    step = "cudaStreamCreateWithFlags";
    e = cudaStreamCreateWithFlags(&cuda.own_stream, cudaStreamNonBlocking);
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
  cublasStatus_t s = cublasLtCreate(&cuda.lt);
  if (s != CUBLAS_STATUS_SUCCESS) {
    snprintf(cuda.message, sizeof cuda.message, "cublasLtCreate failed: %s",
             cublasLtGetStatusString(s));
    cuda.status = LUTRA_EBACKEND;
    return;
  }
  cuda.stream = cuda.own_stream;
  cuda.status = LUTRA_OK;
}

extern const lutra_backend lutra_cuda_table;

int lutra_cuda_backend(const lutra_backend **out, const char *fn) {
  pthread_once(&cuda.once, init_once);
  if (cuda.status != LUTRA_OK)
    return lutra_error(cuda.status, fn, "device 'cuda': %s", cuda.message);
  *out = &lutra_cuda_table;
  return LUTRA_OK;
}

int lutra_cuda_use_stream(void *stream) {
  static const char fn[] = "lutra_cuda_set_stream";
  const lutra_backend *be;
  TRY(lutra_cuda_backend(&be, fn));
  cuda.stream = stream ? (cudaStream_t)stream : cuda.own_stream;
  return LUTRA_OK;
}

/* ---- memory ---------------------------------------------------------------------------- */

/* Calls a CUDA graph cannot contain: refused while this thread captures one. */
static int refuse_in_capture(const char *fn, const char *what) {
  if (!lutra_capture_active) return LUTRA_OK;
  return lutra_error(LUTRA_ESTATE, fn,
                     "%s while capturing a CUDA graph: do it before lutra_graph_begin or after "
                     "lutra_graph_end",
                     what);
}

static int cuda_alloc(size_t bytes, void **out) {
  TRY(refuse_in_capture("lutra_cuda_alloc", "a device allocation"));
  return lutra_cuda_status(cudaMallocAsync(out, bytes ? bytes : 256, cuda.stream),
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
  cudaFreeAsync(p, cuda.stream);
}

void lutra_cuda_free_deferred(void) {
  for (size_t i = 0; i < deferred.count; i++)
    cudaFreeAsync(deferred.ptrs[i], cuda.stream);
  deferred.count = 0;
}

static int cuda_sync(void) {
  TRY(refuse_in_capture("lutra_device_synchronize", "a synchronization"));
  return lutra_cuda_status(cudaStreamSynchronize(cuda.stream), "lutra_device_synchronize",
                           "cudaStreamSynchronize");
}

/* Host transfers synchronize: the host buffer may be reused as soon as the call returns. */
static int cuda_from_host(void *dst, const void *src, size_t bytes) {
  TRY(refuse_in_capture("lutra_cuda_from_host", "a host-to-device copy (it waits for the copy)"));
  TRY(lutra_cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda.stream),
                        "lutra_cuda_from_host", "cudaMemcpyAsync"));
  return cuda_sync();
}

static int cuda_to_host(void *dst, const void *src, size_t bytes) {
  TRY(refuse_in_capture("lutra_cuda_to_host",
                        "reading device memory on the host (e.g. a loss value)"));
  TRY(lutra_cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda.stream),
                        "lutra_cuda_to_host", "cudaMemcpyAsync"));
  return cuda_sync();
}

static int cuda_copy(void *dst, const void *src, size_t bytes) {
  return lutra_cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda.stream),
                           "lutra_cuda_copy", "cudaMemcpyAsync");
}

static int cuda_memset(void *dst, int value, size_t bytes) {
  return lutra_cuda_status(cudaMemsetAsync(dst, value, bytes, cuda.stream), "lutra_cuda_memset",
                           "cudaMemsetAsync");
}

/* ---- kernels: each wrapper turns the launch status into a lutra status ------------------ */

#define LAUNCH(name, call) lutra_cuda_status((call), "lutra_cuda_" #name, "kernel " #name)

static int k_convert(const void *src, int sd, void *dst, int dd, int64_t n) {
  return LAUNCH(convert, lk_convert(src, sd, dst, dd, n, cuda.stream));
}
static int k_fill(void *dst, int dtype, int64_t n, float v) {
  return LAUNCH(fill, lk_fill(dst, dtype, n, v, cuda.stream));
}
static int k_amax(const void *x, int dtype, int64_t n, float *amax) {
  return LAUNCH(amax, lk_amax(x, dtype, n, amax, cuda.stream));
}
static int k_current_scale(const void *x, int dtype, int64_t n, float fp8_max, int pow2, float eps,
                           float *amax, float *scale, uint32_t *work, const int32_t *skip) {
  return LAUNCH(current_scale, lk_current_scale(x, dtype, n, fp8_max, pow2, eps, amax, scale, work,
                                                skip, cuda.stream));
}
/* Scratch of a fused quantize + bias gradient: the partial column sums, and the per-strip tile
 * counts the kernel leaves at zero. Each grows to the largest shape seen (stream-ordered, so an
 * old buffer is reused only after the kernels queued before it), so a steady loop does not
 * allocate; new counts are zeroed once. One stream at a time, as the other scratch buffers. */
static struct {
  float *ptr;
  int64_t floats;
  uint32_t *count;
  int64_t counters;
} dbias_scratch;

static int grow_scratch(void **ptr, int64_t *have, int64_t need, size_t elem, bool zero) {
  static const char fn[] = "lutra_cuda_quantize_dbias";
  if (need <= *have) return LUTRA_OK;
  TRY(refuse_in_capture(fn, "growing the bias-gradient scratch"));
  void *p;
  TRY(lutra_cuda_status(cudaMallocAsync(&p, (size_t)need * elem, cuda.stream), fn,
                        "cudaMallocAsync"));
  if (zero) {
    cudaError_t e = cudaMemsetAsync(p, 0, (size_t)need * elem, cuda.stream);
    if (e != cudaSuccess) {
      cudaFreeAsync(p, cuda.stream);
      return lutra_cuda_status(e, fn, "cudaMemsetAsync");
    }
  }
  if (*ptr) cudaFreeAsync(*ptr, cuda.stream);
  *ptr = p;
  *have = need;
  return LUTRA_OK;
}

static int dbias_scratch_for(int64_t rows, int64_t cols, lutra_quant_args *q) {
  TRY(grow_scratch((void **)&dbias_scratch.ptr, &dbias_scratch.floats,
                   lutra_dbias_scratch_floats(rows, cols), sizeof(float), false));
  TRY(grow_scratch((void **)&dbias_scratch.count, &dbias_scratch.counters,
                   lutra_dbias_counters(cols), sizeof(uint32_t), true));
  q->dbias_scratch = dbias_scratch.ptr;
  q->dbias_count = dbias_scratch.count;
  return LUTRA_OK;
}

typedef cudaError_t (*quantize_launcher)(const lutra_quant_args *, cudaStream_t);

/* A quantization with its bias gradient: fused into the tiled kernel when it writes a
 * columnwise output (the kernel reads every column there anyway), else a bias-gradient kernel
 * after the quantization. */
static int quantize_with_dbias(quantize_launcher launch, bool can_fuse, const lutra_quant_args *a,
                               const char *name) {
  if (!a->dbias) return lutra_cuda_status(launch(a, cuda.stream), name, "kernel");
  lutra_quant_args q = *a;
  if (can_fuse && a->col_data && a->rows > 0 && a->cols > 0) {
    TRY(dbias_scratch_for(a->rows, a->cols, &q));
    return lutra_cuda_status(launch(&q, cuda.stream), name, "kernel with dbias");
  }
  q.dbias = NULL;
  TRY(lutra_cuda_status(launch(&q, cuda.stream), name, "kernel"));
  const lutra_bias_grad_args b = {.dy = a->x,
                                  .dtype = a->x_dtype,
                                  .rows = a->rows,
                                  .cols = a->cols,
                                  .db = a->dbias,
                                  .db_dtype = a->dbias_dtype,
                                  .accumulate = a->dbias_accumulate,
                                  .skip = a->skip};
  return LAUNCH(bias_grad, lk_bias_grad(&b, cuda.stream));
}

static int k_cast(const lutra_quant_args *a) {
  return quantize_with_dbias(lk_cast, true, a, "lutra_cuda_cast");
}
static int k_mxfp8(const lutra_quant_args *a) {
  return quantize_with_dbias(lk_quantize_mxfp8, true, a, "lutra_cuda_quantize_mxfp8");
}
static int k_block(const lutra_quant_args *a) {
  return quantize_with_dbias(lk_quantize_block, false, a, "lutra_cuda_quantize_block");
}
static int k_dequantize(const lutra_dequant_args *a) {
  return LAUNCH(dequantize, lk_dequantize(a, cuda.stream));
}
static int k_delayed_update(lutra_scale_meta *const *metas, int n) {
  return LAUNCH(delayed_update, lk_delayed_update(metas, n, cuda.stream));
}
/* The kernels answer an unknown kind with cudaErrorInvalidValue only; the message is given
 * here, where it can say which kind. */
static int check_act(const lutra_act_args *a, const char *fn) {
  CHECK_ARG(a != NULL, "arguments are NULL");
  if (a->act != LUTRA_ACT_GELU_TANH)
    return lutra_error(LUTRA_EUNSUPPORTED, fn,
                       "activation kind %d is not implemented (only LUTRA_ACT_GELU_TANH is)",
                       (int)a->act);
  return LUTRA_OK;
}
static int k_activation_forward(const lutra_act_args *a) {
  TRY(check_act(a, "lutra_cuda_activation_forward"));
  return LAUNCH(activation_forward, lk_activation_forward(a, cuda.stream));
}
static int k_activation_backward(const lutra_act_args *a) {
  TRY(check_act(a, "lutra_cuda_activation_backward"));
  return LAUNCH(activation_backward, lk_activation_backward(a, cuda.stream));
}
static int k_bias_grad(const lutra_bias_grad_args *a) {
  return LAUNCH(bias_grad, lk_bias_grad(a, cuda.stream));
}
static int k_mse(const lutra_loss_args *a) {
  return LAUNCH(mse, lk_mse(a, cuda.stream));
}
static int k_xent(const lutra_loss_args *a) {
  return LAUNCH(softmax_xent, lk_softmax_xent(a, cuda.stream));
}
static int k_sgd(const lutra_optim_args *a) {
  return LAUNCH(sgd_step, lk_sgd_step(a, cuda.stream));
}
static int k_adamw(const lutra_optim_args *a) {
  return LAUNCH(adamw_step, lk_adamw_step(a, cuda.stream));
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
    .cast = k_cast,
    .quantize_mxfp8 = k_mxfp8,
    .quantize_block = k_block,
    .dequantize = k_dequantize,
    .delayed_update = k_delayed_update,
    .gemm_plan = lutra_cuda_gemm_plan,
    .gemm_plan_free = lutra_cuda_gemm_plan_free,
    .gemm = lutra_cuda_gemm,
    .activation_forward = k_activation_forward,
    .activation_backward = k_activation_backward,
    .bias_grad = k_bias_grad,
    .mse = k_mse,
    .softmax_xent = k_xent,
    .sgd_step = k_sgd,
    .adamw_step = k_adamw,
    .synchronize = cuda_sync,
    .capture_begin = lutra_cuda_capture_begin,
    .capture_end = lutra_cuda_capture_end,
    .capture_abort = lutra_cuda_capture_abort,
    .graph_launch = lutra_cuda_graph_launch,
    .graph_destroy = lutra_cuda_graph_destroy,
};
