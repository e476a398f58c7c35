/* GroupedLinear in checkpoints (nn/grouped/grouped_checkpoint.c): the names "weight0"..
 * "bias<num-1>" ([num * per], made at construction) and the checkpoint entry of the module's
 * ops. */
#ifndef LUTRA_NN_GROUPED_CHECKPOINT_H
#define LUTRA_NN_GROUPED_CHECKPOINT_H

#include "nn/grouped/grouped_core.h"

int lutra_grouped_param_names(grouped_linear *g, const char *fn);
extern const lutra_checkpoint_ops lutra_grouped_checkpoint;

#endif
