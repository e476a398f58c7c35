/* LayerNormMLP: norm -> FC1 -> activation -> FC2 as a Sequential of a LayerNormLinear, an
 * activation module and a Linear, so that every fusion the fusion protocol knows between a
 * linear-like producer, an activation and a Linear consumer applies (the tanh GELU in FC1's
 * epilogue, its derivative in FC2's dgrad or FC1's grad_output cast), with no code of its own:
 * the module only names the pieces and forwards to the chain. Tensor-parallel
 * (lutra_layernorm_mlp_parallel_new): the same chain of a column-parallel LayerNormLinear, the
 * activation on its shard and a row-parallel Linear (lutra/tp_modules.h states the layout). */
#include "core/error.h"
#include "core/object.h"
#include "fp8/quantizer.h"
#include "nn/export_view.h"
#include "nn/module.h"
#include "parallel/group.h"

#include <stdlib.h>

typedef struct layernorm_mlp {
  lutra_module base;
  lutra_module *chain; /* the Sequential */
} layernorm_mlp;

static int mlp_forward(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *a,
                       lutra_tensor **y) {
  lutra_module *c = ((layernorm_mlp *)m)->chain;
  return c->ops->forward(c, x, a, y);
}
static int mlp_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  lutra_module *c = ((layernorm_mlp *)m)->chain;
  return c->ops->backward(c, dy, dx);
}
/* a Residual's sums: FC2's GEMM forward, the norm's kernel backward (the chain arms them) */
static bool mlp_arm_residual(lutra_module *m, int pass, const lutra_tensor *r, lutra_tensor *out) {
  return lutra_module_arm_residual(((layernorm_mlp *)m)->chain, pass, r, out);
}
static const lutra_fusion_ops mlp_fusion = {.activation = LUTRA_ACT_NONE,
                                            .arm_residual = mlp_arm_residual};

static int mlp_num_params(const lutra_module *m) {
  const lutra_module *c = ((const layernorm_mlp *)m)->chain;
  return c->ops->num_params(c);
}
static int mlp_param(const lutra_module *m, int i, lutra_param *out) {
  const lutra_module *c = ((const layernorm_mlp *)m)->chain;
  return c->ops->param(c, i, out);
}
static void mlp_release(lutra_module *m) {
  layernorm_mlp *l = (layernorm_mlp *)m;
  lutra_module_unref(l->chain);
  l->chain = NULL;
}

/* Checkpoint names, one level as TE's LayerNormMLP (layer_norm_weight, fc1_weight, ...) in the
 * dotted style: "norm.weight" ("norm.bias"), "fc1.weight", "fc1.bias", "fc2.weight",
 * "fc2.bias"; quantizers "fp8.fc1.input", ..., "fp8.fc2.grad_output". The pieces are the
 * chain's LayerNormLinear (norm + FC1) and Linear (FC2), asked through their own entries. */
static lutra_module *part(const lutra_module *m, int i) {
  const lutra_module *c = ((const layernorm_mlp *)m)->chain;
  const char *unused;
  return c->ops->checkpoint->child(c, i, &unused);
}

static const char *mlp_param_name(const lutra_module *m, int i) {
  static const char *const fc1[] = {"fc1.weight", "fc1.bias"}, *const fc2[] = {"fc2.weight",
                                                                               "fc2.bias"};
  const lutra_module *p0 = part(m, 0);
  int n0 = p0->ops->num_params(p0);
  if (i >= n0) return fc2[i - n0];
  const char *name = p0->ops->checkpoint->param_name(p0, i);
  /* the LayerNormLinear's "norm.*" stay, its Linear's "weight", "bias" are FC1's */
  return name[0] == 'n' ? name : fc1[name[0] == 'b'];
}

static const char *const quantizer_names[2][LUTRA_NUM_ROLES] = {
    {"fc1.input", "fc1.weight", "fc1.grad_output"}, {"fc2.input", "fc2.weight", "fc2.grad_output"}};

