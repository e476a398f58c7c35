/* lutra/grouped_graphs.h: a GroupedLinear's per-expert GEMMs replayed as one graph per host
 * split pattern. Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_GROUPED_GRAPHS_H
#define LUTRA_GROUPED_GRAPHS_H

#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The per-expert path (lutra_grouped_set_path PER_EXPERT, and f32 modules on cuda) issues one
 * GEMM per expert and pass. On a device with graphs, each pass of a host split pattern seen
 * before (with the same buffers: input, output, gradients, workspace) is captured the second
 * time it comes and replayed from then on: one launch instead of num_gemms. The first sighting
 * runs directly, so a pattern that never returns costs no capture. A module keeps at most
 * capacity patterns and passes (default 16), the least recently used one giving way (its graph
 * is destroyed; one still running completes). Inside a capture of the caller's own (whose host
 * splits are refused anyway) nothing is cached. On the CPU the patterns are tracked alike but
 * always run directly (no graphs). */
typedef struct lutra_grouped_graph_stats {
  int32_t entries;   /* patterns held now */
  int32_t capacity;  /* most held; 0: the cache is off */
  int64_t captures;  /* graphs captured */
  int64_t replays;   /* passes run as a graph launch */
  int64_t direct;    /* passes run directly (first sightings, no graphs, failed captures) */
  int64_t evictions; /* patterns dropped for a new one */
} lutra_grouped_graph_stats;

/* capacity 0 turns the cache off (and frees what it holds); at most 4096 */
LUTRA_API int lutra_grouped_set_graph_capacity(lutra_module *m, int capacity);
LUTRA_API int lutra_grouped_graph_stats_get(const lutra_module *m, lutra_grouped_graph_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_GROUPED_GRAPHS_H */
