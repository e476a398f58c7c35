/* The mixture-of-experts feed-forward (lutra/moe_mlp.h): a norm module, a router Linear, the
 * fused top-k, a dispatcher and the experts as a Sequential of GroupedLinear, activation,
 * GroupedLinear (so that the fusion protocol joins the activation to the experts' FP8 casts),
 * run in one C call. The module owns no kernels: it runs its pieces in the order
 * examples/train_moe.lua composes them, adds the router's input gradient to the experts' and
 * keeps that sum in one buffer of its own. */
#include "backend/backend.h"
#include "backend/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/object.h"
#include "nn/module.h"
#include "runtime/tensor.h"

#include <math.h>
#include <stdlib.h>

/* the pieces with parameters, in parameter and checkpoint order */
enum { NORM, ROUTER, FC1, FC2, NUM_PARTS };
static const char *const part_names[NUM_PARTS] = {"norm", "router", "fc1", "fc2"};

/* The router: a Linear that always runs in its own dtype, a leaf of kind "moe_router" whose
 * parameter is the Linear's weight ("weight"). Its forward enters a disabled autocast scope of
 * its own around the Linear's (an enabled scope outside leaves the router alone), and it owns
 * no quantizers, so checkpoints neither save nor expect FP8 state for it. */
typedef struct router_step {
  lutra_module base;
  lutra_module *linear;
  lutra_autocast *high_precision;
} router_step;

static int router_forward(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *a,
                          lutra_tensor **y) {
  router_step *r = (router_step *)m;
  TRY(lutra_autocast_enter(r->high_precision));
  int st = r->linear->ops->forward(r->linear, x, a, y);
  int exit_st = lutra_autocast_exit(r->high_precision);
  return st != LUTRA_OK ? st : exit_st;
}
static int router_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  lutra_module *l = ((router_step *)m)->linear;
  return l->ops->backward(l, dy, dx);
}
static int router_num_params(const lutra_module *m) {
  const lutra_module *l = ((const router_step *)m)->linear;
  return l->ops->num_params(l);
}
static int router_param(const lutra_module *m, int i, lutra_param *out) {
  const lutra_module *l = ((const router_step *)m)->linear;
  return l->ops->param(l, i, out);
}
static void router_release(lutra_module *m) {
  router_step *r = (router_step *)m;
  lutra_module_unref(r->linear);
  lutra_autocast_unref(r->high_precision);
  r->linear = NULL;
  r->high_precision = NULL;
}
static const lutra_checkpoint_ops router_checkpoint = {0}; /* a leaf: "weight", no FP8 */
static const lutra_module_ops router_ops = {
    .kind = "moe_router",
    .forward = router_forward,
    .backward = router_backward,
    .num_params = router_num_params,
    .param = router_param,
    .release = router_release,
    .checkpoint = &router_checkpoint,
};

static int router_new(const lutra_moe_mlp_desc *d, lutra_module **out) {
  static const char fn[] = "lutra_moe_mlp_new";
  router_step *r = calloc(1, sizeof *r);
  if (!r) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  lutra_linear_desc rd;
  lutra_linear_defaults(&rd);
  rd.in_features = d->hidden;
  rd.out_features = d->experts;
  rd.bias = 0;
  rd.dtype = d->dtype;
  rd.device = d->device;
  rd.accumulate_main_grad = d->accumulate_main_grad;
  rd.seed = d->seed;
  int st = lutra_linear_new(&rd, &r->linear);
  if (st == LUTRA_OK) st = lutra_autocast_new(NULL, NULL, 0, 0, &r->high_precision);
  if (st != LUTRA_OK) {
    router_release(&r->base);
    free(r);
    return st;
  }
  lutra_module_init(&r->base, &router_ops);
  *out = &r->base;
  return LUTRA_OK;
}

typedef struct moe_mlp {
  lutra_module base;
  lutra_moe_mlp_desc d;
  const lutra_backend *be;
  lutra_module *part[NUM_PARTS];
  lutra_module *experts;        /* Sequential(fc1, activation, fc2) */
  lutra_moe_router *topk;       /* softmax + top-k of the router's logits */
  lutra_moe_dispatch *dispatch; /* permute / unpermute */
  lutra_tensor *dnorm;          /* the norm output's gradient: experts' path + router's */
  /* the routing of the last forward: the top-k's and the dispatcher's own tensors */
  lutra_tensor *probs, *indices, *splits;
  bool forward_done;   /* the last forward ran to its end (its routing is readable) */
  bool backward_ready; /* ... with grad: a backward may start from it */
} moe_mlp;

