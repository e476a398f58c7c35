/* The call-graph cache (src/backend/cuda/call_graphs.c) against a fake CUDA runtime, on the
 * host: the cache's own logic (first sighting direct, second captured and launched, later ones
 * launched, keys told apart byte by byte, capacity, a failed capture, the capture-status query
 * on a caller's stream, a child graph inside someone else's capture, lutra's own capture, the
 * statistics) without a GPU. The fake records what a call's issue function launches while a
 * capture is open and applies it again at each graph launch, so a replayed call must leave
 * what the direct call would have left. The real call_graphs.c is built with fake_cuda.h forced
 * in, which renames the CUDA runtime calls it makes (and the backend functions it uses) onto the
 * fake_* functions below. Needs the CUDA headers only (cuda_backend.h includes them);
 * spec/call_graphs_spec.lua builds and runs it (make check-call-graphs).
 * Output: one "ok"/"FAIL" line per check, then "N failures". */
#include "fake_cuda.h"

#include "backend/cuda/cuda_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the fake runtime --------------------------------------------------------------------
 * A "launch" adds value to out[slot]. A graph is the list of launches captured into it. */
enum { MAX_OPS = 8, OUT_SLOTS = 1024 };
typedef struct fake_graph {
  int n;
  int slot[MAX_OPS];
  int value[MAX_OPS];
} fake_graph;

static int64_t out[OUT_SLOTS];
static fake_graph *recording; /* a capture of ours is open */
static bool outer_capture;    /* someone else captures the (caller's) stream */
static int graph_launches, child_nodes, capture_queries, fail_capture_issue;
static int graphs_alive;
_Thread_local bool fake_lutra_capture_active;
static bool own_stream = true;
static cudaStream_t const OWN = (cudaStream_t)0x1000, CALLER = (cudaStream_t)0x2000;

static void fake_launch(int slot, int value) {
  if (recording) {
    recording->slot[recording->n] = slot;
    recording->value[recording->n++] = value;
  } else {
    out[slot] += value;
  }
}

