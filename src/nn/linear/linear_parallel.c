/* Tensor-parallel Linear (lutra_linear_parallel_new): the Linear core on this rank's shard with
 * the collectives of nn/tp.h around it. */
#include "core/error.h"
#include "core/object.h"
#include "core/trace.h"
#include "nn/linear/linear_core.h"
#include "nn/module.h"
#include "nn/tp.h"

#include <math.h>
#include <stdlib.h>

typedef struct linear_parallel {
  lutra_module base;
  lutra_linear_core core;
  lutra_tp tp;
} linear_parallel;

static linear_parallel *of(lutra_module *m) {
  return (linear_parallel *)m;
}
static const linear_parallel *const_of(const lutra_module *m) {
  return (const linear_parallel *)m;
}

static int lp_forward(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *a,
                      lutra_tensor **y) {
  static const char fn[] = "lutra_linear_parallel_forward";
  linear_parallel *l = of(m);
  RANGE_PUSH("lutra.linear_parallel.forward");
  const lutra_tensor *gx;
  lutra_tensor *partial;
  int st = lutra_tp_forward_input(&l->tp, x, &gx, &l->core.gather_rows, fn);
  if (st == LUTRA_OK) st = lutra_linear_core_forward(&l->core, gx, a, LUTRA_ACT_NONE, &partial, fn);
  if (st == LUTRA_OK) st = lutra_tp_forward_output(&l->tp, partial, y, fn);
  RANGE_POP();
  return st;
}

static int lp_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  static const char fn[] = "lutra_linear_parallel_backward";
  linear_parallel *l = of(m);
  RANGE_PUSH("lutra.linear_parallel.backward");
  const lutra_tensor *gdy;
  lutra_tensor *partial = NULL;
  int st = lutra_tp_backward_input(&l->tp, dy, &gdy, fn);
  if (st == LUTRA_OK)
    st = lutra_linear_core_backward(&l->core, &(lutra_linear_backward_op){.dy = gdy},
                                    dx ? &partial : NULL, NULL, fn);
  if (st == LUTRA_OK && dx) st = lutra_tp_backward_output(&l->tp, partial, dx, fn);
  RANGE_POP();
  return st;
}

static int lp_num_params(const lutra_module *m) {
  return lutra_linear_core_num_params(&const_of(m)->core);
}

static int lp_param(const lutra_module *m, int i, lutra_param *out) {
  lutra_linear_core_param(&const_of(m)->core, i, out);
  return LUTRA_OK;
}

static void lp_release(lutra_module *m) {
  lutra_linear_core_release(&of(m)->core);
  lutra_tp_release(&of(m)->tp);
}

/* A checkpoint of a tensor-parallel Linear holds this rank's shard: "weight" [out/P, in] (column)
 * or [out, in/P] (row), "bias" as the rank keeps it, and the core's quantizers; each rank saves
 * and loads its own file, into a model sharded the same way. */
static int lp_quantizers(lutra_module *m, const lutra_recipe *build_for,
                         lutra_module_quantizers *out, const char *fn) {
  return lutra_linear_core_quantizers(&of(m)->core, build_for, NULL, out, fn);
}

static void lp_adopt_quantizers(lutra_module *m, const lutra_recipe *r,
                                const lutra_module_quantizers *q) {
  lutra_linear_core_adopt_quantizers(&of(m)->core, r, q);
}

static bool lp_in_window(const lutra_module *m) {
  return lutra_linear_core_in_accumulation_window(&const_of(m)->core);
}

static const lutra_checkpoint_ops lp_checkpoint = {
    .quantizers = lp_quantizers,
    .adopt_quantizers = lp_adopt_quantizers,
    .in_accumulation_window = lp_in_window,
};

static lutra_module_choice *lp_choice(lutra_module *m) {
  return &of(m)->core.choice;
}

static const lutra_module_ops linear_parallel_ops = {
    .kind = "linear_parallel",
    .forward = lp_forward,
    .backward = lp_backward,
    .num_params = lp_num_params,
    .param = lp_param,
    .release = lp_release,
    .fusion = NULL,
    .checkpoint = &lp_checkpoint,
    .choice = lp_choice,
};

int lutra_linear_parallel_new(const lutra_linear_desc *d, const lutra_tp_desc *tp,
                              lutra_module **out) {
  static const char fn[] = "lutra_linear_parallel_new";
  CHECK_ARG(d, "desc is NULL");
  CHECK_ARG(out, "out is NULL");
  CHECK_ARG(d->in_features > 0 && d->out_features > 0,
            "in_features and out_features must be positive (got %lld, %lld)",
            (long long)d->in_features, (long long)d->out_features);
  CHECK_ARG(!d->tie, "a tensor-parallel Linear holds a shard of its weight: it cannot be tied");
  linear_parallel *l = calloc(1, sizeof *l);
  if (!l) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  lutra_linear_desc local = *d;
  int st = lutra_tp_init(&l->tp, tp, d->in_features, d->out_features, d->dtype, d->device,
                         &local.in_features, &local.out_features, fn);
  if (st != LUTRA_OK) {
    free(l);
    return st;
  }
  local.seed = d->seed + (uint64_t)l->tp.rank;
  st = lutra_linear_core_init(&l->core, &local, fn);
  if (st == LUTRA_OK) {
    /* the full layer's bound, as the unsharded module draws its weights */
    float bound = (float)(1.0 / sqrt((double)d->in_features));
    st = lutra_tensor_uniform(l->core.weight, local.seed, -bound, bound);
    if (st == LUTRA_OK && l->core.bias && tp->mode == LUTRA_TP_ROW)
      st = lutra_tensor_uniform(l->core.bias, d->seed ^ 0x5bd1e995u, -bound, bound);
    else if (st == LUTRA_OK && l->core.bias)
      st = lutra_tensor_uniform(l->core.bias, local.seed ^ 0x5bd1e995u, -bound, bound);
    if (st != LUTRA_OK) lutra_linear_core_release(&l->core);
  }
  if (st != LUTRA_OK) {
    lutra_tp_release(&l->tp);
    free(l);
    return st;
  }
  /* a row-parallel bias is whole on every rank: added once, by rank 0, before the reduction */
  l->core.skip_forward_bias = tp->mode == LUTRA_TP_ROW && l->tp.rank != 0;
  l->core.gather_fp8 = lutra_tp_gather_fp8;
  l->core.gather_ctx = &l->tp;
  l->core.choice.kind = "linear_parallel"; /* what a factory recipe is told */
  lutra_module_init(&l->base, &linear_parallel_ops);
  *out = &l->base;
  return LUTRA_OK;
}