static int moe_forward(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *a,
                       lutra_tensor **y) {
  static const char fn[] = "lutra_moe_mlp_forward";
  moe_mlp *e = (moe_mlp *)m;
  CHECK_ARG(!a->splits, "m_splits were given, but the MoE feed-forward routes its tokens itself");
  CHECK_ARG(x->scaling == LUTRA_SCALING_NONE && x->dtype == e->d.dtype,
            "input dtype %s does not match the module's %s", lutra_dtype_name(x->dtype),
            lutra_dtype_name(e->d.dtype));
  CHECK_ARG(x->ndim >= 2 && lutra_cols(x) == e->d.hidden,
            "input must be [.., %lld] (tokens: the leading dims), got %d dims with %lld columns",
            (long long)e->d.hidden, (int)x->ndim, (long long)lutra_cols(x));
  CHECK_ARG(x->device == e->d.device, "input is on another device than the module");
  e->forward_done = e->backward_ready = false; /* the routing pointers below are stale now */
  lutra_module *norm = e->part[NORM], *router = e->part[ROUTER];
  lutra_tensor *xn, *logits, *probs, *indices, *xp, *splits, *h;
  TRY(norm->ops->forward(norm, x, a, &xn));
  TRY(router->ops->forward(router, xn, a, &logits));
  TRY(lutra_moe_router_forward(e->topk, logits, &probs, &indices));
  TRY(lutra_moe_permute(e->dispatch, xn, indices, &xp, &splits));
  lutra_forward_args experts_args = *a;
  experts_args.splits = splits;
  TRY(e->experts->ops->forward(e->experts, xp, &experts_args, &h));
  TRY(lutra_moe_unpermute(e->dispatch, h, probs, y));
  e->probs = probs;
  e->indices = indices;
  e->splits = splits;
  e->forward_done = true;
  e->backward_ready = a->grad != 0;
  return LUTRA_OK;
}

/* dx NULL: x is data; the norm's parameter gradients are still computed */
static int moe_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  static const char fn[] = "lutra_moe_mlp_backward";
  moe_mlp *e = (moe_mlp *)m;
  CHECK_STATE(e->backward_ready, "backward called before a forward with grad");
  lutra_tensor *dh, *dprobs, *dxp, *from_experts, *dlogits, *from_router;
  TRY(lutra_moe_unpermute_backward(e->dispatch, dy, &dh, &dprobs));
  TRY(e->experts->ops->backward(e->experts, dh, &dxp));
  TRY(lutra_moe_permute_backward(e->dispatch, dxp, &from_experts));
  TRY(lutra_moe_router_backward(e->topk, dprobs, &dlogits));
  lutra_module *router = e->part[ROUTER], *norm = e->part[NORM];
  TRY(router->ops->backward(router, dlogits, &from_router));
  TRY(lutra_tensor_ensure(
      &e->dnorm,
      PLAIN_TENSOR(from_experts->dtype, from_experts->ndim, from_experts->shape, e->d.device), fn));
  int st = e->be->axpby(from_experts->data, 1.0f, from_router->data, 1.0f, e->dnorm->data,
                        e->dnorm->dtype, e->dnorm->numel);
  if (st != LUTRA_OK) return lutra_error_wrap(st, fn);
  return norm->ops->backward(norm, e->dnorm, dx);
}

static int moe_num_params(const lutra_module *m) {
  const moe_mlp *e = (const moe_mlp *)m;
  int n = 0;
  for (int i = 0; i < NUM_PARTS; i++)
    n += e->part[i]->ops->num_params(e->part[i]);
  return n;
}

static int moe_param(const lutra_module *m, int i, lutra_param *out) {
  const moe_mlp *e = (const moe_mlp *)m;
  for (int p = 0; p < NUM_PARTS; p++) {
    const lutra_module *c = e->part[p];
    int n = c->ops->num_params(c);
    if (i < n) return c->ops->param(c, i, out);
    i -= n;
  }
  return lutra_error(LUTRA_EINVAL, "lutra_module_param", "no parameter %d", i);
}

