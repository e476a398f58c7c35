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
 * over: lutra_graph_abort (or the Lua wrapper) discards it. */
#include "backend/backend.h"
#include "backend/device.h"
#include "core/capture.h"
#include "core/error.h"
#include "core/object.h"
#include "core/trace.h"

#include <stdlib.h>

struct lutra_graph {
  lutra_object obj;
  const lutra_backend *be;
  void *exec;
  int64_t nodes;
  int64_t replays;
};

static _Thread_local const lutra_backend *capturing;

int lutra_graph_begin(int device) {
  static const char fn[] = "lutra_graph_begin";
  CHECK_STATE(!lutra_capture_active, "a capture is already in progress on this thread");
  const lutra_backend *be;
  TRY(lutra_backend_get(device, &be, fn));
  CHECK_ARG(be->capture_begin, "CUDA graphs need the cuda device, not %s", be->name);
  TRY(be->capture_begin());
  capturing = be;
  lutra_capture_active = true;
  return LUTRA_OK;
}

int lutra_graph_abort(void) {
  if (!lutra_capture_active) return LUTRA_OK;
  lutra_capture_active = false;
  capturing->capture_abort();
  capturing = NULL;
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
  capturing = NULL;
  void *exec = NULL;
  int64_t nodes = 0;
  TRY(be->capture_end(&exec, &nodes));
  lutra_graph *g = calloc(1, sizeof *g);
  if (!g) {
    be->graph_destroy(exec);
    return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a graph");
  }
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

int lutra_graph_release(lutra_graph *g) {
  static const char fn[] = "lutra_graph_release";
  TRY(lutra_check_object(g, LUTRA_MAGIC_GRAPH, fn, "graph"));
  g->be->graph_destroy(g->exec);
  g->exec = NULL;
  g->obj.flags |= LUTRA_OBJ_FREED;
  return LUTRA_OK;
}

int lutra_graph_free(lutra_graph *g) {
  if (!g) return LUTRA_OK;
  if (!(g->obj.flags & LUTRA_OBJ_FREED)) g->be->graph_destroy(g->exec);
  free(g);
  return LUTRA_OK;
}
