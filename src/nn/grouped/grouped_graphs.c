/* GroupedLinear's per-expert path replayed as one graph per host split pattern (the second path
 * of issue 13: per-expert cuBLASLt plans issued in one go). A pass of num_gemms GEMMs costs the
 * host num_gemms cuBLASLt calls; routing repeats often enough (inference batches, balanced or
 * capacity-limited routers, evaluation) that a pattern seen before is worth one graph launch.
 *
 * The key is everything a captured pass bakes into its kernels: the pass, the splits, the token
 * buffers (x, y, dy, dx: inputs may move between calls, the module's own outputs move when
 * their shape changes) and the stream's GEMM workspace (it moves when it grows, and differs per
 * stream). The weights, biases and gradients are the module's own for its life. As for the
 * one-GEMM graphs of call_graphs.c: the first sighting of a key runs directly (plans made,
 * kernels loaded, which a capture must not do), the second is captured (lutra_graph_begin/end
 * on the module's device, so everything that refuses inside a capture refuses here too, and
 * the one-GEMM graphs run their calls directly into this one) and then launched, later ones are
 * launched. A capture that fails (a plan evicted since the first sighting meets a shape that a
 * capture cannot plan, say) is discarded and the pass runs directly; the key is marked and not
 * captured again. At capacity the least recently used key gives way; destroying its graph is
 * safe while a launch of it still runs (CUDA frees it when that completes).
 *
 * Cost per call: a hash of the splits and a scan of at most capacity keys (16 by default); no
 * allocation after the cache's first use. */
#include "nn/grouped/grouped_graphs.h"
#include "core/capture.h"
#include "core/error.h"
#include "core/object.h"
#include "nn/grouped/grouped_core.h"

#include <stdlib.h>
#include <string.h>

enum { KEY_PTRS = LUTRA_GG_PTRS + 1 }; /* + the workspace */

typedef struct entry {
  uint64_t hash, used;
  int32_t pass;
  bool broken; /* its capture failed: always direct */
  bool live;
  const void *ptrs[KEY_PTRS];
  int32_t *splits;    /* [num], in the cache's one array */
  lutra_graph *graph; /* NULL: seen once */
} entry;

struct grouped_graphs {
  int capacity, count, num;
  uint64_t clock;
  entry *entries;
  int32_t *splits; /* [capacity * num] */
  int64_t captures, replays, direct, evictions;
};

static void drop(entry *e) {
  if (e->graph) lutra_graph_unref(e->graph);
  e->graph = NULL;
  e->live = false;
}

void lutra_grouped_graphs_free(grouped_graphs *c) {
  if (!c) return;
  for (int i = 0; i < c->capacity; i++)
    if (c->entries[i].live) drop(&c->entries[i]);
  free(c->entries);
  free(c->splits);
  free(c);
}

static int make(int capacity, int num, grouped_graphs **out, const char *fn) {
  grouped_graphs *c = calloc(1, sizeof *c);
  if (c && capacity > 0) {
    c->entries = calloc((size_t)capacity, sizeof *c->entries);
    c->splits = calloc((size_t)capacity * (size_t)num, sizeof *c->splits);
  }
  if (!c || (capacity > 0 && (!c->entries || !c->splits))) {
    lutra_grouped_graphs_free(c);
    return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate the split-pattern graph cache");
  }
  c->capacity = capacity;
  c->num = num;
  for (int i = 0; i < capacity; i++)
    c->entries[i].splits = c->splits + (size_t)i * (size_t)num;
  *out = c;
  return LUTRA_OK;
}

static uint64_t hash_of(int pass, const int32_t *splits, int num, const void *const *ptrs) {
  uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)pass;
  for (int e = 0; e < num; e++)
    h = (h ^ (uint32_t)splits[e]) * 0x100000001b3ull;
  for (int i = 0; i < KEY_PTRS; i++)
    h = (h ^ (uint64_t)(uintptr_t)ptrs[i]) * 0x100000001b3ull;
  return h ^ (h >> 29);
}

static entry *find(grouped_graphs *c, uint64_t h, int pass, const int32_t *splits,
                   const void *const *ptrs) {
  for (int i = 0; i < c->capacity; i++) {
    entry *e = &c->entries[i];
    if (!e->live || e->hash != h || e->pass != pass) continue;
    if (memcmp(e->ptrs, ptrs, sizeof e->ptrs) != 0) continue;
    if (memcmp(e->splits, splits, (size_t)c->num * sizeof *splits) != 0) continue;
    return e;
  }
  return NULL;
}

/* a free slot, or the least recently used one emptied */
static entry *slot_for(grouped_graphs *c) {
  entry *lru = NULL;
  for (int i = 0; i < c->capacity; i++) {
    entry *e = &c->entries[i];
    if (!e->live) return e;
    if (!lru || e->used < lru->used) lru = e;
  }
  drop(lru);
  c->count--;
  c->evictions++;
  return lru;
}

