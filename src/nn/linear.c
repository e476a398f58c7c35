/* Linear: y = x W^T + b, with W [out, in] as torch stores it.
 *
 * Under an enabled autocast scope the GEMMs run in FP8 as TransformerEngine runs them:
 *   forward  y  = q(x) q(W)^T        TN, fast accumulation, bias in the epilogue
 *   dgrad    dx = q(dy) q(W)         NN -> TN through W's columnwise copy
 *   wgrad    dW = q(dy)^T q(x)       NT -> TN through the columnwise copies of dy and x
 * The quantizers are built once per recipe (key compared per call, rebuilt only when the
 * recipe changes), and every buffer is reused while the input shape stays, so a steady loop
 * allocates nothing. The input x is borrowed until backward: keep it alive and unchanged. */
#include "backend/backend.h"
#include "backend/device.h"
#include "core/error.h"
#include "core/object.h"
#include "core/trace.h"
#include "fp8/autocast.h"
#include "fp8/quantizer.h"
#include "fp8/recipe.h"
#include "gemm/gemm.h"
#include "nn/module.h"
#include "runtime/skip_flag.h"
#include "runtime/tensor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct linear {
  lutra_module base;
  int64_t in, out;
  int32_t dtype, device;
  bool has_bias, accumulate_main_grad;
  const lutra_backend *be;
  lutra_tensor *weight, *bias, *wgrad, *bgrad, *weight_main_grad, *bias_main_grad;
  lutra_tensor *y, *dx;
  lutra_tensor *pre; /* y's pre-activation when a GELU is fused into the forward GEMM */
  lutra_quantizer *q[LUTRA_NUM_ROLES];
  bool quantized_for_recipe; /* q[] were built for qkey */
  uint64_t qkey;
  /* what the last forward did, for backward */
  const lutra_tensor *x;
  lutra_tensor *xq, *wq;
  bool forward_done, forward_fp8, weight_cached, backward_trigger;
} linear;

static const lutra_module_ops linear_ops;

static linear *as_linear(lutra_module *m) {
  return (linear *)m;
}

static void free_quantizers(lutra_quantizer *q[LUTRA_NUM_ROLES]) {
  for (int i = 0; i < LUTRA_NUM_ROLES; i++) {
    lutra_quantizer_destroy(q[i]);
    q[i] = NULL;
  }
}

/* Builds the quantizers for a recipe; the old ones are replaced only once all new ones exist. */
static int ensure_quantizers(linear *l, const lutra_recipe *r, const char *fn) {
  if (l->quantized_for_recipe && l->qkey == r->key) return LUTRA_OK;
  lutra_quantizer *fresh[LUTRA_NUM_ROLES] = {0};
  for (int i = 0; i < LUTRA_NUM_ROLES; i++) {
    if (r->roles[i].kind == LUTRA_QUANT_NONE) continue;
    int st = lutra_quantizer_create(&r->roles[i], 1, 1, l->device, &fresh[i], fn);
    if (st != LUTRA_OK) {
      free_quantizers(fresh);
      return st;
    }
  }
  free_quantizers(l->q);
  memcpy(l->q, fresh, sizeof fresh);
  l->qkey = r->key;
  l->quantized_for_recipe = true;
  l->weight_cached = false;
  l->xq = l->wq = NULL;
  return LUTRA_OK;
}

static int check_input(const linear *l, const lutra_tensor *x, const char *fn) {
  CHECK_ARG(x->dtype == l->dtype, "input dtype %s does not match the module's %s",
            lutra_dtype_name(x->dtype), lutra_dtype_name(l->dtype));
  CHECK_ARG(lutra_cols(x) == l->in, "input has %lld features, the module expects %lld",
            (long long)lutra_cols(x), (long long)l->in);
  CHECK_ARG(x->device == l->device, "input is on another device than the module");
  return LUTRA_OK;
}

static int check_fp8_dims(const lutra_recipe *r, const lutra_tensor *x, const linear *l,
                          const char *fn) {
  TRY(lutra_quantizer_check_input(&r->roles[LUTRA_ROLE_INPUT], x, fn));
  TRY(lutra_quantizer_check_input(&r->roles[LUTRA_ROLE_WEIGHT], l->weight, fn));
  return LUTRA_OK;
}

