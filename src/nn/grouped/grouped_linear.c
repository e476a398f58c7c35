/* GroupedLinear: num_gemms Linears whose inputs are consecutive row ranges of one matrix, run as
 * grouped backend calls (one quantization per role, one GEMM launch per pass) with the row
 * counts in backend memory, so that a device never waits for the host to learn them and a CUDA
 * graph replays with new splits. The parameters are separate tensors per expert, as a Linear's,
 * so that optimizers and checkpoints see num_gemms ordinary weights. */
#include "backend/device.h"
#include "backend/grouped_layout.h"
#include "core/capture.h"
#include "core/error.h"
#include "core/object.h"
#include "core/trace.h"
#include "fp8/autocast.h"
#include "nn/grouped/grouped_checkpoint.h"
#include "nn/grouped/grouped_fp8.h"
#include "nn/grouped/grouped_graphs.h"
#include "nn/grouped/grouped_host.h"
#include "nn/linear/linear_shared.h"
#include "runtime/tensor.h"

#include <stdlib.h>
#include <string.h>

static const lutra_module_ops grouped_ops;

static grouped_linear *grouped_of(lutra_module *m) {
  return (grouped_linear *)m;
}

/* the sum the host knows, checked before any work is queued */
static int check_host_splits(const grouped_linear *g, int64_t rows, const char *fn) {
  if (!g->splits_host_known) return LUTRA_OK;
  int64_t sum = 0;
  for (int e = 0; e < g->num; e++)
    sum += g->splits_host[e];
  CHECK_ARG(sum == rows, "m_splits sum to %lld, the input has %lld rows", (long long)sum,
            (long long)rows);
  return LUTRA_OK;
}

static int check_ready(const grouped_linear *g, const lutra_tensor *x, const char *fn) {
  CHECK_STATE(g->splits_set, "no m_splits for this forward: pass them to forward (the splits of "
                             "lutra_forward_args, which a Sequential hands to each of its "
                             "GroupedLinears) or set them first (lutra_grouped_set_splits)");
  CHECK_ARG(g->be->grouped_gemm && g->be->grouped_quantize,
            "the %s backend has no grouped GEMM in this build", g->be->name);
  return check_host_splits(g, lutra_rows(x), fn);
}

static int take_splits(grouped_linear *g, const lutra_tensor *s, int64_t rows, const char *fn);

/* The forward of x (the module's input), or, when pre is not NULL, of act_in(pre): x is then
 * g->act_y, the activation's output, written here unless the FP8 input cast forms it (*fused).
 * x (or pre) was checked against the module and a->splits taken. */
