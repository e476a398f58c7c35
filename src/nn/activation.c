/* Activation modules: one module type parameterized by a LUTRA_ACT_* kind (the tanh GELU, as
 * TransformerEngine's "gelu", and TE's other activations, element-wise and gated). Every kind
 * answers the fusion protocol with adopt: a neighbour may run its forward for it, the Linear
 * before it in its GEMM's epilogue (the tanh GELU only: cuBLASLt's GELU epilogues are that
 * formula, lutra_linear_core_ends_in) or the Linear after it inside the cast of its FP8 input
 * (every kind, lutra_linear_core_forward_from_act). */
#include "backend/backend.h"
#include "backend/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/object.h"
#include "nn/module.h"
#include "runtime/tensor.h"
#include "runtime/tensor_cache.h"

#include <stdlib.h>

/* the public kinds are the backend's */
_Static_assert((int)LUTRA_ACTIVATION_GELU_TANH == (int)LUTRA_ACT_GELU_TANH, "kind values");
_Static_assert((int)LUTRA_ACTIVATION_RELU == (int)LUTRA_ACT_RELU, "kind values");
_Static_assert((int)LUTRA_ACTIVATION_SILU == (int)LUTRA_ACT_SILU, "kind values");
_Static_assert((int)LUTRA_ACTIVATION_QGELU == (int)LUTRA_ACT_QGELU, "kind values");
_Static_assert((int)LUTRA_ACTIVATION_SRELU == (int)LUTRA_ACT_SRELU, "kind values");
_Static_assert((int)LUTRA_ACTIVATION_GELU_ERF == (int)LUTRA_ACT_GELU_ERF, "kind values");
_Static_assert((int)LUTRA_ACTIVATION_SWIGLU == (int)LUTRA_ACT_SWIGLU, "kind values");
_Static_assert((int)LUTRA_ACTIVATION_GEGLU == (int)LUTRA_ACT_GEGLU, "kind values");
_Static_assert((int)LUTRA_ACTIVATION_REGLU == (int)LUTRA_ACT_REGLU, "kind values");
_Static_assert((int)LUTRA_ACTIVATION_TANH == (int)LUTRA_ACT_TANH, "kind values");

typedef struct activation {
  lutra_module base;
  int32_t act;
  /* held (lutra_tensor_hold) until the next forward: the backward reads them */
  const lutra_tensor *x;
  const lutra_tensor *out; /* the last forward's output: y, or one adopted from a fused GEMM */
  lutra_tensor *y, *dx;
  lutra_tensor_cache y_cache, dx_cache; /* behind y and dx: one per shape seen */
} activation;

/* per kind: the names its errors carry (the tanh GELU's are the
 * names lutra_gelu_new's module always had) */
typedef struct act_names {
  const char *forward, *backward;
} act_names;

static const act_names NAMES[LUTRA_ACT_COUNT] = {
    [LUTRA_ACT_GELU_TANH] = {"lutra_gelu_forward", "lutra_gelu_backward"},
    [LUTRA_ACT_RELU] = {"lutra_relu_forward", "lutra_relu_backward"},
    [LUTRA_ACT_SILU] = {"lutra_silu_forward", "lutra_silu_backward"},
    [LUTRA_ACT_QGELU] = {"lutra_quick_gelu_forward", "lutra_quick_gelu_backward"},
    [LUTRA_ACT_SRELU] = {"lutra_squared_relu_forward", "lutra_squared_relu_backward"},
    [LUTRA_ACT_GELU_ERF] = {"lutra_gelu_erf_forward", "lutra_gelu_erf_backward"},
    [LUTRA_ACT_SWIGLU] = {"lutra_swiglu_forward", "lutra_swiglu_backward"},
    [LUTRA_ACT_GEGLU] = {"lutra_geglu_forward", "lutra_geglu_backward"},
    [LUTRA_ACT_REGLU] = {"lutra_reglu_forward", "lutra_reglu_backward"},
    [LUTRA_ACT_TANH] = {"lutra_tanh_forward", "lutra_tanh_backward"},
};

/* the arguments of a gated kind: x as [rows, cols], the last dim split in two */
static void gated_shape(const lutra_tensor *x, lutra_act_args *a) {
  a->cols = x->ndim > 0 ? x->shape[x->ndim - 1] : 1;
  a->rows = a->cols > 0 ? x->numel / a->cols : 0;
}