static int note_forward(lutra_quantizer *q, const linear *l, const char *fn) {
  lutra_scale_meta *meta = q ? lutra_quantizer_meta(q) : NULL;
  return meta ? lutra_autocast_note_forward(meta, l->device, fn) : LUTRA_OK;
}

static int forward_fp8(linear *l, const lutra_tensor *x, int first_microbatch,
                       const lutra_gemm_epilogue *epi, const char *fn) {
  lutra_quantizer *qi = l->q[LUTRA_ROLE_INPUT], *qw = l->q[LUTRA_ROLE_WEIGHT];
  /* DEVICE: the weight is quantized on every call, skipped on the device while the
   * skip-weight-update flag is set: the weight quantizer's output then keeps the codes of its
   * last quantization. Delayed scaling notes the meta either way (a skipped cast records no
   * amax: the update rolls a zero into the history, as for a step without this weight). */
  const int32_t *skip = NULL;
  if (first_microbatch == LUTRA_FIRST_MICROBATCH_DEVICE) {
    bool host_skip;
    TRY(lutra_skip_weight_flag(l->device, &skip, &host_skip, fn));
    CHECK_STATE(l->weight_cached || !host_skip,
                "the skip-weight-update flag is set but this Linear has no quantized weight yet "
                "(first FP8 forward, or the recipe changed): run it with the flag 0 first");
  }
  TRY(lutra_quantize_run(qi, x, true, &l->xq, fn));
  TRY(note_forward(qi, l, fn));
  bool reuse = first_microbatch == 0 && l->weight_cached;
  if (!reuse) {
    TRY(lutra_quantize_skip_run(qw, l->weight, true, NULL, false, skip, &l->wq, fn));
    TRY(note_forward(qw, l, fn));
    l->weight_cached = true;
  }
  return lutra_gemm_run_ex(l->wq, 1, l->xq, 0, l->y, l->bias, 0, 1, epi, fn);
}

/* Calibration: record amaxes for delayed scaling, compute in high precision. */
static int observe(linear *l, const lutra_tensor *x, const char *fn) {
  lutra_quantizer *qi = l->q[LUTRA_ROLE_INPUT], *qw = l->q[LUTRA_ROLE_WEIGHT];
  if (qi) {
    TRY(lutra_quantize_observe(qi, x, fn));
    TRY(note_forward(qi, l, fn));
  }
  if (qw) {
    TRY(lutra_quantize_observe(qw, l->weight, fn));
    TRY(note_forward(qw, l, fn));
  }
  return LUTRA_OK;
}

static bool uses_delayed(const lutra_recipe *r) {
  for (int i = 0; i < LUTRA_NUM_ROLES; i++)
    if (r->roles[i].kind == LUTRA_QUANT_DELAYED) return true;
  return false;
}

/* gelu: the GEMM's epilogue also applies GELU (y = gelu(x W^T + b)) and keeps the
 * pre-activation in l->pre for the GELU's backward */
