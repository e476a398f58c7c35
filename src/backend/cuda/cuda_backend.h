/* The CUDA backend's host side (built only with LUTRA_WITH_CUDA). */
#ifndef LUTRA_CUDA_BACKEND_H
#define LUTRA_CUDA_BACKEND_H

#include "backend/backend.h"
#include "core/capture.h"
#include "core/dtype.h"
#include "core/error.h"

#include <stdbool.h>

#include <cublasLt.h>
#include <cuda_runtime.h>

/* backend_cuda.c: the table */
extern const lutra_backend lutra_cuda_table;

/* context_cuda.c: the table, after the one-time device check; NULL with the error set for fn. */
int lutra_cuda_backend(const lutra_backend **out, const char *fn);
int lutra_cuda_use_stream(void *stream);
/* lutra_device_memory's: the device's stream-ordered pool's use and high-water mark */
int lutra_cuda_memory(int reset_peak, int64_t *in_use, int64_t *peak);

/* The calling thread's stream and cuBLASLt handle (valid once lutra_cuda_backend succeeded on
 * this thread), and the scratch its stream's reducing kernels use (kernels.h's lk_scratch). */
cudaStream_t lutra_cuda_stream(void);
/* Whether the calling thread's stream is its own, the one lutra made: its handle never leaves
 * lutra (lutra_cuda_set_stream takes a caller's stream, no call returns this one), so nobody
 * but lutra can capture it (lutra.graph, which sets lutra_capture_active, and call_graphs.c) */
bool lutra_cuda_stream_private(void);
cublasLtHandle_t lutra_cuda_lt(void);
struct lk_scratch;
const struct lk_scratch *lutra_cuda_reduce_scratch(void);
/* The GEMM workspace of this thread's stream, grown to bytes (the table's gemm_workspace). */
int lutra_cuda_workspace(size_t bytes, void **ptr, size_t *have);
/* The fused quantize + bias gradient's scratch of this thread's stream, grown for a rows x cols
 * input, into q (dbias_scratch). */
int lutra_cuda_dbias_scratch(int64_t rows, int64_t cols, lutra_quant_args *q);
/* Room for the row statistics (mean, rstd) of a rows-row fused norm + FP8 cast that keeps none:
 * its tile path computes them first (kernels/norm_quantize.cu). Grown like the bias-gradient
 * scratch; NULL, NULL while capturing a graph that would need it grown (the call then takes the
 * path that needs none). */
int lutra_cuda_norm_stats_scratch(int64_t rows, float **mean, float **rstd);
/* Threads holding a CUDA context (stream, handle, scratch): for checking thread-exit release. */
int lutra_cuda_live_threads(void);
/* Calls a CUDA graph cannot contain: LUTRA_ESTATE naming what while this thread captures one. */
int lutra_cuda_refuse_in_capture(const char *fn, const char *what);

/* CUDA / cuBLAS status to a lutra status, with the library's message. */
int lutra_cuda_status(cudaError_t e, const char *fn, const char *what);
int lutra_cublas_status(cublasStatus_t s, const char *fn, const char *what);

/* memory_cuda.c: the table's memory entries on this thread's stream */
int lutra_cuda_alloc(size_t bytes, void **out);
void lutra_cuda_free(void *p);
int lutra_cuda_from_host(void *dst, const void *src, size_t bytes);
int lutra_cuda_to_host(void *dst, const void *src, size_t bytes);
int lutra_cuda_copy(void *dst, const void *src, size_t bytes);
int lutra_cuda_memset(void *dst, int value, size_t bytes);
int lutra_cuda_sync(void);
/* context_cuda.c: frees deferred while this thread captures a graph (lutra_cuda_free defers
 * them); graph_cuda.c runs them once the capture has ended. */
void lutra_cuda_defer_free(void *p);
void lutra_cuda_free_deferred(void);

/* graph_cuda.c */
int lutra_cuda_capture_begin(void);
int lutra_cuda_capture_end(void **exec, int64_t *nodes);
void lutra_cuda_capture_abort(void);
int lutra_cuda_graph_launch(void *exec);
void lutra_cuda_graph_destroy(void *exec);

/* embedding_cuda.c: the table's embedding entries */
int lutra_cuda_embedding_forward(const lutra_embedding_args *a);
int lutra_cuda_embedding_backward(const lutra_embedding_args *a);
int lutra_cuda_embedding_scratch(int64_t n, int64_t vocab, size_t *bytes);
/* rope_cuda.c: the table's rope entry */
int lutra_cuda_rope(const lutra_rope_args *a);
/* attention_cudnn.cpp and attention_cudnn_fp8.cpp (built where the build found cudnn.h:
 * LUTRA_WITH_CUDNN): the table's attention entries on cuDNN's fused SDPA, libcudnn.so.9 opened
 * at the first plan */
int lutra_cuda_attention_plan(const lutra_attention_args *a, void **plan, size_t *workspace_bytes,
                              int *deterministic);
void lutra_cuda_attention_plan_free(void *plan);
int lutra_cuda_attention_forward(const lutra_attention_args *a);
int lutra_cuda_attention_backward(const lutra_attention_args *a);
/* grouped_cuda.c: GroupedLinear's grouped quantization and GEMMs */
int lutra_cuda_grouped_quantize(const lutra_grouped_quant_args *a);
int lutra_cuda_grouped_gemm(const lutra_grouped_gemm_args *g);
/* the table's from_host_async (grouped_cuda.c): a pinned staging ring */
int lutra_cuda_from_host_async(void *dst, const void *src, size_t bytes);
/* rules_cuda.c: the table's rules_gather / rules_apply */
int lutra_cuda_rules_gather(lutra_scale_meta *const *metas, int n, float *host);
int lutra_cuda_rules_apply(lutra_scale_meta *const *metas, int n, const float *scales);