static int forward_impl(grouped_linear *g, const lutra_tensor *x, const lutra_tensor *pre,
                        int act_in, const lutra_forward_args *a, lutra_tensor **y, bool *fused,
                        const char *fn) {
  TRY(check_ready(g, x, fn));
  if (g->parallel) { /* no sequence parallelism: the ranks' shapes are checked, x is used as is */
    const lutra_tensor *gx;
    int32_t gather_rows;
    TRY(lutra_tp_forward_input(&g->tp, x, &gx, &gather_rows, fn));
  }
  const lutra_tls_state *s = lutra_autocast_current();
  const lutra_recipe *r = s->recipe;
  /* a factory recipe: the roles chosen for this module (asked for at its first forward) */
  if (r && (s->enabled || s->calibrating)) TRY(lutra_grouped_chosen_recipe(g, r, true, &r, fn));
  bool fp8 = r && s->enabled && r->roles[LUTRA_ROLE_INPUT].kind != LUTRA_QUANT_NONE;
  bool calibrate = r && !s->enabled && s->calibrating;
  /* act inside the split-quantize of the input where its scaling takes one (per-tensor) */
  const bool fuse_in = pre && fp8 && lutra_grouped_cast_takes_act(&r->roles[LUTRA_ROLE_INPUT]);
  const bool grad = a->grad != 0;
  int64_t rows = lutra_rows(x);
  /* f32 on a device: the grouped GEMMs have no f32 kernels (kernels/grouped_gemm_sm90.cu), so
   * host splits always take the per-expert path (device splits are refused by the backend) */
  const bool f32_device = g->dtype == LUTRA_F32 && g->device != LUTRA_CPU;
  const bool host =
      !fp8 && g->splits_host_known && (g->host_path == LUTRA_GROUPED_PATH_PER_EXPERT || f32_device);
  int64_t shape[LUTRA_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  shape[x->ndim - 1] = g->out;
  RANGE_PUSH("lutra.grouped_linear.forward");
  int st = lutra_tensor_ensure(&g->y, PLAIN_TENSOR(g->dtype, x->ndim, shape, g->device), fn);
  if (st == LUTRA_OK && pre && !fuse_in)
    st = lutra_linear_run_act(g->be, pre, act_in, g->act_y, fn);
  if (st == LUTRA_OK && fp8) {
    /* the activation's output in high precision only where a backward reads it: a recipe
     * without a grad_output quantizer runs the backward from the saved input */
    const bool hp = grad && r->roles[LUTRA_ROLE_GRAD_OUTPUT].kind == LUTRA_QUANT_NONE;
    const grouped_act act = {
        .pre = pre, .kind = act_in, .forward = true, .out = hp ? g->act_y : NULL};
    st = lutra_grouped_fp8_forward(g, x, r, a->is_first_microbatch, fuse_in ? &act : NULL, fn);
  } else if (st == LUTRA_OK && host) {
    if (calibrate) st = lutra_grouped_observe(g, x, r, fn);
    if (st == LUTRA_OK) st = lutra_grouped_host_forward(g, x, fn);
  } else if (st == LUTRA_OK) {
    if (calibrate) st = lutra_grouped_observe(g, x, r, fn);
    lutra_grouped_gemm_args ga;
    lutra_grouped_common(g, rows, &ga);
    lutra_grouped_forward_splits(g, &ga);
    ga.x = x->data;
    ga.y = g->y->data;
    if (st == LUTRA_OK) {
      st = g->be->grouped_gemm(&ga);
      if (st != LUTRA_OK) lutra_error_wrap(st, fn);
    }
  }
  lutra_tensor *yr = g->y;
  if (st == LUTRA_OK && g->parallel) st = lutra_tp_forward_output(&g->tp, g->y, &yr, fn);
  RANGE_POP();
  if (st != LUTRA_OK) return st;
  lutra_tensor_hold(&g->x, x);
  g->rows = rows;
  g->forward_fp8 = fp8;
  g->forward_host = host;
  g->forward_grad = grad;
  g->forward_done = true;
  g->backward_done = false;
  g->backward_trigger = g->forward_grad && (fp8 || calibrate) && lutra_grouped_uses_delayed(r) &&
                        lutra_autocast_claim_backward_trigger();
  if (fused) *fused = fuse_in;
  *y = yr;
  return LUTRA_OK;
}

static int grouped_forward(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *a,
                           lutra_tensor **y) {
  static const char fn[] = "lutra_grouped_forward";
  grouped_linear *g = grouped_of(m);
  TRY(lutra_linear_check_input(x, g->dtype, g->in, g->device, fn));
  if (a->splits) TRY(take_splits(g, a->splits, lutra_rows(x), fn));
  return forward_impl(g, x, NULL, LUTRA_ACT_NONE, a, y, NULL, fn);
}

static bool grouped_starts_with_act(const lutra_module *m, int act) {
  (void)m;
  return lutra_linear_takes_act(act);
}

static int grouped_forward_from_act(lutra_module *m, const lutra_tensor *pre,
                                    const lutra_forward_args *a, int act, lutra_tensor **y,
                                    const lutra_tensor **act_y, bool *fused) {
  static const char fn[] = "lutra_grouped_forward";
  grouped_linear *g = grouped_of(m);
  int64_t shape[LUTRA_MAX_DIMS];
  TRY(lutra_linear_check_act_input(pre, act, g->dtype, g->device, shape, fn));
  CHECK_ARG(shape[pre->ndim - 1] == g->in,
            "the activation's output has %lld features, the module expects %lld",
            (long long)shape[pre->ndim - 1], (long long)g->in);
  if (a->splits) TRY(take_splits(g, a->splits, lutra_rows(pre), fn));
  TRY(lutra_tensor_ensure(&g->act_y, PLAIN_TENSOR(g->dtype, pre->ndim, shape, g->device), fn));
  TRY(forward_impl(g, g->act_y, pre, act, a, y, fused, fn));
  *act_y = g->act_y;
  return LUTRA_OK;
}

static int backward_high_precision(grouped_linear *g, const lutra_tensor *dy, bool dx_wanted,
                                   const char *fn) {
  lutra_grouped_gemm_args ga;
  lutra_grouped_common(g, g->rows, &ga);
  ga.x = g->x->data;
  ga.dy = dy->data;
  if (dx_wanted) {
    ga.pass = LUTRA_GROUPED_DGRAD;
    ga.dx = g->dx->data;
    int st = g->be->grouped_gemm(&ga);
    if (st != LUTRA_OK) return lutra_error_wrap(st, fn);
  }
  return lutra_grouped_wgrad(g, &ga, g->has_bias ? g->ptrs + 3 * g->num : NULL, fn);
}

static bool starts_from_act_grad(const grouped_linear *g, int act) {
  /* tensor parallel: the activation's input is the collective's output, not this shard's */
  return !g->parallel && lutra_linear_takes_act_grad(
                             act, g->out, g->forward_done && g->forward_grad && g->forward_fp8,
                             lutra_grouped_cast_takes_act(&g->roles[LUTRA_ROLE_GRAD_OUTPUT].spec));
}

/* act_grad: the gradient dy is of activation act's output, act's input this module's output */
static int backward_impl(grouped_linear *g, const lutra_tensor *dy, int act_grad, lutra_tensor **dx,
                         const char *fn) {
  const lutra_linear_step step = {g->forward_done, g->forward_grad, g->backward_done,
                                  g->accumulate_main_grad};
  TRY(lutra_linear_check_backward(g->x, dy, g->dtype, g->device, step, fn));
  if (act_grad != LUTRA_ACT_NONE) {
    CHECK_ARG(starts_from_act_grad(g, act_grad),
              "this backward cannot apply the activation's gradient in its grad_output cast");
    TRY(lutra_linear_check_act_grad(dy, g->y, act_grad, fn));
  } else {
    CHECK_ARG(lutra_same_shape(dy, g->y), "grad_output shape does not match the forward output");
  }
  if (dx)
    TRY(lutra_tensor_ensure(&g->dx, PLAIN_TENSOR(g->dtype, g->x->ndim, g->x->shape, g->device),
                            fn));
  RANGE_PUSH("lutra.grouped_linear.backward");
  const grouped_act act = {.pre = g->y, .kind = act_grad, .forward = false};
  int st = g->forward_fp8 && g->roles[LUTRA_ROLE_GRAD_OUTPUT].spec.kind != LUTRA_QUANT_NONE
               ? lutra_grouped_fp8_backward(g, dy, dx != NULL,
                                            act_grad != LUTRA_ACT_NONE ? &act : NULL, fn)
           : g->forward_host ? lutra_grouped_host_backward(g, dy, dx != NULL, fn)
                             : backward_high_precision(g, dy, dx != NULL, fn);
  lutra_tensor *dxr = g->dx;
  if (st == LUTRA_OK && dx && g->parallel) st = lutra_tp_backward_output(&g->tp, g->dx, &dxr, fn);
  RANGE_POP();
  if (st != LUTRA_OK) return st;
  if (g->backward_trigger) {
    TRY(lutra_autocast_backward_done(fn));
    g->backward_trigger = false;
  }
  g->backward_done = true;
  if (dx) *dx = dxr;
  return LUTRA_OK;
}

static int grouped_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  return backward_impl(grouped_of(m), dy, LUTRA_ACT_NONE, dx, "lutra_grouped_backward");
}