/* slots: FC1's role r is r, FC2's LUTRA_NUM_ROLES + r */
static int mlp_quantizers(lutra_module *m, const lutra_recipe *build_for,
                          lutra_module_quantizers *out, const char *fn) {
  lutra_module_quantizers q[2] = {{0}, {0}};
  for (int k = 0; k < 2; k++) {
    lutra_module *p = part(m, 2 * k);
    int st = p->ops->checkpoint->quantizers(p, build_for, &q[k], fn);
    if (st != LUTRA_OK) {
      if (k == 1 && q[0].fresh)
        for (int i = 0; i < q[0].count; i++)
          lutra_quantizer_owner_drop(q[0].q[i]);
      return st;
    }
  }
  if (q[0].fresh != q[1].fresh) { /* both are built by one forward: never the case */
    for (int k = 0; k < 2; k++)
      for (int i = 0; q[k].fresh && i < q[k].count; i++)
        lutra_quantizer_owner_drop(q[k].q[i]);
    return lutra_error(LUTRA_ESTATE, fn, "the LayerNormMLP's FC1 and FC2 quantizers differ");
  }
  out->fresh = q[0].fresh;
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < q[k].count; i++) {
      out->name[out->count] = quantizer_names[k][q[k].slot[i]];
      out->slot[out->count] = k * LUTRA_NUM_ROLES + q[k].slot[i];
      out->q[out->count++] = q[k].q[i];
    }
  return LUTRA_OK;
}

static void mlp_adopt_quantizers(lutra_module *m, const lutra_recipe *r,
                                 const lutra_module_quantizers *q) {
  for (int k = 0; k < 2; k++) {
    lutra_module_quantizers mine = {.fresh = true};
    for (int i = 0; i < q->count; i++)
      if (q->slot[i] / LUTRA_NUM_ROLES == k) {
        mine.name[mine.count] = q->name[i];
        mine.slot[mine.count] = q->slot[i] % LUTRA_NUM_ROLES;
        mine.q[mine.count++] = q->q[i];
      }
    lutra_module *p = part(m, 2 * k);
    p->ops->checkpoint->adopt_quantizers(p, r, &mine);
  }
}

static bool mlp_in_window(const lutra_module *m) {
  for (int k = 0; k < 2; k++) {
    const lutra_module *p = part(m, 2 * k);
    if (p->ops->checkpoint->in_accumulation_window(p)) return true;
  }
  return false;
}

static const lutra_checkpoint_ops mlp_checkpoint = {
    .param_name = mlp_param_name,
    .quantizers = mlp_quantizers,
    .adopt_quantizers = mlp_adopt_quantizers,
    .in_accumulation_window = mlp_in_window,
};

static const lutra_module_ops mlp_ops = {
    .kind = "layernorm_mlp",
    .forward = mlp_forward,
    .backward = mlp_backward,
    .num_params = mlp_num_params,
    .param = mlp_param,
    .release = mlp_release,
    .fusion = &mlp_fusion,
    .checkpoint = &mlp_checkpoint,
};

void lutra_layernorm_mlp_defaults(lutra_layernorm_mlp_desc *d) {
  if (!d) return;
  *d = (lutra_layernorm_mlp_desc){.activation = LUTRA_ACTIVATION_GELU_TANH,
                                  .bias = 1,
                                  .eps = 1e-5f,
                                  .dtype = LUTRA_F32,
                                  .device = LUTRA_CPU};
  lutra_seed_next(&d->seed);
}

static bool gated(int act) {
  return act == LUTRA_ACTIVATION_SWIGLU || act == LUTRA_ACTIVATION_GEGLU ||
         act == LUTRA_ACTIVATION_REGLU;
}

