/* Sequential: runs its children in order, and their backward in reverse, in one C call.
 *
 * Neighbours are joined through the fusion protocol (nn/module.h), never by reading their state:
 * a module whose forward can end in the activation after it runs both (a Linear: one GEMM with
 * the GELU in its epilogue, the pre-activation kept for backward), and the module right after
 * such an activation applies its derivative in its own backward (a Linear: in the dgrad GEMM),
 * so the activation costs no pass over memory of its own in either direction, as in
 * TransformerEngine's LayerNormMLP (whose FP8 backward puts the derivative in a cast instead;
 * lutra's FP8 dgrad GEMM with per-tensor scaling takes DGELU where cuBLASLt's plan has it). Where
 * that backward cannot (a block-scaled FP8 GEMM, or a plan without DGELU), the producer may
 * start its backward from the activation's output gradient (a Linear under a per-tensor FP8
 * recipe: act' inside its grad_output cast); else the activation's own backward runs.
 * An activation its producer cannot end in (every kind but the tanh GELU, which cuBLASLt's
 * epilogues have) is run by the module after it instead, inside the cast of that module's FP8
 * input (a Linear: quantize(act(x)) in one pass); its backward goes into the producer's
 * grad_output cast the same way (act' + dbias + cast + transpose in one pass).
 * lutra_sequential_fusions counts what the last forward/backward fused: pairs whose activation
 * ran inside a GEMM epilogue or a cast, with no kernel of its own. */
#include "core/error.h"
#include "core/object.h"
#include "nn/module.h"
#include "nn/param_list.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sequential {
  lutra_module base;
  int count;
  lutra_module **mods;
  int32_t *fused_act;       /* [i]: mods[i]'s forward can end in mods[i + 1], this activation */
  const lutra_tensor **pre; /* [i]: the pre-activation the last forward fused at i, or NULL */
  int32_t *in_act;          /* [i]: mods[i] runs mods[i - 1], this activation, in its forward */
  int fused_forward, fused_backward; /* pairs fused by the last forward / backward */
  bool takes_splits;       /* a module in it reads lutra_forward_args.splits (a GroupedLinear) */
  lutra_param_list params; /* the children's, a weight two of them share once */
} sequential;

static int seq_forward(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *a,
                       lutra_tensor **y) {
  sequential *s = (sequential *)m;
  if (a->splits && !s->takes_splits)
    return lutra_error(LUTRA_EINVAL, "lutra_sequential_forward",
                       "m_splits were given but no module of this Sequential takes them (only a "
                       "GroupedLinear does)");
  const lutra_tensor *h = x;
  lutra_tensor *out = NULL;
  s->fused_forward = 0;
  for (int i = 0; i < s->count; i++)
    s->pre[i] = NULL;
  for (int i = 0; i < s->count; i++) {
    lutra_module *mod = s->mods[i];
    if (i + 1 < s->count && s->in_act[i + 1] != LUTRA_ACT_NONE) {
      /* mods[i] is an activation the next module runs: hand it the activation's input */
      lutra_module *act = mod, *next = s->mods[i + 1];
      const lutra_tensor *act_y;
      bool fused;
      TRY(next->ops->fusion->forward_from_act(next, h, a, s->in_act[i + 1], &out, &act_y, &fused));
      act->ops->fusion->adopt(act, a->grad ? h : NULL, act_y); /* inference: keeps nothing */
      if (fused) s->fused_forward++;
      i++;
    } else if (s->fused_act[i] != LUTRA_ACT_NONE) {
      const lutra_tensor *pre;
      TRY(mod->ops->fusion->forward_ending_in(mod, h, a, s->fused_act[i], &out, &pre));
      lutra_module *act = s->mods[i + 1];
      act->ops->fusion->adopt(act, pre, out);
      s->pre[i] = pre;
      s->fused_forward++;
      i++; /* the activation ran in the GEMM */
    } else {
      TRY(mod->ops->forward(mod, h, a, &out));
    }
    h = out;
  }
  *y = out;
  return LUTRA_OK;
}