/* gemm_cuda.c */
int lutra_cuda_gemm_plan(lutra_gemm_plan *p);
void lutra_cuda_gemm_plan_free(lutra_gemm_plan *p);
int lutra_cuda_gemm(const lutra_gemm_args *g);

/* call_graphs.c: eager calls replayed as CUDA graphs, keyed by the arguments a call bakes into
 * its kernels, memcmp'd: a key type has no padding bytes. cuBLASLt's: */
typedef struct lutra_gemm_call {
  const void *a, *b;
  void *d;
  const void *addend, *bias, *aux, *dbias, *a_scale, *b_scale;
  void *workspace;
  cudaStream_t stream;
  float beta;
  int32_t zero; /* 0: no padding in a key */
} lutra_gemm_call;
typedef struct lutra_call_graphs lutra_call_graphs;
/* What a cache serves (its capacity and its statistics): GEMMs (a plan's cuBLASLt calls, a
 * GroupedLinear's grouped GEMMs), or a kernel launcher's calls (one cache per launcher and
 * stream, backend_cuda.c) */
enum { LUTRA_CALLS_GEMM = 0, LUTRA_CALLS_KERNEL = 1, LUTRA_CALLS_KINDS = 2 };
/* Runs the call: issue(ctx) (the call's launches on stream, returning a status), directly or
 * through the graph cached in *slot (made at the first call, of that kind) for this key
 * (key_bytes, the same for every call of one cache). */
int lutra_call_graphs_run(lutra_call_graphs **slot, int kind, const void *key, size_t key_bytes,
                          cudaStream_t stream, int (*issue)(void *), void *ctx, const char *fn);
void lutra_call_graphs_free(lutra_call_graphs *g);
void lutra_cuda_call_graphs_free(void *g); /* the backend table's call_graphs_free */
_Static_assert(sizeof(lutra_gemm_call) == 11 * sizeof(void *) + 2 * sizeof(int32_t),
               "lutra_gemm_call has padding bytes: its keys are memcmp'd");
/* graphs cached now and calls served by them so far, of one kind (process-wide) */
void lutra_call_graphs_stats(int kind, int64_t *graphs, int64_t *launches);
/* calls that gave way to a newcomer at a cache's capacity so far, of one kind (process-wide) */
int64_t lutra_call_graphs_evictions(int kind);
#ifdef LUTRA_CALL_GRAPHS_CHECK
/* whether every call a cache holds is found by its key through the index, and the index holds
 * nothing else (spec/native/check_call_graphs.c, built with LUTRA_CALL_GRAPHS_CHECK, asks it after
 * evictions) */
bool lutra_call_graphs_consistent(const lutra_call_graphs *g);
#endif
/* The kernel launchers whose calls are cached as graphs (backend_cuda.c, grouped_cuda.c), and
 * the calling thread's stream's cache of one of them (context_cuda.c) */
enum {
  LUTRA_LAUNCH_CONVERT,
  LUTRA_LAUNCH_FILL,
  LUTRA_LAUNCH_AMAX,
  LUTRA_LAUNCH_CURRENT_SCALE,
  LUTRA_LAUNCH_CURRENT_SCALE_ACT,
  LUTRA_LAUNCH_CAST,
  LUTRA_LAUNCH_MXFP8,
  LUTRA_LAUNCH_BLOCK,
  LUTRA_LAUNCH_DEQUANTIZE,
  LUTRA_LAUNCH_ROWWISE,
  LUTRA_LAUNCH_ACT_FORWARD,
  LUTRA_LAUNCH_ACT_BACKWARD,
  LUTRA_LAUNCH_BIAS_GRAD,
  LUTRA_LAUNCH_MSE,
  LUTRA_LAUNCH_XENT,
  LUTRA_LAUNCH_NORM_FORWARD,
  LUTRA_LAUNCH_NORM_BACKWARD,
  LUTRA_LAUNCH_NORM_QUANTIZE,
  LUTRA_LAUNCH_ADD,
  LUTRA_LAUNCH_TOPK_FORWARD,
  LUTRA_LAUNCH_TOPK_BACKWARD,
  LUTRA_LAUNCH_PERMUTE,
  LUTRA_LAUNCH_PERMUTE_BACKWARD,
  LUTRA_LAUNCH_UNPERMUTE,
  LUTRA_LAUNCH_UNPERMUTE_BACKWARD,
  LUTRA_LAUNCH_GROUPED_QUANTIZE,
  LUTRA_LAUNCH_DELAYED_UPDATE,
  LUTRA_LAUNCH_DELAYED_UPDATE_WIDE,
  LUTRA_LAUNCHERS
};
/* The slot of a launcher's cache on the current stream; release frees a cache (the stream's
 * state releases its caches with it). */
lutra_call_graphs **lutra_cuda_launch_graphs(int launcher, void (*release)(lutra_call_graphs *));

/* One GEMM workspace per device and stream: cuBLASLt's 32 MiB on Hopper and newer, with
 * 256 bytes for alignment, as TransformerEngine sizes it. */
enum { LUTRA_CUDA_WORKSPACE = 32 * 1024 * 1024 + 256 };

#endif
