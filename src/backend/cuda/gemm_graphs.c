/* Eager GEMMs replayed as CUDA graphs. A cublasLtMatmul costs the host several times what a
 * cudaGraphLaunch does (BENCHMARKS.md has the figures), and so do a grouped GEMM's two launches
 * (the setup kernel and the clustered CUTLASS kernel); in a training loop every GEMM is called
 * again and again with the same arguments: modules own their outputs, gradients and quantized
 * copies, so the pointers do not change from step to step. A cache therefore keeps a few calls
 * it has seen, keyed by every argument the call bakes into its kernels (for cuBLASLt: operand,
 * output, bias, aux, scale and workspace pointers, beta, the stream; for a grouped GEMM: its
 * whole argument struct, the workspace and the stream): the second time a call comes, its
 * launches are captured into a graph, and from then on that graph is launched instead. A graph
 * reads and writes memory when it runs, exactly as the call would (a grouped GEMM's problem
 * sizes are read from the device splits by its setup kernel, inside the graph), so results are
 * the same bit for bit; only what the call's arguments point to may change.
 *
 * The first sighting runs directly (it also loads the kernel's module and initializes CUTLASS's
 * cached GEMM object, which a capture must not do), so a one-off call never pays for a capture.
 * Calls made while lutra captures a graph of its own run directly: that capture records them.
 * A call about to be captured here while someone else captures the stream runs directly too;
 * a call whose graph exists goes into that capture as a child graph node (CUDA refuses a
 * cudaGraphLaunch on a capturing stream), which costs a capture-status query per cached call
 * (cudaStreamGetCaptureInfo, no lock on the launch path's scale). A cache (one per GEMM
 * plan, one per GroupedLinear) keeps at most LUTRA_GEMM_GRAPHS_PER_CACHE calls (the layers that
 * share a shape, a module's passes); further ones run directly, and nothing is evicted.
 * Destroying a cache destroys its graphs, which CUDA frees once a launch still in flight ends.
 * LUTRA_GEMM_GRAPHS=0 in the environment at load turns the caches off.
 *
 * Threads: plans are per thread and each thread captures its own stream (thread-local capture
 * mode: another thread's calls neither invalidate this capture nor are refused by it), so a
 * plan's cache is never seen by two threads; a module is used by one thread at a time. The key
 * holds the stream and the workspace (one per thread and stream), so a thread that switches
 * streams captures a graph per stream. Only the statistics are process-wide (atomic). */
#include "cuda_backend.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum { LUTRA_GEMM_GRAPHS_PER_CACHE = 32 };

typedef struct call_graph {
  cudaGraph_t graph;    /* what exec was made from: a capture of the stream takes it as a child */
  cudaGraphExec_t exec; /* NULL: seen once (or could not be captured: see broken) */
  bool broken;          /* the capture failed: this call always runs directly */
} call_graph;

/* calls[i]'s key is the key_bytes at keys + i * key_bytes */
struct lutra_call_graphs {
  int count;
  size_t key_bytes;
  call_graph calls[LUTRA_GEMM_GRAPHS_PER_CACHE];
  unsigned char keys[];
};

static bool graphs_on = true;
static _Atomic int64_t stat_graphs, stat_launches;

__attribute__((constructor)) static void read_graphs_switch(void) {
  const char *v = getenv("LUTRA_GEMM_GRAPHS");
  graphs_on = !(v && strcmp(v, "0") == 0);
}

void lutra_cuda_call_graphs_free(void *g) {
  lutra_call_graphs_free(g);
}

void lutra_call_graphs_free(lutra_call_graphs *g) {
  if (!g) return;
  for (int i = 0; i < g->count; i++)
    if (g->calls[i].exec) {
      cudaGraphExecDestroy(g->calls[i].exec);
      cudaGraphDestroy(g->calls[i].graph);
      stat_graphs--;
    }
  free(g);
}

/* Captures issue(ctx) on the call's stream into an executable graph; NULL when it cannot be
 * (the call then runs directly, now and later, and reports its own errors). */