cudaError_t fake_cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode m) {
  (void)s, (void)m;
  recording = calloc(1, sizeof *recording);
  return recording ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t fake_cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
  (void)s;
  *g = (cudaGraph_t)recording;
  recording = NULL;
  graphs_alive++;
  return cudaSuccess;
}
cudaError_t fake_cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags) {
  (void)flags;
  *e = (cudaGraphExec_t)g; /* the same record: exec and graph are destroyed together */
  return cudaSuccess;
}
cudaError_t fake_cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
  (void)s;
  const fake_graph *g = (const fake_graph *)e;
  for (int i = 0; i < g->n; i++)
    out[g->slot[i]] += g->value[i];
  graph_launches++;
  return cudaSuccess;
}
cudaError_t fake_cudaGraphExecDestroy(cudaGraphExec_t e) {
  (void)e;
  return cudaSuccess;
}
cudaError_t fake_cudaGraphDestroy(cudaGraph_t g) {
  free(g);
  graphs_alive--;
  return cudaSuccess;
}
cudaError_t fake_cudaGetLastError(void) {
  return cudaSuccess;
}
cudaError_t fake_cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st) {
  *st = s == CALLER && outer_capture ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t fake_cudaStreamGetCaptureInfo(cudaStream_t s, enum cudaStreamCaptureStatus *st,
                                          unsigned long long *id, cudaGraph_t *graph,
                                          const cudaGraphNode_t **deps,
                                          const cudaGraphEdgeData **edges, size_t *ndeps) {
  (void)id, (void)edges;
  capture_queries++;
  fake_cudaStreamIsCapturing(s, st);
  if (graph) *graph = NULL;
  if (deps) *deps = NULL;
  if (ndeps) *ndeps = 0;
  return cudaSuccess;
}
cudaError_t fake_cudaGraphAddChildGraphNode(cudaGraphNode_t *node, cudaGraph_t graph,
                                            const cudaGraphNode_t *deps, size_t n,
                                            cudaGraph_t child) {
  (void)graph, (void)deps, (void)n, (void)child;
  *node = (cudaGraphNode_t)0x3000;
  child_nodes++;
  return cudaSuccess;
}
cudaError_t fake_cudaStreamUpdateCaptureDependencies(cudaStream_t s, cudaGraphNode_t *deps,
                                                     const cudaGraphEdgeData *data, size_t n,
                                                     unsigned int flags) {
  (void)s, (void)deps, (void)data, (void)n, (void)flags;
  return cudaSuccess;
}

/* ---- what call_graphs.c needs of the rest of the backend ----------------------------------- */
int fake_lutra_cuda_status(cudaError_t e, const char *fn, const char *what) {
  (void)fn, (void)what;
  return e == cudaSuccess ? LUTRA_OK : LUTRA_EBACKEND;
}
cudaStream_t fake_lutra_cuda_stream(void) {
  return own_stream ? OWN : CALLER;
}
bool fake_lutra_cuda_stream_private(void) {
  return own_stream;
}

/* ---- the calls ------------------------------------------------------------------------------ */
typedef struct test_key {
  int32_t slot, value; /* the call adds value to out[slot], twice (two launches) */
  cudaStream_t stream;
} test_key;

static int direct_issues; /* issue() calls made outside a capture */

static int issue(void *p) {
  const test_key *k = p;
  if (!recording) direct_issues++;
  if (recording && fail_capture_issue) return LUTRA_EBACKEND;
  fake_launch(k->slot, k->value);
  fake_launch(k->slot, k->value);
  return LUTRA_OK;
}

static int run(lutra_call_graphs **cache, int kind, int slot, int value) {
  test_key k = {slot, value, fake_lutra_cuda_stream()};
  return lutra_call_graphs_run(cache, kind, &k, sizeof k, k.stream, issue, &k, "check");
}

/* graphs the statistics count as cached, of both kinds: the fake's live graphs must match */
static int64_t cached_graphs(void) {
  int64_t g[2], served;
  lutra_call_graphs_stats(LUTRA_CALLS_KERNEL, &g[0], &served);
  lutra_call_graphs_stats(LUTRA_CALLS_GEMM, &g[1], &served);
  return g[0] + g[1];
}

static int failures;
static void check(bool ok, const char *what) {
  printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) failures++;
}

