/* LayerNormMLP: norm -> FC1 -> activation -> FC2 as a Sequential of a LayerNormLinear, an
 * activation module and a Linear, so that every fusion the fusion protocol knows between a
 * linear-like producer, an activation and a Linear consumer applies (the tanh GELU in FC1's
 * epilogue, its derivative in FC2's dgrad or FC1's grad_output cast), with no code of its own:
 * the module only names the pieces and forwards to the chain. */
#include "core/error.h"
#include "core/object.h"
#include "nn/module.h"

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
  lutra_module_free(l->chain);
  l->chain = NULL;
}

static const lutra_module_ops mlp_ops = {
    .kind = "layernorm_mlp",
    .forward = mlp_forward,
    .backward = mlp_backward,
    .num_params = mlp_num_params,
    .param = mlp_param,
    .release = mlp_release,
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

int lutra_layernorm_mlp_new(const lutra_layernorm_mlp_desc *d, lutra_module **out) {
  static const char fn[] = "lutra_layernorm_mlp_new";
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
  lutra_module *parts[3] = {NULL, NULL, NULL};
  int st = lutra_activation_new(d->activation, &parts[1]);
  if (st != LUTRA_OK) st = lutra_error_wrap(st, fn);
  if (st == LUTRA_OK) st = lutra_layernorm_linear_new(&d1, &parts[0]);
  if (st == LUTRA_OK) st = lutra_linear_new(&d2, &parts[2]);
  lutra_module *chain = NULL;
  if (st == LUTRA_OK) st = lutra_sequential_new(parts, 3, &chain);
  /* the Sequential holds its own references to the parts */
  for (int i = 0; i < 3; i++)
    if (parts[i]) lutra_module_free(parts[i]);
  layernorm_mlp *l = st == LUTRA_OK ? calloc(1, sizeof *l) : NULL;
  if (st == LUTRA_OK && !l) st = lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  if (st != LUTRA_OK) {
    if (chain) lutra_module_free(chain);
    return st;
  }
  l->chain = chain;
  lutra_module_init(&l->base, &mlp_ops);
  *out = &l->base;
  return LUTRA_OK;
}

int lutra_layernorm_mlp_fusions(const lutra_module *m, int *forward, int *backward) {
  static const char fn[] = "lutra_layernorm_mlp_fusions";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(m->ops == &mlp_ops, "module is a %s, not a layernorm_mlp", m->ops->kind);
  return lutra_sequential_fusions(((const layernorm_mlp *)m)->chain, forward, backward);
}
