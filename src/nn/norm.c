/* LayerNorm and RMSNorm over the last dim (TransformerEngine's LayerNorm / RMSNorm), one module
 * for both kinds: weight (and, for LayerNorm, bias) [hidden] in the module's dtype, the input of
 * that dtype. The module is the norm core (nn/norm_core.h) alone: the forward keeps the row
 * statistics (mean, rstd; f32 [rows]) and holds its input until the next forward for the
 * backward; a grad = false forward keeps nothing. Owned output, statistics and gradient buffers
 * are kept per input shape. */
#include "core/dtype.h"
#include "core/error.h"
#include "core/object.h"
#include "nn/export_view.h"
#include "nn/module.h"
#include "nn/norm_core.h"
#include "runtime/tensor.h"

#include <stdlib.h>

typedef struct norm {
  lutra_module base;
  lutra_norm_core core;
} norm;

static const char *fwd_name(const norm *n) {
  return n->core.d.rms ? "lutra_rmsnorm_forward" : "lutra_layernorm_forward";
}
static const char *bwd_name(const norm *n) {
  return n->core.d.rms ? "lutra_rmsnorm_backward" : "lutra_layernorm_backward";
}

static int norm_forward(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *a,
                        lutra_tensor **y) {
  norm *n = (norm *)m;
  TRY(lutra_norm_core_run(&n->core, x, a->grad != 0, fwd_name(n)));
  *y = n->core.y;
  return LUTRA_OK;
}

static int norm_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  norm *n = (norm *)m;
  lutra_norm_core *c = &n->core;
  const char *fn = bwd_name(n);
  TRY(lutra_norm_core_check_saved(c, fn));
  CHECK_ARG(dy->dtype == c->d.dtype, "grad_output dtype %s does not match the module's %s",
            lutra_dtype_name(dy->dtype), lutra_dtype_name(c->d.dtype));
  CHECK_ARG(lutra_same_shape(dy, c->y), "grad_output shape does not match the forward output");
  CHECK_ARG(dy->device == c->d.device, "grad_output is on another device than the module");
  return lutra_norm_core_backward(c, dy, dx, fn);
}

static int norm_num_params(const lutra_module *m) {
  return lutra_norm_core_num_params(&((const norm *)m)->core);
}

static int norm_param(const lutra_module *m, int i, lutra_param *out) {
  lutra_norm_core_param(&((const norm *)m)->core, i, out);
  return LUTRA_OK;
}

static void norm_release(lutra_module *m) {
  lutra_norm_core_release(&((norm *)m)->core);
}

/* A Residual around the norm: its backward's sum (dx + dy) made by the norm's backward kernel
 * (the core's dx_add), in f32 and rounded once; the forward's x + y stays the Residual's
 * element-wise sum, the forward kernel taking no addend. */
static bool norm_arm_residual(lutra_module *m, int pass, const lutra_tensor *r, lutra_tensor *out) {
  if (pass != LUTRA_PASS_BACKWARD) return false;
  lutra_norm_core *c = &((norm *)m)->core;
  c->residual = r;
  c->residual_out = out;
  return true;
}
static const lutra_fusion_ops norm_fusion = {.activation = LUTRA_ACT_NONE,
                                             .arm_residual = norm_arm_residual};

/* a leaf: "weight" (gamma) and, for LayerNorm, "bias" (beta), as torch names them; no FP8 */
static const lutra_checkpoint_ops norm_checkpoint = {0};

/* the two kinds differ in their name only */
#define NORM_OPS(kind_name)                                                                        \
  {                                                                                                \
    .kind = kind_name, .forward = norm_forward, .backward = norm_backward,                         \
    .num_params = norm_num_params, .param = norm_param, .release = norm_release,                   \
    .checkpoint = &norm_checkpoint, .fusion = &norm_fusion,                                        \
  }
static const lutra_module_ops layernorm_ops = NORM_OPS("layernorm");
static const lutra_module_ops rmsnorm_ops = NORM_OPS("rmsnorm");

void lutra_norm_defaults(lutra_norm_desc *d) {
  if (!d) return;
  *d = (lutra_norm_desc){.eps = 1e-5f, .dtype = LUTRA_F32, .device = LUTRA_CPU};
}

int lutra_layernorm_new(const lutra_norm_desc *d, lutra_module **out) {
  static const char fn[] = "lutra_layernorm_new";
  CHECK_ARG(d, "desc is NULL");
  CHECK_ARG(out, "out is NULL");
  norm *n = calloc(1, sizeof *n);
  if (!n) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  int st = lutra_norm_core_init(&n->core, d, fn);
  if (st != LUTRA_OK) {
    free(n);
    return st;
  }
  lutra_module_init(&n->base, n->core.d.rms ? &rmsnorm_ops : &layernorm_ops);
  *out = &n->base;
  return LUTRA_OK;
}

bool lutra_norm_view(const lutra_module *m, lutra_norm_desc *out) {
  if (m->ops != &layernorm_ops && m->ops != &rmsnorm_ops) return false;
  *out = ((const norm *)m)->core.d;
  return true;
}
