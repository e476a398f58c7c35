/* LayerNormLinear: y = norm(x) W^T + b (TransformerEngine's LayerNormLinear), the norm core and
 * the Linear core side by side. Under an FP8 scope whose input quantizer the norm can write
 * (lutra_quantizer_fuses_norm), the norm kernel writes the GEMM's FP8 input, rowwise and the
 * columnwise copy the wgrad reads, with the amax: no high-precision norm output exists unless
 * return_layernorm_output asks for it, and the Linear core takes that input as it is
 * (given_xq). Otherwise the norm writes its output and the core quantizes (or not) as a Linear.
 * Backward: the core's dgrad and wgrad, then the norm's backward from the dgrad (dgamma and
 * dbeta deterministic). The fusion protocol is answered as a Linear answers it for its output
 * side (an activation in the forward GEMM's epilogue, its derivative in the grad_output cast);
 * its input side starts with a norm, which takes no activation's derivative.
 * Column-parallel (lutra_layernorm_linear_parallel_new): the collectives of nn/tp.h around the
 * core, the norm before them on this rank's rows (lutra/tp_modules.h). */
#include "core/error.h"
#include "core/object.h"
#include "core/trace.h"
#include "fp8/quantizer.h"
#include "nn/export_view.h"
#include "nn/linear/linear_core.h"
#include "nn/module.h"
#include "nn/norm_core.h"
#include "nn/tp.h"

#include <stdlib.h>

typedef struct layernorm_linear {
  lutra_module base;
  lutra_norm_core norm;
  lutra_linear_core lin;
  bool return_ln, fused;
  bool parallel;
  lutra_tp tp; /* parallel: column, the norm output gathered with sequence parallelism */
} layernorm_linear;

static const lutra_module_ops lnl_ops;
static const char fwd_fn[] = "lutra_layernorm_linear_forward";
static const char bwd_fn[] = "lutra_layernorm_linear_backward";

static int forward_impl(layernorm_linear *l, const lutra_tensor *x, const lutra_forward_args *a,
                        int act, lutra_tensor **y) {
  const char *fn = fwd_fn;
  lutra_norm_core *n = &l->norm;
  TRY(lutra_norm_core_prepare(n, x, fn));
  lutra_quantizer *qi;
  TRY(lutra_linear_core_input_quantizer(&l->lin, n->y, &qi, fn));
  /* a sequence-parallel norm output gathered in high precision is quantized after the gather,
   * by the core: the norm cannot write those codes */
  bool hp_gather = l->parallel && l->tp.sp && !lutra_tp_gathers_fp8(&l->tp);
  bool fuse = qi && lutra_quantizer_fuses_norm(qi) && !hp_gather;
  if (fuse) {
    lutra_norm_args na = lutra_norm_core_args(n, x);
    na.y = l->return_ln ? n->y->data : NULL;
    lutra_tensor *xq;
    TRY(lutra_quantize_norm_run(qi, &na, n->y, true, a->grad == 0, &xq, fn));
    l->lin.given_xq = xq;
  } else {
    TRY(lutra_norm_core_forward(n, x, fn));
  }
  const lutra_tensor *gx = n->y;
  int st = LUTRA_OK;
  if (l->parallel) st = lutra_tp_forward_input(&l->tp, n->y, &gx, &l->lin.gather_rows, fn);
  if (st == LUTRA_OK) st = lutra_linear_core_forward(&l->lin, gx, a, act, y, fn);
  if (st == LUTRA_OK && l->parallel) st = lutra_tp_forward_output(&l->tp, *y, y, fn);
  l->lin.given_xq = NULL;
  TRY(st);
  lutra_norm_core_done(n, x, a->grad != 0);
  l->fused = fuse;
  return LUTRA_OK;
}

static int lnl_forward_act(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *a,
                           int act, lutra_tensor **y, const lutra_tensor **pre) {
  layernorm_linear *l = (layernorm_linear *)m;
  RANGE_PUSH("lutra.layernorm_linear.forward");
  int st = forward_impl(l, x, a, act, y);
  RANGE_POP();
  if (st == LUTRA_OK && pre) *pre = l->lin.pre;
  return st;
}

static int lnl_forward(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *a,
                       lutra_tensor **y) {
  return lnl_forward_act(m, x, a, LUTRA_ACT_NONE, y, NULL);
}

static int backward_impl(layernorm_linear *l, const lutra_linear_backward_op *op,
                         lutra_tensor **dx) {
  const char *fn = bwd_fn;
  /* the norm's saved input is checked before the core's backward writes any gradient */
  CHECK_STATE(!l->norm.x || !(l->norm.x->flags & LUTRA_TENSOR_FREED),
              "the input saved by forward was freed");
  lutra_tensor *dln;
  TRY(lutra_linear_core_backward(&l->lin, op, &dln, NULL, fn));
  if (l->parallel) TRY(lutra_tp_backward_output(&l->tp, dln, &dln, fn));
  return lutra_norm_core_backward(&l->norm, dln, dx, fn);
}

