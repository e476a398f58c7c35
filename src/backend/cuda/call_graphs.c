/* Eager calls replayed as CUDA graphs. A cublasLtMatmul costs the host several times what a
 * cudaGraphLaunch does (docs/lab/ has the figures), and so do a grouped GEMM's two launches
 * (the setup kernel and the clustered CUTLASS kernel) and even one kernel launch (the norm, a
 * cast, an activation: a <<<>>> launch costs the host about twice a graph launch on the H200
 * machines measured); in a training loop every such call comes again and again with the same
 * arguments: modules own their outputs, gradients and quantized copies, so the pointers do not
 * change from step to step. A cache therefore keeps the calls it has seen, keyed by every
 * argument the call bakes into its kernels (for cuBLASLt: operand, output, bias, aux, scale and
 * workspace pointers, beta, the stream; for a grouped GEMM or a kernel launcher: its whole
 * argument struct, its scratch and the stream): the second time a call comes, its launches are
 * captured into a graph, and from then on that graph is launched instead. A graph
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
 * (cudaStreamGetCaptureInfo) on a caller's stream; the thread's own stream, whose handle never
 * leaves lutra, is captured only by lutra and needs none. A cache (one per GEMM plan,
 * keeping 256 calls: every layer that shares the shape, in training and in eval, on each stream
 * used; one per GroupedLinear, 256: its passes over each splits tensor it is given; one per
 * kernel launcher and stream, 512: every layer's norm, cast, activation; fewer where the keys
 * are KBs, at most 512 KB of them) finds a key through a hash of its bytes. At its capacity a new
 * call takes the place of one not served since the clock hand last passed it (CLOCK, an
 * approximation of least recently used that costs a hit one store): pointers that moved (outputs
 * reallocated for a new shape, a freed module's buffers) leave keys that never come again, and
 * without eviction they would fill the cache for good and leave every later call direct. The
 * newcomer is only remembered, as any first sighting, so a working set larger than the capacity,
 * cycled, runs directly instead of capturing a graph per call. Destroying an evicted or freed
 * cache's graph is safe while a launch of it still runs: CUDA frees it once that launch ends.
 * LUTRA_GEMM_GRAPHS=0 in the environment at load turns the GEMM caches off, LUTRA_LAUNCH_GRAPHS=0
 * the kernel launchers' (each on its own, for side-by-side figures).
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

typedef struct call_graph {
  cudaGraph_t graph;    /* what exec was made from: a capture of the stream takes it as a child */
  cudaGraphExec_t exec; /* NULL: seen once (or could not be captured: see broken) */
  bool broken;          /* the capture failed: this call always runs directly */
  bool used;            /* served since the clock hand last passed it */
} call_graph;

/* calls[i]'s key is the key_bytes at keys + i * key_bytes, its hash hashes[i]; index is an
 * open-addressing table (mask + 1 slots, twice the capacity: short probes) of call numbers + 1,
 * 0 for an empty slot */
struct lutra_call_graphs {
  int kind, count, capacity;
  int hand; /* the next call the clock looks at when one must give way */
  uint32_t mask;
  size_t key_bytes;
  call_graph *calls;
  uint64_t *hashes;
  int32_t *index;
  unsigned char *keys;
};

static const int capacity_of[LUTRA_CALLS_KINDS] = {
    [LUTRA_CALLS_GEMM] = 256, [LUTRA_CALLS_KERNEL] = 512};
static bool graphs_on[LUTRA_CALLS_KINDS] = {true, true};
static _Atomic int64_t stat_graphs[LUTRA_CALLS_KINDS], stat_launches[LUTRA_CALLS_KINDS],
    stat_evictions[LUTRA_CALLS_KINDS];

static bool switched_off(const char *name) {
  const char *v = getenv(name);
  return v && strcmp(v, "0") == 0;
}

__attribute__((constructor)) static void read_graphs_switch(void) {
  graphs_on[LUTRA_CALLS_GEMM] = !switched_off("LUTRA_GEMM_GRAPHS");
  graphs_on[LUTRA_CALLS_KERNEL] = !switched_off("LUTRA_LAUNCH_GRAPHS");
}

static void destroy_graph(int kind, call_graph *c) {
  if (!c->exec) return;
  cudaGraphExecDestroy(c->exec);
  cudaGraphDestroy(c->graph);
  c->exec = NULL;
  c->graph = NULL;
  stat_graphs[kind]--;
}

void lutra_cuda_call_graphs_free(void *g) {
  lutra_call_graphs_free(g);
}

void lutra_call_graphs_free(lutra_call_graphs *g) {
  if (!g) return;
  for (int i = 0; i < g->count; i++)
    destroy_graph(g->kind, &g->calls[i]);
  free(g);
}