static int linear_forward_impl(lutra_module *m, const lutra_tensor *x, int first_microbatch,
                               bool gelu, lutra_tensor **y) {
  static const char fn[] = "lutra_linear_forward";
  linear *l = as_linear(m);
  TRY(check_input(l, x, fn));
  const lutra_tls_state *s = lutra_autocast_current();
  const lutra_recipe *r = s->recipe;
  bool fp8 = r && s->enabled && r->roles[LUTRA_ROLE_INPUT].kind != LUTRA_QUANT_NONE;
  bool calibrate = r && !s->enabled && s->calibrating;
  if (fp8) TRY(check_fp8_dims(r, x, l, fn));
  if (fp8 || calibrate) TRY(ensure_quantizers(l, r, fn));

  int64_t shape[LUTRA_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  shape[x->ndim - 1] = l->out;
  TRY(lutra_tensor_ensure(&l->y, PLAIN_TENSOR(l->dtype, x->ndim, shape, l->device), fn));
  lutra_gemm_epilogue epi = {.kind = LUTRA_EPILOGUE_GELU_AUX};
  if (gelu) {
    TRY(lutra_tensor_ensure(&l->pre, PLAIN_TENSOR(l->dtype, x->ndim, shape, l->device), fn));
    epi.aux = l->pre;
  }
  if (fp8) {
    TRY(forward_fp8(l, x, first_microbatch, gelu ? &epi : NULL, fn));
  } else {
    if (calibrate) TRY(observe(l, x, fn));
    TRY(lutra_gemm_run_ex(l->weight, 1, x, 0, l->y, l->bias, 0, 0, gelu ? &epi : NULL, fn));
  }
  l->x = x;
  l->forward_fp8 = fp8;
  l->forward_done = true;
  l->backward_trigger =
      (fp8 || calibrate) && uses_delayed(r) && lutra_autocast_claim_backward_trigger();
  *y = l->y;
  return LUTRA_OK;
}

/* pre: the pre-activation of a GELU just before this Linear, fused into the dgrad GEMM as its
 * DGELU epilogue where that GEMM is not FP8 (*fused tells); then dx is the GELU input's gradient.
 * act: this Linear's own GELU (a fused forward's l->pre) when dy is the gradient of the GELU's
 * output: gelu' goes into the grad_output cast (lutra_linear_takes_gelu_grad said it can). */
static int linear_backward_impl(lutra_module *m, const lutra_tensor *dy, const lutra_tensor *pre,
                                const lutra_tensor *act, bool *fused, lutra_tensor **dx) {
  static const char fn[] = "lutra_linear_backward";
  linear *l = as_linear(m);
  CHECK_STATE(l->forward_done, "backward called before forward");
  CHECK_STATE(!(l->x->flags & LUTRA_TENSOR_FREED), "the input saved by forward was freed");
  CHECK_ARG(dy->dtype == l->dtype, "grad_output dtype %s does not match the module's %s",
            lutra_dtype_name(dy->dtype), lutra_dtype_name(l->dtype));
  CHECK_ARG(lutra_same_shape(dy, l->y), "grad_output shape does not match the forward output");
  CHECK_ARG(dy->device == l->device, "grad_output is on another device than the module");
  /* dx NULL: the input's gradient is not wanted (its dgrad GEMM is skipped) */
  if (dx)
    TRY(lutra_tensor_ensure(&l->dx, PLAIN_TENSOR(l->dtype, l->x->ndim, l->x->shape, l->device),
                            fn));
  lutra_tensor *wgrad_out = l->accumulate_main_grad ? l->weight_main_grad : l->wgrad;
  int accumulate = l->accumulate_main_grad;
  lutra_quantizer *qg = l->q[LUTRA_ROLE_GRAD_OUTPUT];
  lutra_tensor *bg = !l->has_bias ? NULL : l->accumulate_main_grad ? l->bias_main_grad : l->bgrad;
  if (l->forward_fp8 && qg) {
    lutra_tensor *dyq;
    /* the bias gradient comes out of the grad_output cast, which reads dy anyway */
    if (act)
      TRY(lutra_quantize_dgelu_run(qg, dy, act, bg, accumulate, &dyq, fn));
    else
      TRY(lutra_quantize_dbias_run(qg, dy, true, bg, accumulate, &dyq, fn));
    bg = NULL;
    lutra_scale_meta *meta = lutra_quantizer_meta(qg);
    if (meta) TRY(lutra_autocast_note_backward(meta, l->device, fn));
    if (dx) TRY(lutra_gemm_run(l->wq, 0, dyq, 0, l->dx, NULL, 0, 0, fn));
    TRY(lutra_gemm_run(l->xq, 0, dyq, 1, wgrad_out, NULL, accumulate, 0, fn));
  } else {
    lutra_gemm_epilogue dgelu = {.kind = LUTRA_EPILOGUE_DGELU, .aux = (lutra_tensor *)pre};
    bool fuse_dgelu = dx && pre && pre->dtype == l->dtype && lutra_same_shape(pre, l->dx);
    if (dx)
      TRY(lutra_gemm_run_ex(l->weight, 0, dy, 0, l->dx, NULL, 0, 0, fuse_dgelu ? &dgelu : NULL,
                            fn));
    if (fused) *fused = fuse_dgelu;
    /* the wgrad GEMM reads dy already: its BGRADB epilogue sums it into the bias gradient
     * (it overwrites dbias, so not when gradients accumulate into main_grad) */
    lutra_gemm_epilogue epi = {.kind = LUTRA_EPILOGUE_BGRADB, .dbias = bg};
    bool fuse_bias = bg && !accumulate;
    TRY(lutra_gemm_run_ex(l->x, 0, dy, 1, wgrad_out, NULL, accumulate, 0, fuse_bias ? &epi : NULL,
                          fn));
    if (fuse_bias) bg = NULL;
  }
  if (bg) {
    TRY(l->be->bias_grad(&(lutra_bias_grad_args){.dy = dy->data,
                                                 .dtype = dy->dtype,
                                                 .rows = lutra_rows(dy),
                                                 .cols = l->out,
                                                 .db = bg->data,
                                                 .db_dtype = bg->dtype,
                                                 .accumulate = accumulate}));
  }
  if (l->backward_trigger) {
    TRY(lutra_autocast_backward_done(fn));
    l->backward_trigger = false;
  }
  if (dx) *dx = l->dx;
  return LUTRA_OK;
}

static int linear_forward(lutra_module *m, const lutra_tensor *x, int first_microbatch,
                          lutra_tensor **y) {
  RANGE_PUSH("lutra.linear.forward");
  int st = linear_forward_impl(m, x, first_microbatch, false, y);
  RANGE_POP();
  return st;
}

static int linear_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  RANGE_PUSH("lutra.linear.backward");
  int st = linear_backward_impl(m, dy, NULL, NULL, NULL, dx);
  RANGE_POP();
  return st;
}