static int lnl_backward_op(lutra_module *m, const lutra_linear_backward_op *op, lutra_tensor **dx) {
  RANGE_PUSH("lutra.layernorm_linear.backward");
  int st = backward_impl((layernorm_linear *)m, op, dx);
  RANGE_POP();
  return st;
}

static int lnl_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  return lnl_backward_op(m, &(lutra_linear_backward_op){.dy = dy}, dx);
}

/* a Residual's sums: the forward's in the Linear core's GEMM (not the column-parallel one: its
 * output is a shard), the backward's in the norm's kernel */
static bool lnl_arm_residual(lutra_module *m, int pass, const lutra_tensor *r, lutra_tensor *out) {
  layernorm_linear *l = (layernorm_linear *)m;
  if (pass == LUTRA_PASS_FORWARD) {
    if (l->parallel) return false;
    l->lin.residual = r;
    l->lin.residual_out = out;
  } else {
    l->norm.residual = r;
    l->norm.residual_out = out;
  }
  return true;
}

static bool lnl_ends_in(const lutra_module *m, int act) {
  (void)m;
  return lutra_linear_core_ends_in(act);
}

static bool lnl_starts_from_act_grad(const lutra_module *m, int act) {
  return lutra_linear_core_starts_from_act_grad(&((const layernorm_linear *)m)->lin, act);
}

static int lnl_backward_from_act_grad(lutra_module *m, int act, const lutra_tensor *dy,
                                      lutra_tensor **dx) {
  return lnl_backward_op(
      m, &(lutra_linear_backward_op){.dy = dy, .from_act_grad = true, .act_grad_act = act}, dx);
}

static int lnl_num_params(const lutra_module *m) {
  const layernorm_linear *l = (const layernorm_linear *)m;
  return lutra_norm_core_num_params(&l->norm) + lutra_linear_core_num_params(&l->lin);
}

static int lnl_param(const lutra_module *m, int i, lutra_param *out) {
  const layernorm_linear *l = (const layernorm_linear *)m;
  int nn = lutra_norm_core_num_params(&l->norm);
  if (i < nn)
    lutra_norm_core_param(&l->norm, i, out);
  else
    lutra_linear_core_param(&l->lin, i - nn, out);
  return LUTRA_OK;
}

static void lnl_release(lutra_module *m) {
  layernorm_linear *l = (layernorm_linear *)m;
  lutra_norm_core_release(&l->norm);
  lutra_linear_core_release(&l->lin);
  if (l->parallel) lutra_tp_release(&l->tp);
}

static const lutra_fusion_ops lnl_fusion = {
    .activation = LUTRA_ACT_NONE,
    .ends_in = lnl_ends_in,
    .forward_ending_in = lnl_forward_act,
    .starts_from_act_grad = lnl_starts_from_act_grad,
    .backward_from_act_grad = lnl_backward_from_act_grad,
    .arm_residual = lnl_arm_residual,
};

/* Checkpoint names: "norm.weight" (and, for LayerNorm, "norm.bias"), then the Linear's "weight"
 * and "bias" (TE: layer_norm_weight, layer_norm_bias, weight, bias); the quantizers are the
 * Linear core's ("fp8.input", "fp8.weight", "fp8.grad_output"). */
static const char *lnl_param_name(const lutra_module *m, int i) {
  static const char *const names[] = {"norm.weight", "norm.bias", "weight", "bias"};
  const layernorm_linear *l = (const layernorm_linear *)m;
  int nn = lutra_norm_core_num_params(&l->norm);
  return i < nn ? names[i] : names[2 + i - nn];
}

static int lnl_quantizers(lutra_module *m, const lutra_recipe *build_for,
                          lutra_module_quantizers *out, const char *fn) {
  return lutra_linear_core_quantizers(&((layernorm_linear *)m)->lin, build_for, NULL, out, fn);
}

static void lnl_adopt_quantizers(lutra_module *m, const lutra_recipe *r,
                                 const lutra_module_quantizers *q) {
  lutra_linear_core_adopt_quantizers(&((layernorm_linear *)m)->lin, r, q);
}

static bool lnl_in_window(const lutra_module *m) {
  return lutra_linear_core_in_accumulation_window(&((const layernorm_linear *)m)->lin);
}

static const lutra_checkpoint_ops lnl_checkpoint = {
    .param_name = lnl_param_name,
    .quantizers = lnl_quantizers,
    .adopt_quantizers = lnl_adopt_quantizers,
    .in_accumulation_window = lnl_in_window,
};

static lutra_module_choice *lnl_choice(lutra_module *m) {
  return &((layernorm_linear *)m)->lin.choice;
}

static const lutra_module_ops lnl_ops = {
    .kind = "layernorm_linear",
    .forward = lnl_forward,
    .backward = lnl_backward,
    .num_params = lnl_num_params,
    .param = lnl_param,
    .release = lnl_release,
    .fusion = &lnl_fusion,
    .checkpoint = &lnl_checkpoint,
    .choice = lnl_choice,
};

void lutra_layernorm_linear_defaults(lutra_layernorm_linear_desc *d) {
  if (!d) return;
  *d = (lutra_layernorm_linear_desc){
      .bias = 1, .eps = 1e-5f, .dtype = LUTRA_F32, .device = LUTRA_CPU};
  lutra_seed_next(&d->seed);
}