/* One allocation: the struct, then calls, hashes, index and keys (each 8-byte aligned). */
static lutra_call_graphs *cache_new(int kind, size_t key_bytes) {
  /* keys of a few KB (the wide delayed update's) keep fewer calls: at most KEY_MEMORY of keys */
  enum { KEY_MEMORY = 512 * 1024, LEAST = 16 };
  const size_t fit = KEY_MEMORY / (key_bytes ? key_bytes : 1);
  const int cap = fit >= (size_t)capacity_of[kind] ? capacity_of[kind]
                  : fit > LEAST                    ? (int)fit
                                                   : LEAST;
  uint32_t slots = 1;
  while (slots < 2u * (uint32_t)cap)
    slots <<= 1;
  const size_t calls = (sizeof(lutra_call_graphs) + 7) / 8 * 8;
  const size_t hashes = calls + (size_t)cap * sizeof(call_graph);
  const size_t index = hashes + (size_t)cap * sizeof(uint64_t);
  const size_t keys = index + ((size_t)slots * sizeof(int32_t) + 7) / 8 * 8;
  unsigned char *m = calloc(1, keys + (size_t)cap * key_bytes);
  if (!m) return NULL;
  lutra_call_graphs *g = (lutra_call_graphs *)m;
  g->kind = kind;
  g->capacity = cap;
  g->mask = slots - 1;
  g->key_bytes = key_bytes;
  g->calls = (call_graph *)(m + calls);
  g->hashes = (uint64_t *)(m + hashes);
  g->index = (int32_t *)(m + index);
  g->keys = m + keys;
  return g;
}

/* A 64-bit hash of the key's bytes, eight at a time (keys are structs of pointers and sizes:
 * mostly whole words) in four independent lanes: a long key (the wide delayed update's 4 KB)
 * is then four short chains of dependent multiplies, not one long one */
static uint64_t mix(uint64_t h, uint64_t w) {
  h = (h ^ w) * 0xFF51AFD7ED558CCDull;
  return h ^ (h >> 32);
}

static uint64_t key_hash(const void *key, size_t n) {
  const unsigned char *p = key;
  uint64_t h[4] = {0x9E3779B97F4A7C15ull ^ n, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull,
                   0x27D4EB2F165667C5ull};
  for (; n >= 32; n -= 32, p += 32)
    for (int i = 0; i < 4; i++) {
      uint64_t w;
      memcpy(&w, p + 8 * i, 8);
      h[i] = mix(h[i], w);
    }
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    h[0] = mix(h[0], w);
  }
  for (; n > 0; n--, p++)
    h[1] = (h[1] ^ *p) * 0x100000001B3ull;
  uint64_t r = mix(mix(mix(h[0], h[1]), h[2]), h[3]);
  return r ^ (r >> 29);
}

/* The call cached under key, or NULL; *slot_out: the index slot it is in or would go to. */
static call_graph *find(const lutra_call_graphs *g, const void *key, uint64_t h,
                        uint32_t *slot_out) {
  uint32_t s = (uint32_t)h & g->mask;
  for (int32_t i; (i = g->index[s]) != 0; s = (s + 1) & g->mask) {
    const int c = i - 1;
    if (g->hashes[c] == h && memcmp(g->keys + (size_t)c * g->key_bytes, key, g->key_bytes) == 0)
      return &g->calls[c];
  }
  *slot_out = s;
  return NULL;
}

/* Takes call c out of the index: linear probing's deletion, which moves every later key of the
 * probe run that would no longer be found past the hole back into it (no tombstones: probes
 * stay as short as the table's load). */
static void unindex(lutra_call_graphs *g, int c) {
  uint32_t hole = (uint32_t)g->hashes[c] & g->mask;
  while (g->index[hole] != c + 1)
    hole = (hole + 1) & g->mask;
  for (uint32_t s = (hole + 1) & g->mask; g->index[s] != 0; s = (s + 1) & g->mask) {
    const uint32_t home = (uint32_t)g->hashes[g->index[s] - 1] & g->mask;
    /* the key at s stays unless its home lies cyclically outside (hole, s] */
    const bool stays = hole < s ? (home > hole && home <= s) : (home > hole || home <= s);
    if (stays) continue;
    g->index[hole] = g->index[s];
    hole = s;
  }
  g->index[hole] = 0;
}

/* The call that gives way at capacity: the first the clock hand finds not served since it last
 * passed (the hand clears what it passes), its graph destroyed and its key out of the index. */
static int evict(lutra_call_graphs *g) {
  for (;;) {
    const int c = g->hand;
    g->hand = (g->hand + 1) % g->capacity;
    if (g->calls[c].used) {
      g->calls[c].used = false;
      continue;
    }
    destroy_graph(g->kind, &g->calls[c]);
    unindex(g, c);
    stat_evictions[g->kind]++;
    return c;
  }
}

