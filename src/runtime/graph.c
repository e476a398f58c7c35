/* CUDA graphs of whole training steps.
 *
 * lutra_graph_begin starts a stream capture of lutra's CUDA stream; everything the thread then
 * issues (quantizations, GEMMs, losses, optimizer steps, the delayed-scaling update at autocast
 * exit) is recorded instead of run, and lutra_graph_end instantiates it. A replay is one
 * cudaGraphLaunch, whatever the depth of the model.
 *
 * A graph holds device addresses, not tensors: the buffers a step uses must stay allocated and
 * keep their shapes while the graph is replayed (lutra reuses module, quantizer and workspace
 * buffers while shapes stay, so a step run once eagerly before capture has them all). New
 * inputs are copied into the captured input tensors between replays. What a graph cannot hold
 * is refused while capturing, with an error, instead of making a graph that replays something
 * else: allocations (first use of a shape, a shape change), host transfers and synchronizations
 * (reading a loss value), and any work on the cpu device. After such an error the capture is
 * over: lutra_graph_abort (or the Lua wrapper) discards it.
 *
 * Because the graph holds addresses, it also holds what owns them: every module, loss and
 * tensor a captured call was handed or returned (core/capture.h). The garbage collector cannot
 * free them while the graph lives, and a replay after one was freed explicitly (or replaced by
 * its owner) is refused instead of writing into freed memory. */
#include "backend/backend.h"
#include "backend/device.h"
#include "core/capture.h"
#include "core/error.h"
#include "core/object.h"
#include "core/trace.h"
#include "runtime/tensor.h"

#ifdef LUTRA_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

#include <stdlib.h>

typedef struct held {
  void *p;
  lutra_capture_release release; /* NULL: p is a tensor */
} held;

typedef struct held_list {
  held *items;
  int n, cap;
} held_list;

struct lutra_graph {
  lutra_object obj;
  const lutra_backend *be;
  void *exec;
  int64_t nodes;
  int64_t replays;
  held_list held;
};

static _Thread_local const lutra_backend *capturing;
static _Thread_local held_list capture_held;

static void drop_held(held_list *l) {
  for (int i = 0; i < l->n; i++) {
    void *p = l->items[i].p;
    if (!l->items[i].release) {
      lutra_tensor_drop_ref(p);
      continue;
    }
    ((lutra_object *)p)->holds--;
    l->items[i].release(p); /* drops the graph's reference; frees the object if it was the last */
  }
  free(l->items);
  *l = (held_list){0};
}

static int hold(void *p, lutra_capture_release release, const char *fn) {
  held_list *l = &capture_held;
  /* a step passes the same objects again and again: the recent ones are enough to dedupe */
  for (int i = l->n - 1; i >= 0 && i >= l->n - 8; i--)
    if (l->items[i].p == p) return LUTRA_OK;
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 32;
    held *items = realloc(l->items, (size_t)cap * sizeof *items);
    if (!items) return lutra_error(LUTRA_ENOMEM, fn, "cannot record what the graph uses");
    l->items = items;
    l->cap = cap;
  }
  if (!release) {
    lutra_tensor_take_ref(p);
  } else {
    lutra_object *o = p;
    o->refs++;
    o->holds++;
  }
  l->items[l->n++] = (held){p, release};
  return LUTRA_OK;
}

int lutra_capture_hold_tensor(const lutra_tensor *t, const char *fn) {
  return hold((void *)t, NULL, fn);
}

int lutra_capture_hold_object(void *object, lutra_capture_release release, const char *fn) {
  if (!release) return lutra_error(LUTRA_EINVAL, fn, "a held object needs its release function");
  return hold(object, release, fn);
}

static int check_held(const held_list *l, const char *fn) {
  for (int i = 0; i < l->n; i++) {
    const held *h = &l->items[i];
    if (!h->release) {
      const lutra_tensor *t = h->p;
      CHECK_STATE(!(t->flags & LUTRA_TENSOR_FREED),
                  "a tensor this graph uses was freed (or replaced by its module, e.g. by a "
                  "forward with a new shape) after the capture: capture the graph again");
    } else {
      const lutra_object *o = h->p;
      CHECK_STATE(!(o->flags & LUTRA_OBJ_FREED),
                  "a %s this graph uses was freed after the capture: capture the graph again",
                  o->magic == LUTRA_MAGIC_MODULE         ? "module"
                  : o->magic == LUTRA_MAGIC_LOSS         ? "loss"
                  : o->magic == LUTRA_MAGIC_MOE_ROUTER   ? "MoE router"
                  : o->magic == LUTRA_MAGIC_MOE_DISPATCH ? "MoE dispatcher"
                                                         : "quantizer");
    }
  }
  return LUTRA_OK;
}