int lutra_linear_forward_gelu(lutra_module *m, const lutra_tensor *x, int first_microbatch,
                              lutra_tensor **y, lutra_tensor **pre) {
  RANGE_PUSH("lutra.linear.forward");
  int st = linear_forward_impl(m, x, first_microbatch, true, y);
  RANGE_POP();
  if (st == LUTRA_OK) *pre = as_linear(m)->pre;
  return st;
}

int lutra_linear_backward_dgelu(lutra_module *m, const lutra_tensor *dy, const lutra_tensor *pre,
                                lutra_tensor **dx, bool *fused) {
  *fused = false;
  RANGE_PUSH("lutra.linear.backward");
  int st = linear_backward_impl(m, dy, pre, NULL, fused, dx);
  RANGE_POP();
  return st;
}

bool lutra_linear_takes_gelu_grad(const lutra_module *m) {
  const linear *l = (const linear *)m;
  const lutra_quantizer *qg = l->q[LUTRA_ROLE_GRAD_OUTPUT];
  return l->forward_done && l->forward_fp8 && l->pre && qg && lutra_quantizer_takes_dgelu(qg);
}

int lutra_linear_backward_gelu(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  RANGE_PUSH("lutra.linear.backward");
  int st = linear_backward_impl(m, dy, NULL, as_linear(m)->pre, NULL, dx);
  RANGE_POP();
  return st;
}

static int linear_num_params(const lutra_module *m) {
  return ((const linear *)m)->has_bias ? 2 : 1;
}

static int linear_param(const lutra_module *m, int i, lutra_param *out) {
  const linear *l = (const linear *)m;
  if (i == 0) {
    *out = (lutra_param){l->weight, l->wgrad, l->weight_main_grad};
  } else {
    *out = (lutra_param){l->bias, l->bgrad, l->bias_main_grad};
  }
  return LUTRA_OK;
}

static void linear_release(lutra_module *m) {
  linear *l = as_linear(m);
  free_quantizers(l->q);
  lutra_tensor *owned[] = {l->weight,         l->bias, l->wgrad, l->bgrad, l->weight_main_grad,
                           l->bias_main_grad, l->y,    l->dx,    l->pre};
  for (size_t i = 0; i < sizeof owned / sizeof *owned; i++)
    lutra_tensor_destroy(owned[i]);
  l->weight = l->bias = l->wgrad = l->bgrad = NULL;
  l->weight_main_grad = l->bias_main_grad = l->y = l->dx = l->pre = NULL;
}

