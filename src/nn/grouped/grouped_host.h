/* GroupedLinear's per-expert path (nn/grouped/grouped_host.c): one GEMM per expert, for splits
 * the host knows (splits_host holds them), replayed through the graph cache of grouped_graphs.c.
 * Errors name fn. */
#ifndef LUTRA_NN_GROUPED_HOST_H
#define LUTRA_NN_GROUPED_HOST_H

#include "nn/grouped/grouped_core.h"

int lutra_grouped_host_forward(grouped_linear *g, const lutra_tensor *x, const char *fn);
int lutra_grouped_host_backward(grouped_linear *g, const lutra_tensor *dy, bool dx_wanted,
                                const char *fn);

#endif