static bool grouped_starts_from_act_grad(const lutra_module *m, int act) {
  return starts_from_act_grad((const grouped_linear *)m, act);
}

static int grouped_backward_from_act_grad(lutra_module *m, int act, const lutra_tensor *dy,
                                          lutra_tensor **dx) {
  return backward_impl(grouped_of(m), dy, act, dx, "lutra_grouped_backward");
}

/* GroupedLinear -> activation -> GroupedLinear (an expert MLP): the activation inside the
 * second one's input cast and its derivative inside the first one's grad_output cast (the
 * per-tensor recipes), else its own kernels; no GEMM epilogue (the grouped GEMMs have none). */
static const lutra_fusion_ops grouped_fusion = {
    .activation = LUTRA_ACT_NONE,
    .starts_from_act_grad = grouped_starts_from_act_grad,
    .backward_from_act_grad = grouped_backward_from_act_grad,
    .starts_with_act = grouped_starts_with_act,
    .forward_from_act = grouped_forward_from_act,
};

static int grouped_num_params(const lutra_module *m) {
  const grouped_linear *g = (const grouped_linear *)m;
  return g->num * (g->has_bias ? 2 : 1);
}

static int grouped_param(const lutra_module *m, int i, lutra_param *out) {
  const grouped_linear *g = (const grouped_linear *)m;
  int per = g->has_bias ? 2 : 1, e = i / per;
  if (i % per == 0)
    *out = (lutra_param){g->weight[e], g->wgrad[e],
                         g->weight_main_grad ? g->weight_main_grad[e] : NULL};
  else
    *out = (lutra_param){g->bias[e], g->bgrad[e], g->bias_main_grad ? g->bias_main_grad[e] : NULL};
  return LUTRA_OK;
}