static int workspace_of(const grouped_linear *g, const void **ws) {
  *ws = NULL;
  if (!g->be->gemm_workspace) return LUTRA_OK;
  void *p = NULL;
  size_t have = 0;
  TRY(g->be->gemm_workspace(0, &p, &have));
  *ws = p;
  return LUTRA_OK;
}

/* the second sighting: capture the pass, then launch it (the captured work did not run) */
static int capture(grouped_linear *g, entry *e,
                   int (*issue)(grouped_linear *, void *, const char *), void *ctx,
                   const char *fn) {
  lutra_graph *graph = NULL;
  int st = lutra_graph_begin(g->device);
  if (st == LUTRA_OK) {
    st = issue(g, ctx, fn);
    if (st == LUTRA_OK)
      st = lutra_graph_end(&graph);
    else
      lutra_graph_abort();
  }
  if (st != LUTRA_OK || !graph) {
    e->broken = true;
    g->graphs->direct++;
    return issue(g, ctx, fn);
  }
  e->graph = graph;
  g->graphs->captures++;
  g->graphs->replays++;
  return lutra_graph_replay(graph);
}

int lutra_grouped_graphs_run(grouped_linear *g, int pass, const void *const *ptrs,
                             int (*issue)(grouped_linear *, void *, const char *), void *ctx,
                             const char *fn) {
  if (LUTRA_CAPTURING()) return issue(g, ctx, fn); /* the caller's capture records it */
  if (!g->graphs) TRY(make(LUTRA_GG_DEFAULT_CAPACITY, g->num, &g->graphs, fn));
  grouped_graphs *c = g->graphs;
  if (c->capacity == 0) {
    c->direct++;
    return issue(g, ctx, fn);
  }
  const void *key[KEY_PTRS];
  memcpy(key, ptrs, LUTRA_GG_PTRS * sizeof *key);
  TRY(workspace_of(g, &key[LUTRA_GG_PTRS]));
  const uint64_t h = hash_of(pass, g->splits_host, g->num, key);
  entry *e = find(c, h, pass, g->splits_host, key);
  if (e) {
    e->used = ++c->clock;
    if (e->graph) {
      c->replays++;
      return lutra_graph_replay(e->graph);
    }
    if (!e->broken && g->be->capture_begin) return capture(g, e, issue, ctx, fn);
    c->direct++;
    return issue(g, ctx, fn);
  }
  e = slot_for(c);
  *e = (entry){.hash = h, .used = ++c->clock, .pass = pass, .live = true, .splits = e->splits};
  memcpy(e->ptrs, key, sizeof e->ptrs);
  memcpy(e->splits, g->splits_host, (size_t)c->num * sizeof *e->splits);
  c->count++;
  c->direct++;
  return issue(g, ctx, fn);
}

/* ---- public ---------------------------------------------------------------------------------- */

static int grouped_of(const lutra_module *m, grouped_linear **g, const char *fn) {
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(strcmp(m->ops->kind, "grouped_linear") == 0, "module is a %s, not a grouped_linear",
            m->ops->kind);
  *g = (grouped_linear *)m;
  return LUTRA_OK;
}

int lutra_grouped_set_graph_capacity(lutra_module *m, int capacity) {
  static const char fn[] = "lutra_grouped_set_graph_capacity";
  grouped_linear *g;
  TRY(grouped_of(m, &g, fn));
  CHECK_ARG(capacity >= 0 && capacity <= LUTRA_GG_MAX_CAPACITY,
            "capacity must be in 0..%d (got %d)", LUTRA_GG_MAX_CAPACITY, capacity);
  CHECK_STATE(!LUTRA_CAPTURING(), "the graph cache cannot change while capturing a CUDA graph");
  grouped_graphs *fresh;
  TRY(make(capacity, g->num, &fresh, fn));
  if (g->graphs) { /* the counters carry over */
    fresh->captures = g->graphs->captures;
    fresh->replays = g->graphs->replays;
    fresh->direct = g->graphs->direct;
    fresh->evictions = g->graphs->evictions;
  }
  lutra_grouped_graphs_free(g->graphs);
  g->graphs = fresh;
  return LUTRA_OK;
}

int lutra_grouped_graph_stats_get(const lutra_module *m, lutra_grouped_graph_stats *out) {
  static const char fn[] = "lutra_grouped_graph_stats_get";
  grouped_linear *g;
  TRY(grouped_of(m, &g, fn));
  CHECK_ARG(out, "out is NULL");
  const grouped_graphs *c = g->graphs;
  *out = (lutra_grouped_graph_stats){.capacity = c ? c->capacity : LUTRA_GG_DEFAULT_CAPACITY};
  if (!c) return LUTRA_OK;
  out->entries = c->count;
  out->captures = c->captures;
  out->replays = c->replays;
  out->direct = c->direct;
  out->evictions = c->evictions;
  return LUTRA_OK;
}