static int act_forward(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *fa,
                       lutra_tensor **y) {
  activation *g = (activation *)m;
  const char *fn = NAMES[g->act].forward;
  CHECK_ARG(lutra_dtype_is_float(x->dtype), "input dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(x->dtype));
  const bool gated = lutra_act_is_gated(g->act);
  int64_t shape[LUTRA_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++)
    shape[i] = x->shape[i];
  if (gated) {
    CHECK_ARG(x->ndim >= 1, "a gated activation's input needs a last dim to split");
    CHECK_ARG(x->shape[x->ndim - 1] % 2 == 0,
              "the input's last dim %lld is odd: a gated activation splits it into two halves",
              (long long)x->shape[x->ndim - 1]);
    shape[x->ndim - 1] /= 2;
  }
  const lutra_backend *be;
  TRY(lutra_backend_get(x->device, &be, fn));
  TRY(lutra_tensor_cache_get(&g->y_cache, PLAIN_TENSOR(x->dtype, x->ndim, shape, x->device), &g->y,
                             fn));
  lutra_act_args a = {.x = x->data, .out = g->y->data, .dtype = x->dtype, .act = g->act};
  if (gated)
    gated_shape(x, &a);
  else
    a.n = x->numel;
  TRY(be->activation_forward(&a));
  /* an inference forward is never backpropagated: it lets go of the last input too */
  lutra_tensor_hold(&g->x, fa->grad ? x : NULL);
  lutra_tensor_hold(&g->out, g->y);
  *y = g->y;
  return LUTRA_OK;
}

static int act_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  activation *g = (activation *)m;
  const char *fn = NAMES[g->act].backward;
  CHECK_STATE(g->x, g->out ? "the last forward ran with grad = false (inference): it kept nothing "
                             "for a backward"
                           : "backward called before forward");
  CHECK_STATE(!(g->x->flags & LUTRA_TENSOR_FREED), "the input saved by forward was freed");
  CHECK_STATE(!(g->out->flags & LUTRA_TENSOR_FREED),
              "the output of the last forward was freed by the module that made it");
  CHECK_ARG(lutra_same_shape(dy, g->out) && dy->dtype == g->out->dtype &&
                dy->device == g->out->device,
            "grad_output does not match the forward output's shape, dtype or device");
  const lutra_backend *be;
  TRY(lutra_backend_get(dy->device, &be, fn));
  if (!dx) return LUTRA_OK; /* the input's gradient is not wanted */
  /* dx has the input's shape: the output's for element-wise kinds, twice its last dim for
   * gated ones */
  const lutra_tensor *x = g->x;
  TRY(lutra_tensor_cache_get(&g->dx_cache, PLAIN_TENSOR(dy->dtype, x->ndim, x->shape, dy->device),
                             &g->dx, fn));
  lutra_act_args a = {
      .x = x->data, .dy = dy->data, .out = g->dx->data, .dtype = dy->dtype, .act = g->act};
  if (lutra_act_is_gated(g->act))
    gated_shape(x, &a);
  else
    a.n = dy->numel;
  TRY(be->activation_backward(&a));
  *dx = g->dx;
  return LUTRA_OK;
}

static void act_release(lutra_module *m) {
  activation *g = (activation *)m;
  lutra_tensor_hold(&g->x, NULL);
  lutra_tensor_hold(&g->out, NULL);
  lutra_tensor_cache_release(&g->y_cache);
  lutra_tensor_cache_release(&g->dx_cache);
  g->y = g->dx = NULL;
}

/* the forward happened inside a neighbour (its GEMM's epilogue or its input cast): x = the
 * activation's input, y = its output (whose data a fused cast may have left unwritten: the
 * backward reads only its shape) */
static void act_adopt(lutra_module *m, const lutra_tensor *x, const lutra_tensor *y) {
  activation *g = (activation *)m;
  lutra_tensor_hold(&g->x, x);
  lutra_tensor_hold(&g->out, y);
}

#define FUSION(k) [k] = {.activation = k, .adopt = act_adopt}
static const lutra_fusion_ops FUSIONS[LUTRA_ACT_COUNT] = {
    FUSION(LUTRA_ACT_GELU_TANH), FUSION(LUTRA_ACT_RELU),  FUSION(LUTRA_ACT_SILU),
    FUSION(LUTRA_ACT_QGELU),     FUSION(LUTRA_ACT_SRELU), FUSION(LUTRA_ACT_GELU_ERF),
    FUSION(LUTRA_ACT_SWIGLU),    FUSION(LUTRA_ACT_GEGLU), FUSION(LUTRA_ACT_REGLU),
    FUSION(LUTRA_ACT_TANH),
};

#define OPS(k, name)                                                                               \
  [k] = {.kind = name,                                                                             \
         .forward = act_forward,                                                                   \
         .backward = act_backward,                                                                 \
         .num_params = lutra_module_no_params,                                                     \
         .param = lutra_module_no_param,                                                           \
         .release = act_release,                                                                   \
         .fusion = &FUSIONS[k],                                                                    \
         .checkpoint = &lutra_checkpoint_stateless}
static const lutra_module_ops OPS_OF[LUTRA_ACT_COUNT] = {
    OPS(LUTRA_ACT_GELU_TANH, "gelu"),     OPS(LUTRA_ACT_RELU, "relu"),
    OPS(LUTRA_ACT_SILU, "silu"),          OPS(LUTRA_ACT_QGELU, "quick_gelu"),
    OPS(LUTRA_ACT_SRELU, "squared_relu"), OPS(LUTRA_ACT_GELU_ERF, "gelu_erf"),
    OPS(LUTRA_ACT_SWIGLU, "swiglu"),      OPS(LUTRA_ACT_GEGLU, "geglu"),
    OPS(LUTRA_ACT_REGLU, "reglu"),        OPS(LUTRA_ACT_TANH, "tanh"),
};

int lutra_activation_new(int kind, lutra_module **out) {
  static const char fn[] = "lutra_activation_new";
  CHECK_ARG(out, "out is NULL");
  CHECK_ARG(kind > LUTRA_ACT_NONE && kind < LUTRA_ACT_COUNT,
            "activation kind %d is not one of LUTRA_ACTIVATION_*", kind);
  activation *g = calloc(1, sizeof *g);
  if (!g) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  lutra_module_init(&g->base, &OPS_OF[kind]);
  g->act = kind;
  *out = &g->base;
  return LUTRA_OK;
}

int lutra_gelu_new(lutra_module **out) {
  static const char fn[] = "lutra_gelu_new";
  CHECK_ARG(out, "out is NULL");
  return lutra_activation_new(LUTRA_ACT_GELU_TANH, out);
}