static const lutra_module_ops linear_ops = {
    .kind = "linear",
    .forward = linear_forward,
    .backward = linear_backward,
    .num_params = linear_num_params,
    .param = linear_param,
    .release = linear_release,
};

void lutra_linear_defaults(lutra_linear_desc *d) {
  if (!d) return;
  memset(d, 0, sizeof *d);
  d->bias = 1;
  d->dtype = LUTRA_F32;
  d->device = LUTRA_CPU;
  d->seed = 1;
}

static int make_param(linear *l, int64_t n0, int64_t n1, int dtype, lutra_tensor **t,
                      const char *fn) {
  int64_t shape[2] = {n0, n1};
  lutra_tensor_spec spec = *PLAIN_TENSOR(dtype, n1 ? 2 : 1, shape, l->device);
  spec.flags = LUTRA_TENSOR_BORROWED;
  return lutra_tensor_make(&spec, t, fn);
}

int lutra_linear_new(const lutra_linear_desc *d, lutra_module **out) {
  static const char fn[] = "lutra_linear_new";
  CHECK_ARG(d, "desc is NULL");
  CHECK_ARG(out, "out is NULL");
  CHECK_ARG(d->in_features > 0 && d->out_features > 0,
            "in_features and out_features must be positive (got %lld, %lld)",
            (long long)d->in_features, (long long)d->out_features);
  CHECK_ARG(d->dtype == LUTRA_F32 || d->dtype == LUTRA_BF16, "dtype must be f32 or bf16, got %s",
            lutra_dtype_name(d->dtype));
  const lutra_backend *be;
  TRY(lutra_backend_get(d->device, &be, fn));
  linear *l = calloc(1, sizeof *l);
  if (!l) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  l->base.obj.magic = LUTRA_MAGIC_MODULE;
  l->base.obj.refs = 1;
  l->base.ops = &linear_ops;
  l->in = d->in_features;
  l->out = d->out_features;
  l->dtype = d->dtype;
  l->device = d->device;
  l->has_bias = d->bias != 0;
  l->accumulate_main_grad = d->accumulate_main_grad != 0;
  l->be = be;
  int st = make_param(l, l->out, l->in, l->dtype, &l->weight, fn);
  if (st == LUTRA_OK) st = make_param(l, l->out, l->in, l->dtype, &l->wgrad, fn);
  if (st == LUTRA_OK && l->has_bias) st = make_param(l, l->out, 0, l->dtype, &l->bias, fn);
  if (st == LUTRA_OK && l->has_bias) st = make_param(l, l->out, 0, l->dtype, &l->bgrad, fn);
  if (st == LUTRA_OK && l->accumulate_main_grad) {
    st = make_param(l, l->out, l->in, LUTRA_F32, &l->weight_main_grad, fn);
    if (st == LUTRA_OK && l->has_bias)
      st = make_param(l, l->out, 0, LUTRA_F32, &l->bias_main_grad, fn);
  }
  /* torch's default: uniform(-1/sqrt(in), 1/sqrt(in)) for weight and bias */
  float bound = (float)(1.0 / sqrt((double)l->in));
  if (st == LUTRA_OK) st = lutra_tensor_uniform(l->weight, d->seed, -bound, bound);
  if (st == LUTRA_OK && l->has_bias)
    st = lutra_tensor_uniform(l->bias, d->seed ^ 0x5bd1e995u, -bound, bound);
  if (st == LUTRA_OK) st = lutra_module_zero_grad(&l->base);
  if (st != LUTRA_OK) {
    linear_release(&l->base);
    free(l);
    return st;
  }
  *out = &l->base;
  return LUTRA_OK;
}

int lutra_linear_quantizer(const lutra_module *m, int role, lutra_quantizer **out) {
  static const char fn[] = "lutra_linear_quantizer";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(m->ops == &linear_ops, "module is a %s, not a linear", m->ops->kind);
  CHECK_ARG(role >= 0 && role < LUTRA_NUM_ROLES, "unknown role %d", role);
  CHECK_ARG(out, "out is NULL");
  *out = ((const linear *)m)->q[role];
  return LUTRA_OK;
}

bool lutra_module_is_linear(const lutra_module *m) {
  return m->ops == &linear_ops;
}
