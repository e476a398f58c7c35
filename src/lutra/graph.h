/* lutra/graph.h: CUDA graphs of whole steps.
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_GRAPH_H
#define LUTRA_GRAPH_H

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- CUDA graphs --------------------------------------------------------------------------- */
/* Capture everything this thread issues on lutra's CUDA stream between begin and end into one
 * graph; lutra_graph_replay runs it again with one launch. Run the step once eagerly first: a
 * capture refuses (with an error, ending nothing) allocations (first use of a shape, a shape
 * change), host transfers and synchronizations (e.g. reading a loss), and cpu-device work; after
 * an error inside a capture call lutra_graph_abort. Frees during a capture are deferred to its end.
 * The graph holds the device addresses of the buffers the step used: keep those tensors, modules,
 * quantizers and optimizers alive and their shapes unchanged while replaying; copy new inputs into
 * the captured input tensors. */
typedef struct lutra_graph lutra_graph;
LUTRA_API int lutra_graph_begin(int device);
LUTRA_API int lutra_graph_end(lutra_graph **out);
/* Ends a capture in progress and discards it (no-op when none is). */
LUTRA_API int lutra_graph_abort(void);
LUTRA_API int lutra_graph_capturing(void);
LUTRA_API int lutra_graph_replay(lutra_graph *g);
/* nodes: kernels, copies and memsets in the graph; replays: lutra_graph_replay calls so far */
LUTRA_API int lutra_graph_info(const lutra_graph *g, int64_t *nodes, int64_t *replays);
LUTRA_API int lutra_graph_unref(lutra_graph *g);
LUTRA_API int lutra_graph_destroy(lutra_graph *g);
/* Eager cuda kernel launches replayed as CUDA graphs, as lutra_gemm_graph_stats says of GEMMs
 * (lutra/gemm.h): a launcher's call (a norm, a cast, an activation, a loss...) seen again with
 * the same arguments on the same stream runs as a cudaGraphLaunch of its captured launches,
 * with the same results (src/backend/cuda/call_graphs.c; LUTRA_LAUNCH_GRAPHS=0 at load turns it
 * off). graphs: cached now; launches: calls served so far. */
LUTRA_API int lutra_launch_graph_stats(int64_t *graphs, int64_t *launches);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_GRAPH_H */