static void moe_release(lutra_module *m) {
  moe_mlp *e = (moe_mlp *)m;
  for (int i = 0; i < NUM_PARTS; i++) {
    lutra_module_unref(e->part[i]);
    e->part[i] = NULL;
  }
  lutra_module_unref(e->experts);
  lutra_moe_router_unref(e->topk);
  lutra_moe_dispatch_unref(e->dispatch);
  lutra_tensor_owner_drop(e->dnorm);
  e->experts = NULL;
  e->topk = NULL;
  e->dispatch = NULL;
  e->dnorm = NULL;
  e->probs = e->indices = e->splits = NULL;
  e->forward_done = e->backward_ready = false;
}

static int moe_num_children(const lutra_module *m) {
  (void)m;
  return NUM_PARTS;
}
static lutra_module *moe_child(const lutra_module *m, int i, const char **name) {
  *name = part_names[i];
  return ((const moe_mlp *)m)->part[i];
}
static const lutra_checkpoint_ops moe_checkpoint = {
    .num_children = moe_num_children,
    .child = moe_child,
};

static const lutra_module_ops moe_ops = {
    .kind = "moe_mlp",
    .forward = moe_forward,
    .backward = moe_backward,
    .num_params = moe_num_params,
    .param = moe_param,
    .release = moe_release,
    .checkpoint = &moe_checkpoint,
};

void lutra_moe_mlp_defaults(lutra_moe_mlp_desc *d) {
  if (!d) return;
  *d = (lutra_moe_mlp_desc){.normalization = LUTRA_NORM_LAYERNORM,
                            .activation = LUTRA_ACTIVATION_GELU_TANH,
                            .bias = 1,
                            .eps = 1e-5f,
                            .renormalize = 1,
                            .scaling_factor = 1.0f,
                            .dtype = LUTRA_F32,
                            .device = LUTRA_CPU};
  lutra_seed_next(&d->seed);
}

static bool gated(int act) {
  return act == LUTRA_ACTIVATION_SWIGLU || act == LUTRA_ACTIVATION_GEGLU ||
         act == LUTRA_ACTIVATION_REGLU;
}

static int check_desc(const lutra_moe_mlp_desc *d, const char *fn) {
  CHECK_ARG(d->hidden >= 1 && d->ffn_hidden >= 1,
            "hidden and ffn_hidden must be positive (got %lld, %lld)", (long long)d->hidden,
            (long long)d->ffn_hidden);
  CHECK_ARG(d->ffn_hidden <= INT64_MAX / 2, "ffn_hidden %lld is too large",
            (long long)d->ffn_hidden);
  CHECK_ARG(d->experts >= 1 && d->experts <= LUTRA_MOE_MAX_EXPERTS, "experts = %d is outside 1..%d",
            (int)d->experts, LUTRA_MOE_MAX_EXPERTS);
  CHECK_ARG(d->top_k >= 1 && d->top_k <= d->experts,
            "top_k = %d must be in 1..experts (%d): each token picks top_k distinct experts",
            (int)d->top_k, (int)d->experts);
  CHECK_ARG(d->normalization == LUTRA_NORM_LAYERNORM || d->normalization == LUTRA_NORM_RMSNORM,
            "normalization must be LUTRA_NORM_LAYERNORM or LUTRA_NORM_RMSNORM (got %d)",
            (int)d->normalization);
  CHECK_ARG(d->bias == 0 || d->bias == 1, "bias must be 0 or 1 (got %d)", (int)d->bias);
  CHECK_ARG(isfinite(d->eps) && d->eps > 0, "eps must be positive and finite");
  CHECK_ARG(d->device == LUTRA_CPU || d->dtype != LUTRA_F32,
            "dtype f32 on a device: the experts' grouped GEMMs, which read the routing's m_splits "
            "on the device, have no f32 kernels (use bf16)");
  return LUTRA_OK;
}

/* the pieces of d into e (each a new reference; on failure the error is set and the pieces
 * made so far stay in e for moe_release) */