/* remembers key (hash h) as call n, seen once, in index slot s */
static void remember(lutra_call_graphs *g, int n, const void *key, uint64_t h, uint32_t s) {
  memcpy(g->keys + (size_t)n * g->key_bytes, key, g->key_bytes);
  g->hashes[n] = h;
  g->calls[n] = (call_graph){0};
  g->index[s] = n + 1;
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

/* Whether someone captures the stream, and then what the capture holds so far (*outer, *deps).
 * The thread's own stream is captured by nobody but lutra (cuda_backend.h): no query there.
 * false with *unknown set where the query fails or finds an invalidated capture. */
static bool captured(cudaStream_t stream, cudaGraph_t *outer, const cudaGraphNode_t **deps,
                     size_t *ndeps, bool *unknown) {
  *unknown = false;
  if (lutra_cuda_stream_private() && stream == lutra_cuda_stream()) return false;
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamGetCaptureInfo(stream, &cs, NULL, outer, deps, NULL, ndeps) != cudaSuccess) {
    cudaGetLastError(); /* e.g. edges with data this query cannot return */
    *unknown = true;
    return false;
  }
  *unknown = cs == cudaStreamCaptureStatusInvalidated;
  return cs == cudaStreamCaptureStatusActive;
}

/* c's graph on stream: launched, or, while someone captures the stream, added to that capture
 * as a child node after what the capture holds so far (the capture then continues from it).
 * Where the stream's state is unknown the call runs directly (and reports what it meets). */
static int launch(int kind, const call_graph *c, cudaStream_t stream, int (*issue)(void *),
                  void *ctx, const char *fn) {
  cudaGraph_t outer = NULL;
  const cudaGraphNode_t *deps = NULL;
  size_t ndeps = 0;
  bool unknown;
  const bool in_capture = captured(stream, &outer, &deps, &ndeps, &unknown);
  if (unknown) return issue(ctx);
  stat_launches[kind]++;
  if (!in_capture)
    return lutra_cuda_status(cudaGraphLaunch(c->exec, stream), fn,
                             "cudaGraphLaunch (a cached call)");
  cudaGraphNode_t node;
  cudaError_t e = cudaGraphAddChildGraphNode(&node, outer, deps, ndeps, c->graph);
  if (e == cudaSuccess)
    e = cudaStreamUpdateCaptureDependencies(stream, &node, NULL, 1,
                                            cudaStreamSetCaptureDependencies);
  return lutra_cuda_status(e, fn, "adding a cached call to the stream's capture");
}

int lutra_call_graphs_run(lutra_call_graphs **slot, int kind, const void *key, size_t key_bytes,
                          cudaStream_t stream, int (*issue)(void *), void *ctx, const char *fn) {
  if (!graphs_on[kind] || lutra_capture_active) return issue(ctx);
  lutra_call_graphs *g = *slot;
  if (!g) {
    g = cache_new(kind, key_bytes);
    if (!g) return issue(ctx);
    *slot = g;
  }
  if (g->key_bytes != key_bytes || g->kind != kind) return issue(ctx); /* one key type a cache */
  const uint64_t h = key_hash(key, key_bytes);
  uint32_t free_slot = 0;
  call_graph *c = find(g, key, h, &free_slot);
  if (c) c->used = true;
  if (c && c->exec) return launch(kind, c, stream, issue, ctx, fn);
  if (!c) { /* first sighting: remember it (in a place given up, at capacity), run it directly */
    if (g->count < g->capacity) {
      remember(g, g->count++, key, h, free_slot);
    } else {
      const int n = evict(g);
      find(g, key, h, &free_slot); /* the deletion may have moved the slot it would go to */
      remember(g, n, key, h, free_slot);
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
  stat_graphs[kind]++;
  stat_launches[kind]++;
  return lutra_cuda_status(cudaGraphLaunch(c->exec, stream), fn, "cudaGraphLaunch (a cached call)");
}

void lutra_call_graphs_stats(int kind, int64_t *graphs, int64_t *launches) {
  *graphs = stat_graphs[kind];
  *launches = stat_launches[kind];
}

int64_t lutra_call_graphs_evictions(int kind) {
  return stat_evictions[kind];
}

#ifdef LUTRA_CALL_GRAPHS_CHECK
bool lutra_call_graphs_consistent(const lutra_call_graphs *g) {
  if (!g) return true;
  int indexed = 0;
  for (uint32_t s = 0; s <= g->mask; s++)
    if (g->index[s] != 0) {
      if (g->index[s] < 1 || g->index[s] > g->count) return false;
      indexed++;
    }
  for (int c = 0; c < g->count; c++) {
    uint32_t slot;
    const call_graph *found = find(g, g->keys + (size_t)c * g->key_bytes, g->hashes[c], &slot);
    if (found != &g->calls[c]) return false;
  }
  return indexed == g->count;
}
#endif
