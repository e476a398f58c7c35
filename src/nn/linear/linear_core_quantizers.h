/* The Linear core's quantizers (nn/linear/linear_core_quantizers.c): built for a recipe's specs,
 * installed once all exist, and shown to checkpoints (which may build them for a recipe before
 * the load that installs them). */
#ifndef LUTRA_NN_LINEAR_CORE_QUANTIZERS_H
#define LUTRA_NN_LINEAR_CORE_QUANTIZERS_H

#include "nn/linear/linear_core_state.h"

/* Quantizers for the specs roles, not installed yet: fresh[] the rowwise (or only) one of each
 * role, fresh_col[] a hybrid role's columnwise one; install replaces the core's (freeing them)
 * and forgets its cached FP8 operands. */
int lutra_linear_core_build_quantizers(const lutra_linear_core *c,
                                       const lutra_quantizer_spec *roles,
                                       lutra_quantizer *fresh[LUTRA_NUM_ROLES],
                                       lutra_quantizer *fresh_col[LUTRA_NUM_ROLES], const char *fn);
void lutra_linear_core_install_quantizers(lutra_linear_core *c, const lutra_recipe *r,
                                          lutra_quantizer *fresh[LUTRA_NUM_ROLES],
                                          lutra_quantizer *fresh_col[LUTRA_NUM_ROLES]);
void lutra_linear_core_free_quantizers(lutra_quantizer *q[LUTRA_NUM_ROLES]);

/* Checkpoints (lutra_checkpoint_ops.quantizers): the core's quantizers appended to out, role i
 * named names[i] (NULL: "input", "weight", "grad_output"), slot = role; a hybrid role's
 * columnwise quantizer follows as "<role>_columnwise", slot LUTRA_NUM_ROLES + role (refused
 * with names). With build_for and none built yet, fresh ones for it (a factory recipe: the
 * module's choice, which its first forward made), not installed (out->fresh) until adopt. */
struct lutra_module_quantizers;
int lutra_linear_core_quantizers(lutra_linear_core *c, const lutra_recipe *build_for,
                                 const char *const *names, struct lutra_module_quantizers *out,
                                 const char *fn);
void lutra_linear_core_adopt_quantizers(lutra_linear_core *c, const lutra_recipe *r,
                                        const struct lutra_module_quantizers *q);

#endif