/* dx NULL: the input's gradient is not wanted, so the first module computes none */
static int seq_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  sequential *s = (sequential *)m;
  const lutra_tensor *g = dy;
  lutra_tensor *out = NULL;
  s->fused_backward = 0;
  lutra_tensor **input_grad = dx ? &out : NULL; /* for the module that takes the input */
  for (int i = s->count - 1; i >= 0; i--) {
    lutra_module *mod = s->mods[i];
    const lutra_fusion_ops *fu = lutra_module_fusion(mod);
    /* a consumer after an activation whose forward was fused at i - 2: the activation's
     * derivative goes into this module's backward (its dgrad GEMM) */
    const lutra_tensor *pre = i >= 2 ? s->pre[i - 2] : NULL;
    if (pre && fu && fu->backward_into_act) {
      bool fused;
      TRY(fu->backward_into_act(mod, g, s->fused_act[i - 2], pre, &out, &fused));
      g = out;
      if (fused) {
        s->fused_backward++;
        i--; /* the activation's backward is done */
      }
      continue;
    }
    /* an activation whose producer (the module before it, whose output or pre-activation was
     * its input) can start its backward from the activation's output gradient (act' in its
     * grad_output cast) */
    const int act = lutra_module_activation(mod);
    if (i >= 1 && act != LUTRA_ACT_NONE) {
      lutra_module *producer = s->mods[i - 1];
      const lutra_fusion_ops *pf = producer->ops->fusion;
      if (pf && pf->starts_from_act_grad && pf->backward_from_act_grad &&
          pf->starts_from_act_grad(producer, act)) {
        TRY(pf->backward_from_act_grad(producer, act, g, i == 1 ? input_grad : &out));
        g = out;
        s->fused_backward++;
        i--; /* the producer's backward is done too */
        continue;
      }
    }
    TRY(mod->ops->backward(mod, g, i == 0 ? input_grad : &out));
    g = out;
  }
  if (dx) *dx = out;
  return LUTRA_OK;
}

/* a Residual's sums: the forward's by the last module, the backward's by the first */
static bool seq_arm_residual(lutra_module *m, int pass, const lutra_tensor *r, lutra_tensor *out) {
  const sequential *s = (const sequential *)m;
  if (s->count == 0) return false;
  return lutra_module_arm_residual(s->mods[pass == LUTRA_PASS_FORWARD ? s->count - 1 : 0], pass, r,
                                   out);
}
static const lutra_fusion_ops seq_fusion = {.activation = LUTRA_ACT_NONE,
                                            .arm_residual = seq_arm_residual};

static int seq_num_params(const lutra_module *m) {
  return ((const sequential *)m)->params.count;
}

static int seq_param(const lutra_module *m, int i, lutra_param *out) {
  const sequential *s = (const sequential *)m;
  return lutra_param_list_get(&s->params, s->mods, i, out);
}

static void seq_release(lutra_module *m) {
  sequential *s = (sequential *)m;
  for (int i = 0; i < s->count; i++)
    lutra_module_unref(s->mods[i]);
  free(s->mods);
  free(s->fused_act);
  free(s->pre);
  free(s->in_act);
  lutra_param_list_free(&s->params);
  s->mods = NULL;
  s->fused_act = NULL;
  s->pre = NULL;
  s->in_act = NULL;
  s->count = 0;
}

static int seq_num_children(const lutra_module *m) {
  return ((const sequential *)m)->count;
}

static lutra_module *seq_child(const lutra_module *m, int i, const char **name) {
  *name = NULL; /* named by index, as torch's Sequential */
  return ((const sequential *)m)->mods[i];
}

static const lutra_checkpoint_ops seq_checkpoint = {
    .num_children = seq_num_children,
    .child = seq_child,
};

static const lutra_module_ops seq_ops = {
    .kind = "sequential",
    .forward = seq_forward,
    .backward = seq_backward,
    .num_params = seq_num_params,
    .param = seq_param,
    .release = seq_release,
    .fusion = &seq_fusion,
    .checkpoint = &seq_checkpoint,
};

