/* The module protocol (nn/module.c) and the fusions Sequential runs. */
#ifndef LUTRA_NN_MODULE_H
#define LUTRA_NN_MODULE_H

#include "core/object.h"
#include "lutra.h"

#include <stdbool.h>

/* Modules: a small vtable, as torch/nn modules have. */
typedef struct lutra_module_ops {
  const char *kind;
  int (*forward)(lutra_module *m, const lutra_tensor *x, int first_microbatch, lutra_tensor **y);
  int (*backward)(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx);
  int (*num_params)(const lutra_module *m);
  int (*param)(const lutra_module *m, int i, lutra_param *out);
  void (*release)(lutra_module *m); /* frees buffers and child references */
} lutra_module_ops;

struct lutra_module {
  lutra_object obj;
  const lutra_module_ops *ops;
};
void lutra_module_retain(lutra_module *m);

/* Linear + GELU fused by Sequential (src/nn/sequential.c):
 * - forward with the GELU in the GEMM epilogue (GELU_AUX): *y = gelu(x W^T + b), *pre = the
 *   pre-activation (owned by the Linear), which the GELU module then adopts as its input;
 * - backward of the Linear after that GELU with gelu'(pre) in its dgrad GEMM (DGELU): *dx is
 *   the gradient of the GELU's input and the GELU's own backward is skipped; *fused is false
 *   (and *dx the plain dgrad) where the dgrad GEMM cannot take it (FP8 operands). */
int lutra_linear_forward_gelu(lutra_module *m, const lutra_tensor *x, int first_microbatch,
                              lutra_tensor **y, lutra_tensor **pre);
int lutra_linear_backward_dgelu(lutra_module *m, const lutra_tensor *dy, const lutra_tensor *pre,
                                lutra_tensor **dx, bool *fused);
/* - backward of the Linear whose last forward ran with the GELU, from dy = the gradient of the
 *   GELU's output: gelu' is applied inside the grad_output cast (dgelu + cast + dbias in one
 *   pass, TransformerEngine's fused dact), and the GELU's own backward is skipped; only where
 *   lutra_linear_takes_gelu_grad (FP8 backward with delayed scaling and a columnwise copy). */
bool lutra_linear_takes_gelu_grad(const lutra_module *m);
int lutra_linear_backward_gelu(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx);
bool lutra_module_is_linear(const lutra_module *m);
bool lutra_module_is_gelu(const lutra_module *m);
/* the GELU's forward happened inside the GEMM before it: x = pre-activation, y = its output */
void lutra_gelu_adopt(lutra_module *m, const lutra_tensor *x, const lutra_tensor *y);

#endif