static void destroy_all(lutra_tensor **ts, int n) {
  if (!ts) return;
  for (int i = 0; i < n; i++)
    lutra_tensor_owner_drop(ts[i]);
  free(ts);
}

static void grouped_release(lutra_module *m) {
  grouped_linear *g = grouped_of(m);
  lutra_factory_forget(&g->choice);
  lutra_grouped_fp8_release(g);
  lutra_grouped_graphs_free(g->graphs);
  g->graphs = NULL;
  if (g->call_graphs && g->be->call_graphs_free) g->be->call_graphs_free(g->call_graphs);
  g->call_graphs = NULL;
  lutra_tensor **sets[] = {g->weight,           g->bias,          g->wgrad, g->bgrad,
                           g->weight_main_grad, g->bias_main_grad};
  for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
    destroy_all(sets[i], g->num);
  g->weight = g->bias = g->wgrad = g->bgrad = g->weight_main_grad = g->bias_main_grad = NULL;
  if (g->ptrs) g->be->free(g->ptrs);
  if (g->scratch) g->be->free(g->scratch);
  g->ptrs = g->scratch = NULL;
  lutra_tensor_hold(&g->x, NULL); /* before the tensors: it may be act_y */
  lutra_tensor_hold(&g->splits_in, NULL);
  lutra_tensor *owned[] = {g->y, g->dx, g->act_y, g->splits_dev, g->bad_split};
  for (size_t i = 0; i < sizeof owned / sizeof *owned; i++)
    lutra_tensor_owner_drop(owned[i]);
  g->y = g->dx = g->act_y = g->splits_dev = g->bad_split = NULL;
  free(g->splits_host);
  g->splits_host = NULL;
  free(g->param_names);
  g->param_names = NULL;
  g->forward_done = g->splits_set = false;
  if (g->parallel) lutra_tp_release(&g->tp);
  g->parallel = false;
}

static lutra_module_choice *grouped_choice(lutra_module *m) {
  return &grouped_of(m)->choice;
}

static const lutra_module_ops grouped_ops = {
    .kind = "grouped_linear",
    .forward = grouped_forward,
    .backward = grouped_backward,
    .num_params = grouped_num_params,
    .param = grouped_param,
    .release = grouped_release,
    .fusion = &grouped_fusion,
    .checkpoint = &lutra_grouped_checkpoint,
    .takes_splits = true,
    .choice = grouped_choice,
};

/* ---- construction -------------------------------------------------------------------------- */

static int make(const grouped_linear *g, int64_t n0, int64_t n1, int dtype, lutra_tensor **t,
                const char *fn) {
  TRY(lutra_linear_make_param(g->device, n0, n1, dtype, t, fn));
  return lutra_tensor_fill(*t, 0.0f);
}

static int make_set(grouped_linear *g, int64_t n0, int64_t n1, int dtype, lutra_tensor ***set,
                    const char *fn) {
  *set = calloc((size_t)g->num, sizeof **set);
  if (!*set) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate %d tensors", g->num);
  for (int e = 0; e < g->num; e++)
    TRY(make(g, n0, n1, dtype, &(*set)[e], fn));
  return LUTRA_OK;
}