int lutra_sequential_new(lutra_module *const *mods, int n, lutra_module **out) {
  static const char fn[] = "lutra_sequential_new";
  CHECK_ARG(out, "out is NULL");
  CHECK_ARG(n >= 1, "a Sequential needs at least one module (got %d)", n);
  CHECK_ARG(mods, "mods is NULL");
  for (int i = 0; i < n; i++) {
    char what[32];
    snprintf(what, sizeof what, "module %d", i + 1);
    TRY(lutra_check_object(mods[i], LUTRA_MAGIC_MODULE, fn, what));
    /* every module keeps what its backward needs (its input, its outputs) from its last forward:
     * listed twice, the second forward would overwrite the first's. Two modules sharing a weight
     * are two modules (lutra_linear_desc.tie) */
    for (int j = 0; j < i; j++)
      CHECK_ARG(mods[j] != mods[i],
                "module %d is module %d again: a module can appear only once (to share a "
                "weight, tie a Linear to it: lutra_linear_desc.tie)",
                i + 1, j + 1);
  }
  sequential *s = calloc(1, sizeof *s);
  lutra_module **copy = calloc((size_t)n, sizeof *copy);
  int32_t *fused_act = calloc((size_t)n, sizeof *fused_act);
  const lutra_tensor **pre = calloc((size_t)n, sizeof *pre);
  int32_t *in_act = calloc((size_t)n, sizeof *in_act);
  lutra_param_list params = {0};
  int st = lutra_param_list_build(mods, n, &params, fn);
  if (st != LUTRA_OK || !s || !copy || !fused_act || !pre || !in_act) {
    lutra_param_list_free(&params);
    free(s);
    free(copy);
    free(fused_act);
    free(pre);
    free(in_act);
    return st != LUTRA_OK ? st : lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  }
  memcpy(copy, mods, (size_t)n * sizeof *copy);
  for (int i = 0; i + 1 < n; i++) {
    /* a module is in at most one pair: an activation fused into its producer is not itself a
     * producer of the next pair */
    int act = lutra_module_activation(copy[i + 1]);
    const lutra_fusion_ops *fu = lutra_module_fusion(copy[i]);
    bool pairs = act != LUTRA_ACT_NONE && fu && fu->ends_in && fu->ends_in(copy[i], act) &&
                 copy[i + 1]->ops->fusion->adopt && (i == 0 || fused_act[i - 1] == LUTRA_ACT_NONE);
    fused_act[i] = pairs ? act : LUTRA_ACT_NONE;
  }
  for (int i = 1; i < n; i++) {
    /* an activation its producer does not run is run by the module after it, if that one takes
     * it (and is no producer of a pair itself: its forward would have to do both) */
    int act = lutra_module_activation(copy[i - 1]);
    const lutra_fusion_ops *fu = lutra_module_fusion(copy[i]);
    bool adopted = i >= 2 && fused_act[i - 2] != LUTRA_ACT_NONE;
    bool takes = act != LUTRA_ACT_NONE && !adopted && (i < 2 || in_act[i - 1] == LUTRA_ACT_NONE) &&
                 fu && fu->starts_with_act && fu->forward_from_act &&
                 fu->starts_with_act(copy[i], act) && copy[i - 1]->ops->fusion->adopt &&
                 fused_act[i] == LUTRA_ACT_NONE;
    in_act[i] = takes ? act : LUTRA_ACT_NONE;
  }
  for (int i = 0; i < n; i++)
    lutra_module_retain(copy[i]);
  lutra_module_init(&s->base, &seq_ops);
  s->count = n;
  s->mods = copy;
  s->fused_act = fused_act;
  s->pre = pre;
  s->in_act = in_act;
  s->params = params;
  for (int i = 0; i < n; i++)
    s->takes_splits = s->takes_splits || lutra_module_takes_splits(copy[i]);
  *out = &s->base;
  return LUTRA_OK;
}

int lutra_sequential_fusions(const lutra_module *m, int *forward, int *backward) {
  static const char fn[] = "lutra_sequential_fusions";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(m->ops == &seq_ops, "module is a %s, not a sequential", m->ops->kind);
  CHECK_ARG(forward && backward, "output pointers must not be NULL");
  const sequential *s = (const sequential *)m;
  *forward = s->fused_forward;
  *backward = s->fused_backward;
  return LUTRA_OK;
}

int lutra_sequential_count(const lutra_module *m, int *n) {
  static const char fn[] = "lutra_sequential_count";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(m->ops == &seq_ops, "module is a %s, not a sequential", m->ops->kind);
  CHECK_ARG(n, "n is NULL");
  *n = ((const sequential *)m)->count;
  return LUTRA_OK;
}

int lutra_sequential_child(const lutra_module *m, int i, lutra_module **out) {
  static const char fn[] = "lutra_sequential_child";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(m->ops == &seq_ops, "module is a %s, not a sequential", m->ops->kind);
  CHECK_ARG(out, "out is NULL");
  const sequential *s = (const sequential *)m;
  CHECK_ARG(i >= 0 && i < s->count, "index %d is out of range 0..%d", i, s->count - 1);
  lutra_module_retain(s->mods[i]);
  *out = s->mods[i];
  return LUTRA_OK;
}
