/* GroupedLinear's FP8 passes (nn/grouped/grouped_fp8.c), called by its module code. act NULL: no
 * activation in the input (forward) or grad_output (backward) cast; with one, the forward's x is
 * the activation's output (its shape; its data need not be written). Errors name fn. */
#ifndef LUTRA_NN_GROUPED_FP8_H
#define LUTRA_NN_GROUPED_FP8_H

#include "nn/grouped/grouped_core.h"

int lutra_grouped_fp8_forward(grouped_linear *g, const lutra_tensor *x, const lutra_recipe *r,
                              int first_microbatch, const grouped_act *act, const char *fn);
int lutra_grouped_fp8_backward(grouped_linear *g, const lutra_tensor *dy, bool dx_wanted,
                               const grouped_act *act, const char *fn);
/* whether a recipe role's grouped cast can form an activation (per-tensor scaling) */
bool lutra_grouped_cast_takes_act(const lutra_quantizer_spec *s);
int lutra_grouped_observe(grouped_linear *g, const lutra_tensor *x, const lutra_recipe *r,
                          const char *fn);
bool lutra_grouped_uses_delayed(const lutra_recipe *r);
void lutra_grouped_fp8_release(grouped_linear *g);

#endif
