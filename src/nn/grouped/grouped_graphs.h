/* The per-expert path's graph cache (nn/grouped/grouped_graphs.c): one graph per host split pattern
 * and pass, a bounded least-recently-used set per module. */
#ifndef LUTRA_NN_GROUPED_GRAPHS_H
#define LUTRA_NN_GROUPED_GRAPHS_H

#include <stdint.h>

struct grouped_linear;
typedef struct grouped_graphs grouped_graphs;

enum { LUTRA_GG_FORWARD = 0, LUTRA_GG_BACKWARD = 1, LUTRA_GG_BACKWARD_DX = 2 };
enum { LUTRA_GG_PTRS = 3, LUTRA_GG_DEFAULT_CAPACITY = 16, LUTRA_GG_MAX_CAPACITY = 4096 };

/* Runs issue(g, ctx, fn), the pass's launches for g->splits_host: directly, or through the graph
 * cached for this pattern, pass and buffers (ptrs: the pass's token buffers; the workspace is
 * added here). */
int lutra_grouped_graphs_run(struct grouped_linear *g, int pass, const void *const *ptrs,
                             int (*issue)(struct grouped_linear *g, void *ctx, const char *fn),
                             void *ctx, const char *fn);
void lutra_grouped_graphs_free(grouped_graphs *c);

#endif