static int mlp_create(const lutra_layernorm_mlp_desc *d, const lutra_tp_desc *tp,
                      lutra_module **out, const char *fn) {
  CHECK_ARG(d, "desc is NULL");
  CHECK_ARG(out, "out is NULL");
  CHECK_ARG(d->hidden > 0 && d->ffn_hidden > 0,
            "hidden and ffn_hidden must be positive (got %lld, %lld)", (long long)d->hidden,
            (long long)d->ffn_hidden);
  CHECK_ARG(d->ffn_hidden <= INT64_MAX / 2, "ffn_hidden %lld is too large",
            (long long)d->ffn_hidden);
  lutra_layernorm_linear_desc d1 = {.in_features = d->hidden,
                                    .out_features =
                                        gated(d->activation) ? 2 * d->ffn_hidden : d->ffn_hidden,
                                    .normalization = d->normalization,
                                    .bias = d->bias,
                                    .zero_centered_gamma = d->zero_centered_gamma,
                                    .eps = d->eps,
                                    .dtype = d->dtype,
                                    .device = d->device,
                                    .accumulate_main_grad = d->accumulate_main_grad,
                                    .seed = d->seed};
  lutra_linear_desc d2 = {.in_features = d->ffn_hidden,
                          .out_features = d->hidden,
                          .bias = d->bias,
                          .dtype = d->dtype,
                          .device = d->device,
                          .accumulate_main_grad = d->accumulate_main_grad,
                          .seed = d->seed + 1};
  lutra_tp_desc tp1, tp2;
  if (tp) {
    CHECK_ARG(tp->mode == LUTRA_TP_NONE,
              "the parallel mode must be LUTRA_TP_NONE (%d), got %d: FC1 is column- and FC2 "
              "row-parallel",
              LUTRA_TP_NONE, (int)tp->mode);
    TRY(lutra_group_check(tp->group, fn));
    int size = lutra_group_size_of(tp->group);
    CHECK_ARG(d->ffn_hidden % size == 0, "ffn_hidden %lld is not a multiple of the group size %d",
              (long long)d->ffn_hidden, size);
    tp1 = (lutra_tp_desc){LUTRA_TP_COLUMN, tp->sequence_parallel, tp->group};
    tp2 = (lutra_tp_desc){LUTRA_TP_ROW, tp->sequence_parallel, tp->group};
  }
  lutra_module *parts[3] = {NULL, NULL, NULL};
  int st = lutra_activation_new(d->activation, &parts[1]);
  if (st != LUTRA_OK) st = lutra_error_wrap(st, fn);
  if (st == LUTRA_OK)
    st = tp ? lutra_layernorm_linear_parallel_new(&d1, &tp1, &parts[0])
            : lutra_layernorm_linear_new(&d1, &parts[0]);
  if (st == LUTRA_OK)
    st = tp ? lutra_linear_parallel_new(&d2, &tp2, &parts[2]) : lutra_linear_new(&d2, &parts[2]);
  lutra_module *chain = NULL;
  if (st == LUTRA_OK) st = lutra_sequential_new(parts, 3, &chain);
  /* the Sequential holds its own references to the parts */
  for (int i = 0; i < 3; i++)
    if (parts[i]) lutra_module_unref(parts[i]);
  layernorm_mlp *l = st == LUTRA_OK ? calloc(1, sizeof *l) : NULL;
  if (st == LUTRA_OK && !l) st = lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  if (st != LUTRA_OK) {
    if (chain) lutra_module_unref(chain);
    return st;
  }
  l->chain = chain;
  lutra_module_init(&l->base, &mlp_ops);
  *out = &l->base;
  return LUTRA_OK;
}

int lutra_layernorm_mlp_new(const lutra_layernorm_mlp_desc *d, lutra_module **out) {
  return mlp_create(d, NULL, out, "lutra_layernorm_mlp_new");
}

int lutra_layernorm_mlp_parallel_new(const lutra_layernorm_mlp_desc *d, const lutra_tp_desc *tp,
                                     lutra_module **out) {
  static const char fn[] = "lutra_layernorm_mlp_parallel_new";
  CHECK_ARG(tp, "tp desc is NULL");
  return mlp_create(d, tp, out, fn);
}

int lutra_layernorm_mlp_fusions(const lutra_module *m, int *forward, int *backward) {
  static const char fn[] = "lutra_layernorm_mlp_fusions";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(m->ops == &mlp_ops, "module is a %s, not a layernorm_mlp", m->ops->kind);
  return lutra_sequential_fusions(((const layernorm_mlp *)m)->chain, forward, backward);
}

const lutra_module *lutra_layernorm_mlp_chain_view(const lutra_module *m) {
  return m->ops == &mlp_ops ? ((const layernorm_mlp *)m)->chain : NULL;
}