/* weights as torch initialises a Linear: uniform(-1/sqrt(in), 1/sqrt(in)), expert e from
 * seed + e (a Linear made with that seed starts from the same weights) */
static int init_params(grouped_linear *g, uint64_t seed, int64_t full_in) {
  for (int e = 0; e < g->num; e++)
    TRY(lutra_linear_init_params(g->weight[e], g->has_bias ? g->bias[e] : NULL, seed + (uint64_t)e,
                                 full_in));
  return LUTRA_OK;
}

/* the pointer arrays the grouped calls read: weights, biases, wgrad and bgrad outputs */
static int upload_ptrs(grouped_linear *g, const char *fn) {
  size_t bytes = 4 * (size_t)g->num * sizeof(void *);
  void **host = calloc(4 * (size_t)g->num, sizeof(void *));
  if (!host) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate pointer arrays");
  for (int e = 0; e < g->num; e++) {
    host[e] = g->weight[e]->data;
    host[g->num + e] = g->has_bias ? g->bias[e]->data : NULL;
    host[2 * g->num + e] = (g->accumulate_main_grad ? g->weight_main_grad : g->wgrad)[e]->data;
    host[3 * g->num + e] =
        g->has_bias ? (g->accumulate_main_grad ? g->bias_main_grad : g->bgrad)[e]->data : NULL;
  }
  int st = g->be->alloc(bytes, (void **)&g->ptrs);
  if (st == LUTRA_OK) st = g->be->from_host(g->ptrs, host, bytes);
  free(host);
  return st == LUTRA_OK ? LUTRA_OK : lutra_error_wrap(st, fn);
}

/* d: this rank's shard (the full layer's in_features full_in give the weights' bound) */
static int init(grouped_linear *g, const lutra_grouped_linear_desc *d, int64_t full_in,
                const char *fn) {
  int64_t in = d->in_features, out = d->out_features;
  TRY(make_set(g, out, in, g->dtype, &g->weight, fn));
  TRY(make_set(g, out, in, g->dtype, &g->wgrad, fn));
  if (g->has_bias) TRY(make_set(g, out, 0, g->dtype, &g->bias, fn));
  if (g->has_bias) TRY(make_set(g, out, 0, g->dtype, &g->bgrad, fn));
  if (g->accumulate_main_grad) {
    TRY(make_set(g, out, in, LUTRA_F32, &g->weight_main_grad, fn));
    if (g->has_bias) TRY(make_set(g, out, 0, LUTRA_F32, &g->bias_main_grad, fn));
  }
  TRY(init_params(g, d->seed, full_in));
  TRY(upload_ptrs(g, fn));
  TRY(lutra_grouped_param_names(g, fn));
  g->splits_host = calloc((size_t)g->num, sizeof *g->splits_host);
  if (!g->splits_host) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate splits");
  int64_t n = g->num, one = 1;
  lutra_tensor_spec spec = *PLAIN_TENSOR(LUTRA_I32, 1, &n, g->device);
  spec.flags = LUTRA_TENSOR_BORROWED;
  TRY(lutra_tensor_make(&spec, &g->splits_dev, fn));
  if (g->device != LUTRA_CPU) { /* the CPU refuses bad splits at once */
    spec.shape = &one;
    TRY(lutra_tensor_make(&spec, &g->bad_split, fn));
    TRY(g->be->memset(g->bad_split->data, 0, sizeof(int32_t)));
    size_t bytes = lutra_grouped_scratch_bytes(g->num, g->in, g->out);
    TRY(g->be->alloc(bytes, &g->scratch));
    TRY(g->be->memset(g->scratch, 0, bytes));
  }
  return LUTRA_OK;
}

void lutra_grouped_linear_defaults(lutra_grouped_linear_desc *d) {
  if (!d) return;
  *d = (lutra_grouped_linear_desc){.num_gemms = 1, .bias = 1, .dtype = LUTRA_F32};
  lutra_seed_next(&d->seed);
}