static bool capture(call_graph *c, cudaStream_t s, int (*issue)(void *), void *ctx) {
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  int st = issue(ctx);
  cudaGraph_t graph = NULL;
  cudaError_t e = cudaStreamEndCapture(s, &graph);
  cudaGraphExec_t exec = NULL;
  if (st == LUTRA_OK && e == cudaSuccess && graph) e = cudaGraphInstantiate(&exec, graph, 0);
  if (e != cudaSuccess || st != LUTRA_OK) {
    cudaGetLastError(); /* a failed capture must not leave its error for the next call */
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    return false;
  }
  c->graph = graph;
  c->exec = exec;
  return true;
}

/* c's graph on stream: launched, or, while someone captures the stream, added to that capture
 * as a child node after what the capture holds so far (the capture then continues from it) */
static int launch(const call_graph *c, cudaStream_t stream, int (*issue)(void *), void *ctx,
                  const char *fn) {
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  cudaGraph_t outer = NULL;
  const cudaGraphNode_t *deps = NULL;
  size_t ndeps = 0;
  if (cudaStreamGetCaptureInfo(stream, &cs, NULL, &outer, &deps, NULL, &ndeps) != cudaSuccess) {
    cudaGetLastError(); /* e.g. edges with data this query cannot return: the launches */
    return issue(ctx);
  }
  stat_launches++;
  if (cs == cudaStreamCaptureStatusNone)
    return lutra_cuda_status(cudaGraphLaunch(c->exec, stream), fn,
                             "cudaGraphLaunch (a cached GEMM)");
  if (cs != cudaStreamCaptureStatusActive) return issue(ctx); /* invalidated: it reports */
  cudaGraphNode_t node;
  cudaError_t e = cudaGraphAddChildGraphNode(&node, outer, deps, ndeps, c->graph);
  if (e == cudaSuccess)
    e = cudaStreamUpdateCaptureDependencies(stream, &node, NULL, 1,
                                            cudaStreamSetCaptureDependencies);
  return lutra_cuda_status(e, fn, "adding a cached GEMM to the stream's capture");
}

int lutra_call_graphs_run(lutra_call_graphs **slot, const void *key, size_t key_bytes,
                          cudaStream_t stream, int (*issue)(void *), void *ctx, const char *fn) {
  if (!graphs_on || lutra_capture_active) return issue(ctx);
  lutra_call_graphs *g = *slot;
  call_graph *c = NULL;
  if (g) {
    if (g->key_bytes != key_bytes) return issue(ctx); /* one key type per cache */
    for (int i = 0; i < g->count; i++)
      if (memcmp(g->keys + (size_t)i * key_bytes, key, key_bytes) == 0) {
        c = &g->calls[i];
        break;
      }
  }
  if (c && c->exec) return launch(c, stream, issue, ctx, fn);
  if (!c) { /* first sighting: remember it, run it directly */
    if (!g) {
      g = calloc(1, sizeof *g + LUTRA_GEMM_GRAPHS_PER_CACHE * key_bytes);
      if (!g) return issue(ctx);
      g->key_bytes = key_bytes;
      *slot = g;
    }
    if (g->count < LUTRA_GEMM_GRAPHS_PER_CACHE) {
      memcpy(g->keys + (size_t)g->count * key_bytes, key, key_bytes);
      g->calls[g->count++] = (call_graph){0};
    }
    return issue(ctx);
  }
  if (c->broken) return issue(ctx);
  enum cudaStreamCaptureStatus outer = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &outer) != cudaSuccess ||
      outer != cudaStreamCaptureStatusNone) {
    cudaGetLastError();
    return issue(ctx);
  }
  if (!capture(c, stream, issue, ctx)) {
    c->broken = true;
    return issue(ctx);
  }
  stat_graphs++;
  stat_launches++;
  return lutra_cuda_status(cudaGraphLaunch(c->exec, stream), fn, "cudaGraphLaunch (a cached GEMM)");
}

void lutra_gemm_graphs_stats(int64_t *graphs, int64_t *launches) {
  *graphs = stat_graphs;
  *launches = stat_launches;
}
