/* Eager GEMMs replayed as CUDA graphs. A cublasLtMatmul costs the host several times what a
 * cudaGraphLaunch does (BENCHMARKS.md has the figures), and in a training loop every GEMM is
 * called again and again with the same arguments: modules own their outputs, gradients and
 * quantized copies, so the pointers do not change from step to step. A plan therefore keeps a
 * few calls it has seen, keyed by every argument the call bakes into its kernels (operand,
 * output, bias, aux, scale and workspace pointers, beta, the stream): the second time a call
 * comes, its cublasLtMatmul is captured into a one-GEMM graph, and from then on that graph is
 * launched instead. A graph reads and writes memory when it runs, exactly as the call would,
 * so results are the same bit for bit; only what the call's arguments point to may change.
 *
 * The first sighting runs directly (it also loads the kernel's module, which a capture must
 * not do), so a one-off call never pays for a capture. Calls made while lutra captures a
 * graph of its own run directly: that capture records them. A call about to be captured here
 * while someone else captures the stream runs directly too; but a call whose graph exists is
 * launched as a graph even then (no query per call to find out), so captures of lutra's stream
 * belong in lutra_graph_begin/end. A plan keeps at most LUTRA_GEMM_GRAPHS_PER_PLAN calls (the
 * layers that share a shape); further ones run directly, and nothing is evicted, so a graph
 * is never destroyed while the GPU may still run it. LUTRA_GEMM_GRAPHS=0 in the environment at
 * load turns the cache off.
 *
 * Threads: plans are per thread and each thread captures its own stream (thread-local capture
 * mode: another thread's calls neither invalidate this capture nor are refused by it), so a
 * plan's cache is never seen by two threads. The key holds the stream and the workspace (one
 * per thread and stream), so a thread that switches streams captures a graph per stream. Only
 * the statistics are process-wide (atomic). */
#include "cuda_backend.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum { LUTRA_GEMM_GRAPHS_PER_PLAN = 16 };

typedef struct call_graph {
  lutra_gemm_call key;
  cudaGraphExec_t exec; /* NULL: seen once (or could not be captured: see broken) */
  bool broken;          /* the capture failed: this call always runs directly */
} call_graph;

struct lutra_gemm_graphs {
  int count;
  call_graph calls[LUTRA_GEMM_GRAPHS_PER_PLAN];
};

static bool graphs_on = true;
static _Atomic int64_t stat_graphs, stat_launches;

__attribute__((constructor)) static void read_graphs_switch(void) {
  const char *v = getenv("LUTRA_GEMM_GRAPHS");
  graphs_on = !(v && strcmp(v, "0") == 0);
}

void lutra_gemm_graphs_free(lutra_gemm_graphs *g) {
  if (!g) return;
  for (int i = 0; i < g->count; i++)
    if (g->calls[i].exec) {
      cudaGraphExecDestroy(g->calls[i].exec);
      stat_graphs--;
    }
  free(g);
}

static bool same_call(const lutra_gemm_call *x, const lutra_gemm_call *y) {
  return x->a == y->a && x->b == y->b && x->d == y->d && x->bias == y->bias && x->aux == y->aux &&
         x->dbias == y->dbias && x->a_scale == y->a_scale && x->b_scale == y->b_scale &&
         x->workspace == y->workspace && x->stream == y->stream && x->beta == y->beta;
}

/* Captures issue(ctx) on the call's stream into an executable graph; NULL when it cannot be
 * (the call then runs directly, now and later, and reports its own errors). */
static cudaGraphExec_t capture(const lutra_gemm_call *key, int (*issue)(void *), void *ctx) {
  cudaStream_t s = key->stream;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    return NULL;
  }
  int st = issue(ctx);
  cudaGraph_t graph = NULL;
  cudaError_t e = cudaStreamEndCapture(s, &graph);
  cudaGraphExec_t exec = NULL;
  if (st == LUTRA_OK && e == cudaSuccess && graph) e = cudaGraphInstantiate(&exec, graph, 0);
  if (graph) cudaGraphDestroy(graph);
  if (e != cudaSuccess || st != LUTRA_OK) {
    cudaGetLastError(); /* a failed capture must not leave its error for the next call */
    if (exec) cudaGraphExecDestroy(exec);
    return NULL;
  }
  return exec;
}

int lutra_gemm_graphs_run(lutra_gemm_graphs **slot, const lutra_gemm_call *key,
                          int (*issue)(void *), void *ctx, const char *fn) {
  if (!graphs_on || lutra_capture_active) return issue(ctx);
  lutra_gemm_graphs *g = *slot;
  call_graph *c = NULL;
  if (g) {
    for (int i = 0; i < g->count; i++)
      if (same_call(&g->calls[i].key, key)) {
        c = &g->calls[i];
        break;
      }
  }
  if (c && c->exec) {
    stat_launches++;
    return lutra_cuda_status(cudaGraphLaunch(c->exec, key->stream), fn,
                             "cudaGraphLaunch (a cached GEMM)");
  }
  if (!c) { /* first sighting: remember it, run it directly */
    if (!g) {
      g = calloc(1, sizeof *g);
      if (!g) return issue(ctx);
      *slot = g;
    }
    if (g->count < LUTRA_GEMM_GRAPHS_PER_PLAN) g->calls[g->count++] = (call_graph){.key = *key};
    return issue(ctx);
  }
  if (c->broken) return issue(ctx);
  enum cudaStreamCaptureStatus outer = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(key->stream, &outer) != cudaSuccess ||
      outer != cudaStreamCaptureStatusNone) {
    cudaGetLastError();
    return issue(ctx);
  }
  c->exec = capture(key, issue, ctx);
  if (!c->exec) {
    c->broken = true;
    return issue(ctx);
  }
  stat_graphs++;
  stat_launches++;
  return lutra_cuda_status(cudaGraphLaunch(c->exec, key->stream), fn,
                           "cudaGraphLaunch (a cached GEMM)");
}

void lutra_gemm_graphs_stats(int64_t *graphs, int64_t *launches) {
  *graphs = stat_graphs;
  *launches = stat_launches;
}
