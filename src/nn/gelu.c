/* GELU (tanh approximation, as TransformerEngine's "gelu"). */
#include "backend/backend.h"
#include "backend/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/object.h"
#include "nn/module.h"
#include "runtime/tensor.h"

#include <stdlib.h>

typedef struct gelu {
  lutra_module base;
  /* held (lutra_tensor_hold) until the next forward: the backward reads them */
  const lutra_tensor *x;
  const lutra_tensor *out; /* the last forward's output: y, or one adopted from a fused GEMM */
  lutra_tensor *y, *dx;
} gelu;

static int gelu_forward(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *a,
                        lutra_tensor **y) {
  static const char fn[] = "lutra_gelu_forward";
  (void)a;
  gelu *g = (gelu *)m;
  CHECK_ARG(lutra_dtype_is_float(x->dtype), "input dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(x->dtype));
  const lutra_backend *be;
  TRY(lutra_backend_get(x->device, &be, fn));
  TRY(lutra_tensor_ensure(&g->y, PLAIN_TENSOR(x->dtype, x->ndim, x->shape, x->device), fn));
  TRY(be->activation_forward(&(lutra_act_args){.x = x->data,
                                               .out = g->y->data,
                                               .dtype = x->dtype,
                                               .act = LUTRA_ACT_GELU_TANH,
                                               .n = x->numel}));
  lutra_tensor_hold(&g->x, x);
  lutra_tensor_hold(&g->out, g->y);
  *y = g->y;
  return LUTRA_OK;
}

static int gelu_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  static const char fn[] = "lutra_gelu_backward";
  gelu *g = (gelu *)m;
  CHECK_STATE(g->x, "backward called before forward");
  CHECK_STATE(!(g->x->flags & LUTRA_TENSOR_FREED), "the input saved by forward was freed");
  CHECK_STATE(!(g->out->flags & LUTRA_TENSOR_FREED),
              "the output of the last forward was freed by the module that made it");
  CHECK_ARG(lutra_same_shape(dy, g->out) && dy->dtype == g->out->dtype &&
                dy->device == g->out->device,
            "grad_output does not match the forward output's shape, dtype or device");
  const lutra_backend *be;
  TRY(lutra_backend_get(dy->device, &be, fn));
  if (!dx) return LUTRA_OK; /* the input's gradient is not wanted */
  TRY(lutra_tensor_ensure(&g->dx, PLAIN_TENSOR(dy->dtype, dy->ndim, dy->shape, dy->device), fn));
  TRY(be->activation_backward(&(lutra_act_args){.x = g->x->data,
                                                .dy = dy->data,
                                                .out = g->dx->data,
                                                .dtype = dy->dtype,
                                                .act = LUTRA_ACT_GELU_TANH,
                                                .n = dy->numel}));
  *dx = g->dx;
  return LUTRA_OK;
}

static void gelu_release(lutra_module *m) {
  gelu *g = (gelu *)m;
  lutra_tensor_destroy(g->y);
  lutra_tensor_destroy(g->dx);
  g->y = g->dx = NULL;
  lutra_tensor_hold(&g->x, NULL);
  lutra_tensor_hold(&g->out, NULL);
}

/* the GELU's forward happened inside the neighbour's GEMM: x = pre-activation, y = its output */
static void gelu_adopt(lutra_module *m, const lutra_tensor *x, const lutra_tensor *y) {
  gelu *g = (gelu *)m;
  lutra_tensor_hold(&g->x, x);
  lutra_tensor_hold(&g->out, y);
}

static const lutra_fusion_ops gelu_fusion = {
    .activation = LUTRA_ACT_GELU_TANH,
    .adopt = gelu_adopt,
};

static const lutra_module_ops gelu_ops = {
    .kind = "gelu",
    .forward = gelu_forward,
    .backward = gelu_backward,
    .num_params = lutra_module_no_params,
    .param = lutra_module_no_param,
    .release = gelu_release,
    .fusion = &gelu_fusion,
};

int lutra_gelu_new(lutra_module **out) {
  static const char fn[] = "lutra_gelu_new";
  CHECK_ARG(out, "out is NULL");
  gelu *g = calloc(1, sizeof *g);
  if (!g) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  lutra_module_init(&g->base, &gelu_ops);
  *out = &g->base;
  return LUTRA_OK;
}