static int create(const lutra_grouped_linear_desc *d, const lutra_tp_desc *tp, lutra_module **out,
                  const char *fn) {
  CHECK_ARG(d, "desc is NULL");
  CHECK_ARG(out, "out is NULL");
  CHECK_ARG(d->num_gemms > 0 && d->num_gemms <= 65536, "num_gemms must be in 1..65536 (got %d)",
            (int)d->num_gemms);
  const lutra_backend *be;
  TRY(lutra_linear_check_desc(d->in_features, d->out_features, d->dtype, d->device, &be, fn));
  grouped_linear *g = calloc(1, sizeof *g);
  if (!g) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  *g = (grouped_linear){.num = d->num_gemms,
                        .in = d->in_features,
                        .out = d->out_features,
                        .dtype = d->dtype,
                        .device = d->device,
                        .has_bias = d->bias != 0,
                        .accumulate_main_grad = d->accumulate_main_grad != 0,
                        .be = be};
  lutra_grouped_linear_desc local = *d;
  int st = LUTRA_OK;
  if (tp) {
    st = lutra_tp_init(&g->tp, tp, d->in_features, d->out_features, d->dtype, d->device,
                       &local.in_features, &local.out_features, fn);
    g->parallel = st == LUTRA_OK;
    if (st == LUTRA_OK) {
      /* expert e of rank r from seed + e + num r: the shards' draws do not repeat */
      local.seed = d->seed + (uint64_t)g->tp.rank * (uint64_t)d->num_gemms;
      g->in = local.in_features;
      g->out = local.out_features;
      g->skip_forward_bias = tp->mode == LUTRA_TP_ROW && g->tp.rank != 0;
    }
  }
  g->choice.kind = "grouped_linear"; /* what a factory recipe is told */
  if (st == LUTRA_OK) st = init(g, &local, d->in_features, fn);
  if (st != LUTRA_OK) {
    grouped_release(&g->base);
    free(g);
    return st;
  }
  lutra_module_init(&g->base, &grouped_ops);
  *out = &g->base;
  return LUTRA_OK;
}

int lutra_grouped_linear_new(const lutra_grouped_linear_desc *d, lutra_module **out) {
  return create(d, NULL, out, "lutra_grouped_linear_new");
}

int lutra_grouped_linear_parallel_new(const lutra_grouped_linear_desc *d, const lutra_tp_desc *tp,
                                      lutra_module **out) {
  static const char fn[] = "lutra_grouped_linear_parallel_new";
  CHECK_ARG(tp, "tp desc is NULL");
  CHECK_ARG(!tp->sequence_parallel, "sequence parallelism is not supported (the experts' rows "
                                    "are the tokens routed to them, not a slice of the sequence)");
  return create(d, tp, out, fn);
}

/* ---- splits -------------------------------------------------------------------------------- */

static int check_grouped(const lutra_module *m, const char *fn) {
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(m->ops == &grouped_ops, "module is a %s, not a grouped_linear", m->ops->kind);
  return LUTRA_OK;
}

/* rows >= 0: the input's rows, which host splits must sum to (checked before anything changes) */
static int check_splits(const grouped_linear *g, const lutra_tensor *s, int64_t rows,
                        const char *fn) {
  TRY(lutra_check_tensor(s, fn, "m_splits"));
  CHECK_ARG(s->dtype == LUTRA_I32, "m_splits must be an i32 tensor (got %s)",
            lutra_dtype_name(s->dtype));
  CHECK_ARG(s->numel == g->num, "m_splits has %lld elements, the module has %d experts",
            (long long)s->numel, (int)g->num);
  CHECK_ARG(s->device == LUTRA_CPU || s->device == g->device,
            "m_splits must be on the CPU (host splits) or on the module's device");
  if (s->device != LUTRA_CPU) return LUTRA_OK;
  const int32_t *v = s->data;
  int64_t sum = 0;
  for (int e = 0; e < g->num; e++) {
    CHECK_ARG(v[e] >= 0, "m_splits[%d] is %d: a split must be >= 0", e, (int)v[e]);
    sum += v[e];
  }
  CHECK_ARG(rows < 0 || sum == rows, "m_splits sum to %lld, the input has %lld rows",
            (long long)sum, (long long)rows);
  return LUTRA_OK;
}