int main(void) {
  lutra_call_graphs *cache = NULL;
  int64_t graphs, served;

  /* the sightings: direct, captured + launched, launched */
  run(&cache, LUTRA_CALLS_KERNEL, 1, 5);
  check(out[1] == 10 && direct_issues == 1 && graph_launches == 0, "first sighting runs directly");
  run(&cache, LUTRA_CALLS_KERNEL, 1, 5);
  check(out[1] == 20 && direct_issues == 1 && graph_launches == 1,
        "second sighting is captured and launched, with the direct call's effect");
  run(&cache, LUTRA_CALLS_KERNEL, 1, 5);
  check(out[1] == 30 && direct_issues == 1 && graph_launches == 2,
        "third call is one graph launch, issue not called");
  lutra_call_graphs_stats(LUTRA_CALLS_KERNEL, &graphs, &served);
  check(graphs == 1 && served == 2, "statistics: one graph cached, two calls served");
  check(capture_queries == 0, "no capture-status query on the thread's own stream");

  /* a key one byte apart is another call */
  run(&cache, LUTRA_CALLS_KERNEL, 1, 6);
  check(out[1] == 42 && direct_issues == 2, "a key that differs in one field runs as its own call");

  /* many keys, 16 slots each written by ~31 of them (keys alike but for the value): each
   * call's graph applies its own effect (the hashed index finds every one, whole keys compared) */
  memset(out, 0, sizeof out);
  for (int round = 0; round < 3; round++)
    for (int s = 100; s < 600; s++)
      run(&cache, LUTRA_CALLS_KERNEL, 100 + s % 16, s);
  bool each = true;
  for (int slot = 100; slot < 116; slot++) {
    int64_t want = 0;
    for (int s = 100; s < 600; s++)
      if (100 + s % 16 == slot) want += 6 * s;
    each = each && out[slot] == want;
  }
  check(each, "500 keys, three calls each: every call's effect, from its own graph");

  /* capacity: 512 calls a kernel cache; past it a newcomer takes the place of a call the clock
   * hand finds not served since it last passed; every call still has its effect */
  memset(out, 0, sizeof out);
  int before = direct_issues;
  const int64_t evicted_before = lutra_call_graphs_evictions(LUTRA_CALLS_KERNEL);
  for (int round = 0; round < 3; round++)
    for (int s = 600; s < 620; s++)
      run(&cache, LUTRA_CALLS_KERNEL, s, 1);
  bool full = true;
  for (int s = 600; s < 620; s++)
    full = full && out[s] == 6;
  check(full && lutra_call_graphs_evictions(LUTRA_CALLS_KERNEL) > evicted_before &&
            lutra_call_graphs_consistent(cache),
        "past the capacity calls give way, every call's effect still right, the index whole");
  check(cached_graphs() == graphs_alive, "an evicted call's graph is destroyed");

  /* a working set larger than the capacity, cycled: each call gives way before it comes again,
   * so nothing is captured (a capture per call would cost more than running it) */
  lutra_call_graphs *cycled = NULL;
  memset(out, 0, sizeof out);
  before = direct_issues;
  int launches_before = graph_launches;
  const int64_t gemm_evicted = lutra_call_graphs_evictions(LUTRA_CALLS_GEMM);
  for (int round = 0; round < 3; round++)
    for (int s = 0; s < 300; s++)
      run(&cycled, LUTRA_CALLS_GEMM, s, 1);
  bool cycled_right = true;
  for (int s = 0; s < 300; s++)
    cycled_right = cycled_right && out[s] == 6;
  check(cycled_right && direct_issues - before == 900 && graph_launches == launches_before &&
            lutra_call_graphs_evictions(LUTRA_CALLS_GEMM) - gemm_evicted == 900 - 256,
        "300 calls cycled through a 256-call cache: all direct, none captured, FIFO evictions");
  check(lutra_call_graphs_consistent(cycled), "the index after 644 evictions");

  /* a hot call survives a flood of one-off calls (the hand clears it, it is served again before
   * the hand comes round), and after the flood a new repeated call is captured again: with
   * nothing evicted, a cache once full ran every later call directly */
  lutra_call_graphs *hot = NULL;
  memset(out, 0, sizeof out);
  for (int i = 0; i < 3; i++)
    run(&hot, LUTRA_CALLS_KERNEL, 1, 3);
  launches_before = graph_launches;
  before = direct_issues;
  for (int i = 0; i < 5000; i++) {
    run(&hot, LUTRA_CALLS_KERNEL, 2 + i % 1000, 1000 + i); /* a new key each time */
    if (i % 100 == 99) run(&hot, LUTRA_CALLS_KERNEL, 1, 3);
  }
  check(out[1] == 6 * 53 && graph_launches - launches_before == 50 &&
            direct_issues - before == 5000,
        "a call served every 100 one-off calls stays a graph launch through 5000 of them");
  launches_before = graph_launches;
  before = direct_issues;
  for (int i = 0; i < 3; i++)
    run(&hot, LUTRA_CALLS_KERNEL, 1, 4);
  check(out[1] == 6 * 53 + 24 && graph_launches - launches_before == 2 &&
            direct_issues - before == 1,
        "after the flood a new call is captured at its second sighting");
  check(lutra_call_graphs_consistent(hot), "the index after 4500 evictions");

  /* a mixed workload (a few hot calls, many warm, a long tail), checked call by call against
   * what the calls add when run directly */
  lutra_call_graphs *mixed = NULL;
  memset(out, 0, sizeof out);
  int64_t want[OUT_SLOTS] = {0};
  uint64_t rng = 0x243F6A8885A308D3ull;
  for (int i = 0; i < 40000; i++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t r = (uint32_t)(rng >> 33);
    const int key = r % 4 == 0   ? (int)(r >> 8) % 8
                    : r % 4 == 1 ? (int)(r >> 8) % 400
                                 : (int)(r >> 8) % 5000;
    const int slot = key % OUT_SLOTS;
    run(&mixed, LUTRA_CALLS_GEMM, slot, key + 1);
    want[slot] += 2 * (key + 1);
  }
  bool mixed_right = memcmp(out, want, sizeof out) == 0;
  check(mixed_right && lutra_call_graphs_consistent(mixed) && cached_graphs() == graphs_alive,
        "40000 calls of a skewed mix: each call's effect, the index whole, no graph leaked");
  lutra_call_graphs_free(cycled);
  lutra_call_graphs_free(hot);
  lutra_call_graphs_free(mixed);

  /* a capture that fails: that call runs directly from then on */
  lutra_call_graphs *other = NULL;
  memset(out, 0, sizeof out);
  before = direct_issues;
  run(&other, LUTRA_CALLS_GEMM, 7, 1);
  fail_capture_issue = 1;
  run(&other, LUTRA_CALLS_GEMM, 7, 1);
  fail_capture_issue = 0;
  run(&other, LUTRA_CALLS_GEMM, 7, 1);
  check(out[7] == 6 && direct_issues - before == 3 && graphs_alive == cached_graphs(),
        "a failed capture leaves no graph; the call runs directly, correctly");

  /* lutra's own capture (lutra.graph) records the launches itself: even a call whose graph is
   * cached runs directly */
  for (int i = 0; i < 2; i++)
    run(&other, LUTRA_CALLS_GEMM, 8, 1);
  fake_lutra_capture_active = true;
  before = direct_issues;
  launches_before = graph_launches;
  run(&other, LUTRA_CALLS_GEMM, 8, 1);
  fake_lutra_capture_active = false;
  check(direct_issues - before == 1 && graph_launches == launches_before,
        "inside lutra's own capture a cached call runs directly");

  /* a caller's stream: the capture status is asked; inside someone else's capture a cached
   * call goes in as a child graph (no launch) */
  own_stream = false;
  lutra_call_graphs *mine = NULL;
  memset(out, 0, sizeof out);
  for (int i = 0; i < 3; i++)
    run(&mine, LUTRA_CALLS_GEMM, 9, 2);
  check(out[9] == 12 && capture_queries == 1, "a caller's stream: one query a cached launch");
  outer_capture = true;
  launches_before = graph_launches;
  run(&mine, LUTRA_CALLS_GEMM, 9, 2);
  outer_capture = false;
  check(child_nodes == 1 && graph_launches == launches_before && out[9] == 12,
        "inside someone else's capture: a child graph node, nothing launched");
  /* a call about to be captured while someone else captures runs directly (their capture
   * records its launches) */
  outer_capture = true;
  before = direct_issues;
  run(&mine, LUTRA_CALLS_GEMM, 10, 1);
  run(&mine, LUTRA_CALLS_GEMM, 10, 1);
  outer_capture = false;
  check(direct_issues - before == 2, "not captured while someone else captures the stream");
  own_stream = true;

  /* one key size a cache: another size runs directly */
  before = direct_issues;
  int32_t small = 3;
  lutra_call_graphs_run(&mine, LUTRA_CALLS_GEMM, &small, sizeof small, CALLER, issue,
                        &(test_key){11, 1, CALLER}, "check");
  check(direct_issues - before == 1, "a key of another size runs directly");

  /* freeing a cache destroys its graphs */
  lutra_call_graphs_free(cache);
  lutra_call_graphs_free(other);
  lutra_call_graphs_free(mine);
  lutra_call_graphs_stats(LUTRA_CALLS_KERNEL, &graphs, &served);
  int64_t gemm_graphs, gemm_served;
  lutra_call_graphs_stats(LUTRA_CALLS_GEMM, &gemm_graphs, &gemm_served);
  check(graphs_alive == 0 && graphs == 0 && gemm_graphs == 0,
        "freed caches destroy their graphs; the statistics follow");
  printf("%d failures\n", failures);
  return failures ? 1 : 0;
}