static int lnl_create(const lutra_layernorm_linear_desc *d, const lutra_tp_desc *tp,
                      lutra_module **out, const char *fn) {
  CHECK_ARG(d, "desc is NULL");
  CHECK_ARG(out, "out is NULL");
  CHECK_ARG(d->normalization == LUTRA_NORM_LAYERNORM || d->normalization == LUTRA_NORM_RMSNORM,
            "normalization %d is not LUTRA_NORM_LAYERNORM (0) or LUTRA_NORM_RMSNORM (1)",
            (int)d->normalization);
  CHECK_ARG(d->in_features > 0 && d->out_features > 0,
            "in_features and out_features must be positive (got %lld, %lld)",
            (long long)d->in_features, (long long)d->out_features);
  if (tp) {
    CHECK_ARG(tp->mode != LUTRA_TP_ROW,
              "row-parallel is not supported (TransformerEngine refuses it too): its input "
              "would be a shard of the features, and the norm over the full hidden needs every "
              "feature of a row, while normalizing each shard alone is another layer (use "
              "column, or a LayerNorm and a row-parallel Linear)");
  }
  layernorm_linear *l = calloc(1, sizeof *l);
  if (!l) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  int64_t local_in = d->in_features, local_out = d->out_features;
  if (tp) {
    int st = lutra_tp_init(&l->tp, tp, d->in_features, d->out_features, d->dtype, d->device,
                           &local_in, &local_out, fn);
    if (st != LUTRA_OK) {
      free(l);
      return st;
    }
    l->parallel = true;
  }
  lutra_norm_desc nd = {.hidden = d->in_features,
                        .eps = d->eps,
                        .rms = d->normalization == LUTRA_NORM_RMSNORM,
                        .zero_centered_gamma = d->zero_centered_gamma != 0,
                        .dtype = d->dtype,
                        .device = d->device};
  lutra_linear_desc ld = {.in_features = local_in,
                          .out_features = local_out,
                          .bias = d->bias,
                          .dtype = d->dtype,
                          .device = d->device,
                          .accumulate_main_grad = d->accumulate_main_grad,
                          .seed = d->seed + (l->parallel ? (uint64_t)l->tp.rank : 0)};
  int st = lutra_norm_core_init(&l->norm, &nd, fn);
  if (st == LUTRA_OK) {
    st = lutra_linear_core_init(&l->lin, &ld, fn);
    if (st != LUTRA_OK) lutra_norm_core_release(&l->norm);
  }
  if (st != LUTRA_OK) {
    if (l->parallel) lutra_tp_release(&l->tp);
    free(l);
    return st;
  }
  l->return_ln = d->return_layernorm_output != 0;
  if (l->parallel) {
    l->lin.gather_fp8 = lutra_tp_gather_fp8;
    l->lin.gather_ctx = &l->tp;
  }
  l->lin.choice.kind = "layernorm_linear"; /* what a factory recipe is told */
  lutra_module_init(&l->base, &lnl_ops);
  *out = &l->base;
  return LUTRA_OK;
}

int lutra_layernorm_linear_new(const lutra_layernorm_linear_desc *d, lutra_module **out) {
  return lnl_create(d, NULL, out, "lutra_layernorm_linear_new");
}

int lutra_layernorm_linear_parallel_new(const lutra_layernorm_linear_desc *d,
                                        const lutra_tp_desc *tp, lutra_module **out) {
  static const char fn[] = "lutra_layernorm_linear_parallel_new";
  CHECK_ARG(tp, "tp desc is NULL");
  return lnl_create(d, tp, out, fn);
}

static int check_lnl(const lutra_module *m, const char *fn) {
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(m->ops == &lnl_ops, "module is a %s, not a layernorm_linear", m->ops->kind);
  return LUTRA_OK;
}

int lutra_layernorm_linear_ln_output(const lutra_module *m, lutra_tensor **out) {
  static const char fn[] = "lutra_layernorm_linear_ln_output";
  TRY(check_lnl(m, fn));
  CHECK_ARG(out, "out is NULL");
  const layernorm_linear *l = (const layernorm_linear *)m;
  CHECK_STATE(l->return_ln, "the module was made without return_layernorm_output");
  CHECK_STATE(l->norm.forward_done, "no forward has run yet");
  *out = l->norm.y;
  return LUTRA_OK;
}

int lutra_layernorm_linear_fused(const lutra_module *m, int *fused) {
  static const char fn[] = "lutra_layernorm_linear_fused";
  TRY(check_lnl(m, fn));
  CHECK_ARG(fused, "fused is NULL");
  *fused = ((const layernorm_linear *)m)->fused;
  return LUTRA_OK;
}

bool lutra_layernorm_linear_view(const lutra_module *m, lutra_norm_desc *norm,
                                 const lutra_tensor **fp8_weight) {
  if (m->ops != &lnl_ops) return false;
  const layernorm_linear *l = (const layernorm_linear *)m;
  *norm = l->norm.d;
  *fp8_weight = lutra_linear_core_fp8_weight(&l->lin);
  return true;
}