static int set_splits(grouped_linear *g, const lutra_tensor *s, const char *fn) {
  TRY(check_splits(g, s, -1, fn));
  size_t bytes = (size_t)g->num * sizeof(int32_t);
  if (s->device == LUTRA_CPU) {
    const int32_t *v = s->data;
    CHECK_STATE(!(LUTRA_CAPTURING() && g->device != LUTRA_CPU),
                "host m_splits while capturing a CUDA graph would be replayed unchanged: pass "
                "the splits as a device tensor");
    /* staged: the host does not wait for the device's queue to drain */
    TRY((g->be->from_host_async ? g->be->from_host_async : g->be->from_host)(g->splits_dev->data, v,
                                                                             bytes));
    memcpy(g->splits_host, v, bytes);
    g->splits_host_known = true;
    lutra_tensor_hold(&g->splits_in, NULL);
  } else {
    /* read in place by the forward, whose GEMM keeps the copy a backward reads */
    if (LUTRA_CAPTURING()) TRY(lutra_capture_hold_tensor(s, fn));
    lutra_tensor_hold(&g->splits_in, s);
    g->splits_host_known = false;
  }
  g->splits_set = true;
  g->forward_done = false; /* a backward needs the forward of these splits */
  return LUTRA_OK;
}

/* what a forward is given: checked against the input's rows before anything changes */
static int take_splits(grouped_linear *g, const lutra_tensor *s, int64_t rows, const char *fn) {
  TRY(check_splits(g, s, rows, fn));
  return set_splits(g, s, fn);
}

int lutra_grouped_set_splits(lutra_module *m, const lutra_tensor *splits) {
  static const char fn[] = "lutra_grouped_set_splits";
  TRY(check_grouped(m, fn));
  return set_splits(grouped_of(m), splits, fn);
}

int lutra_grouped_forward(lutra_module *m, const lutra_tensor *x, const lutra_tensor *splits,
                          const lutra_forward_args *a, lutra_tensor **y) {
  static const char fn[] = "lutra_grouped_forward";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  TRY(lutra_check_tensor(x, fn, "input"));
  CHECK_ARG(a, "args is NULL (lutra_forward_defaults gives the defaults)");
  CHECK_ARG(y, "y is NULL");
  TRY(lutra_check_tensor(splits, fn, "m_splits"));
  CHECK_ARG(lutra_module_takes_splits(m),
            "a %s takes no m_splits (a GroupedLinear does, and a Sequential holding one)",
            m->ops->kind);
  lutra_forward_args with = *a;
  with.splits = splits;
  if (m->ops == &grouped_ops) {
    /* what can be checked before the splits are replaced is, so that a refused call changes
     * nothing (a bad device split is found on the device) */
    grouped_linear *g = grouped_of(m);
    TRY(lutra_linear_check_input(x, g->dtype, g->in, g->device, fn));
    TRY(take_splits(g, splits, lutra_rows(x), fn));
    with.splits = NULL;
  }
  return lutra_module_forward_ex(m, x, &with, y);
}

int lutra_grouped_check(lutra_module *m) {
  static const char fn[] = "lutra_grouped_check";
  TRY(check_grouped(m, fn));
  grouped_linear *g = grouped_of(m);
  if (!g->bad_split) return LUTRA_OK;
  int32_t bad = 0;
  TRY(g->be->to_host(&bad, g->bad_split->data, sizeof bad));
  if (!bad) return LUTRA_OK;
  TRY(g->be->memset(g->bad_split->data, 0, sizeof bad));
  return lutra_error(LUTRA_EINVAL, fn,
                     "device m_splits of a call since the last check had a split < 0 or did not "
                     "sum to the input's rows: its outputs are undefined");
}

int lutra_grouped_set_path(lutra_module *m, int path) {
  static const char fn[] = "lutra_grouped_set_path";
  TRY(check_grouped(m, fn));
  CHECK_ARG(path == LUTRA_GROUPED_PATH_GROUPED || path == LUTRA_GROUPED_PATH_PER_EXPERT,
            "path must be LUTRA_GROUPED_PATH_GROUPED (0) or _PER_EXPERT (1), got %d", path);
  grouped_linear *g = grouped_of(m);
  g->host_path = path;
  g->forward_done = false; /* a backward takes the path of its forward */
  return LUTRA_OK;
}

int lutra_grouped_num_gemms(const lutra_module *m, int *n) {
  static const char fn[] = "lutra_grouped_num_gemms";
  TRY(check_grouped(m, fn));
  CHECK_ARG(n, "n is NULL");
  *n = ((const grouped_linear *)m)->num;
  return LUTRA_OK;
}