static int make_parts(moe_mlp *e, const lutra_moe_mlp_desc *d) {
  lutra_norm_desc nd;
  lutra_norm_defaults(&nd);
  nd.hidden = d->hidden;
  nd.eps = d->eps;
  nd.rms = d->normalization == LUTRA_NORM_RMSNORM;
  nd.zero_centered_gamma = d->zero_centered_gamma;
  nd.dtype = d->dtype;
  nd.device = d->device;
  TRY(lutra_layernorm_new(&nd, &e->part[NORM]));
  TRY(router_new(d, &e->part[ROUTER]));
  lutra_grouped_linear_desc gd;
  lutra_grouped_linear_defaults(&gd);
  gd.num_gemms = d->experts;
  gd.bias = d->bias;
  gd.in_features = d->hidden;
  gd.out_features = gated(d->activation) ? 2 * d->ffn_hidden : d->ffn_hidden;
  gd.dtype = d->dtype;
  gd.device = d->device;
  gd.accumulate_main_grad = d->accumulate_main_grad;
  gd.seed = d->seed + 1;
  TRY(lutra_grouped_linear_new(&gd, &e->part[FC1]));
  gd.in_features = d->ffn_hidden;
  gd.out_features = d->hidden;
  gd.seed = d->seed + 1 + (uint64_t)d->experts;
  TRY(lutra_grouped_linear_new(&gd, &e->part[FC2]));
  lutra_module *act = NULL;
  TRY(lutra_activation_new(d->activation, &act));
  lutra_module *chain[3] = {e->part[FC1], act, e->part[FC2]};
  int st = lutra_sequential_new(chain, 3, &e->experts);
  lutra_module_unref(act); /* the Sequential holds it (or nothing does) */
  TRY(st);
  lutra_moe_router_desc td;
  lutra_moe_router_defaults(&td);
  td.experts = d->experts;
  td.k = d->top_k;
  td.renormalize = d->renormalize;
  td.scaling_factor = d->scaling_factor;
  td.device = d->device;
  TRY(lutra_moe_router_new(&td, &e->topk));
  TRY(lutra_moe_dispatch_new(d->experts, d->device, &e->dispatch));
  const lutra_backend *be;
  TRY(lutra_backend_get(d->device, &be, "lutra_moe_mlp_new"));
  e->be = be;
  return LUTRA_OK;
}

int lutra_moe_mlp_new(const lutra_moe_mlp_desc *d, lutra_module **out) {
  static const char fn[] = "lutra_moe_mlp_new";
  CHECK_ARG(d, "desc is NULL");
  CHECK_ARG(out, "out is NULL");
  TRY(check_desc(d, fn));
  moe_mlp *e = calloc(1, sizeof *e);
  if (!e) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  e->d = *d;
  int st = make_parts(e, d);
  if (st != LUTRA_OK) {
    st = lutra_error_wrap(st, fn);
    moe_release(&e->base);
    free(e);
    return st;
  }
  lutra_module_init(&e->base, &moe_ops);
  *out = &e->base;
  return LUTRA_OK;
}

static int check_moe(const lutra_module *m, const char *fn) {
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(m->ops == &moe_ops, "the module is a %s, not an MoE feed-forward (moe_mlp)",
            m->ops->kind);
  return LUTRA_OK;
}

int lutra_moe_mlp_desc_of(const lutra_module *m, lutra_moe_mlp_desc *out) {
  static const char fn[] = "lutra_moe_mlp_desc_of";
  TRY(check_moe(m, fn));
  CHECK_ARG(out, "out is NULL");
  *out = ((const moe_mlp *)m)->d;
  return LUTRA_OK;
}

int lutra_moe_mlp_routing(const lutra_module *m, lutra_tensor **probs, lutra_tensor **indices,
                          lutra_tensor **m_splits) {
  static const char fn[] = "lutra_moe_mlp_routing";
  TRY(check_moe(m, fn));
  CHECK_ARG(probs && indices && m_splits, "probs, indices and m_splits must not be NULL");
  const moe_mlp *e = (const moe_mlp *)m;
  CHECK_STATE(e->forward_done, "no forward has run");
  *probs = e->probs;
  *indices = e->indices;
  *m_splits = e->splits;
  return LUTRA_OK;
}