int lutra_graph_begin(int device) {
  static const char fn[] = "lutra_graph_begin";
  CHECK_STATE(!lutra_capture_active, "a capture is already in progress on this thread");
  const lutra_backend *be;
  TRY(lutra_backend_get(device, &be, fn));
  CHECK_ARG(be->capture_begin, "CUDA graphs need the cuda device, not %s", be->name);
  TRY(be->capture_begin());
  capturing = be;
  lutra_capture_active = true;
  __atomic_add_fetch(&lutra_capture_threads, 1, __ATOMIC_RELAXED);
  return LUTRA_OK;
}

int lutra_graph_abort(void) {
  if (!lutra_capture_active) return LUTRA_OK;
  lutra_capture_active = false;
  __atomic_sub_fetch(&lutra_capture_threads, 1, __ATOMIC_RELAXED);
  capturing->capture_abort();
  capturing = NULL;
  drop_held(&capture_held);
  return LUTRA_OK;
}

int lutra_graph_end(lutra_graph **out) {
  static const char fn[] = "lutra_graph_end";
  CHECK_STATE(lutra_capture_active, "no capture is in progress on this thread");
  if (!out) {
    lutra_graph_abort();
    return lutra_error(LUTRA_EINVAL, fn, "out is NULL (the capture was discarded)");
  }
  const lutra_backend *be = capturing;
  lutra_capture_active = false;
  __atomic_sub_fetch(&lutra_capture_threads, 1, __ATOMIC_RELAXED);
  capturing = NULL;
  void *exec = NULL;
  int64_t nodes = 0;
  int st = be->capture_end(&exec, &nodes);
  if (st != LUTRA_OK) {
    drop_held(&capture_held);
    return st;
  }
  lutra_graph *g = calloc(1, sizeof *g);
  if (!g) {
    be->graph_destroy(exec);
    drop_held(&capture_held);
    return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a graph");
  }
  g->held = capture_held;
  capture_held = (held_list){0};
  g->obj.magic = LUTRA_MAGIC_GRAPH;
  g->obj.refs = 1;
  g->be = be;
  g->exec = exec;
  g->nodes = nodes;
  *out = g;
  return LUTRA_OK;
}

int lutra_graph_replay(lutra_graph *g) {
  static const char fn[] = "lutra_graph_replay";
  TRY(lutra_check_object(g, LUTRA_MAGIC_GRAPH, fn, "graph"));
  CHECK_STATE(!lutra_capture_active, "cannot replay a graph while capturing one");
  TRY(check_held(&g->held, fn));
  RANGE_PUSH("lutra.graph.replay");
  int st = g->be->graph_launch(g->exec);
  RANGE_POP();
  if (st == LUTRA_OK) g->replays++;
  return st;
}

int lutra_graph_info(const lutra_graph *g, int64_t *nodes, int64_t *replays) {
  static const char fn[] = "lutra_graph_info";
  TRY(lutra_check_object(g, LUTRA_MAGIC_GRAPH, fn, "graph"));
  CHECK_ARG(nodes && replays, "output pointers must not be NULL");
  *nodes = g->nodes;
  *replays = g->replays;
  return LUTRA_OK;
}

int lutra_graph_capturing(void) {
  return lutra_capture_active;
}

/* The kernel launchers' graphs are the CUDA backend's (backend/cuda/call_graphs.c); zero
 * elsewhere. */
int lutra_launch_graph_stats(int64_t *graphs, int64_t *launches) {
  static const char fn[] = "lutra_launch_graph_stats";
  CHECK_ARG(graphs && launches, "output pointers must not be NULL");
  *graphs = *launches = 0;
#ifdef LUTRA_WITH_CUDA
  lutra_call_graphs_stats(LUTRA_CALLS_KERNEL, graphs, launches);
#endif
  return LUTRA_OK;
}

int lutra_graph_destroy(lutra_graph *g) {
  static const char fn[] = "lutra_graph_destroy";
  TRY(lutra_check_object(g, LUTRA_MAGIC_GRAPH, fn, "graph"));
  g->be->graph_destroy(g->exec);
  g->exec = NULL;
  drop_held(&g->held);
  g->obj.flags |= LUTRA_OBJ_FREED;
  return LUTRA_OK;
}

int lutra_graph_unref(lutra_graph *g) {
  if (!g) return LUTRA_OK;
  if (!(g->obj.flags & LUTRA_OBJ_FREED)) {
    g->be->graph_destroy(g->exec);
    drop_held(&g->held);
  }
  free(g);
  return LUTRA_OK;
}
