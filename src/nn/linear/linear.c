/* Linear: y = x W^T + b, with W [out, in] as torch stores it: the Linear core as a module, and
 * its answers to the fusion protocol (an activation in the forward GEMM's epilogue, its
 * derivative in the grad_output cast or the dgrad GEMM's epilogue). */
#include "core/error.h"
#include "core/object.h"
#include "core/trace.h"
#include "nn/export_view.h"
#include "nn/linear/linear_core.h"
#include "nn/module.h"

#include <stdlib.h>
#include <string.h>

typedef struct linear {
  lutra_module base;
  lutra_linear_core core;
} linear;

static const lutra_module_ops linear_ops;

static lutra_linear_core *core_of(lutra_module *m) {
  return &((linear *)m)->core;
}

static const lutra_linear_core *const_core_of(const lutra_module *m) {
  return &((const linear *)m)->core;
}

static int linear_forward_act(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *a,
                              int act, lutra_tensor **y, const lutra_tensor **pre) {
  RANGE_PUSH("lutra.linear.forward");
  int st = lutra_linear_core_forward(core_of(m), x, a, act, y, "lutra_linear_forward");
  RANGE_POP();
  /* an inference forward keeps no pre-activation */
  if (st == LUTRA_OK && pre) *pre = core_of(m)->forward_grad ? core_of(m)->pre : NULL;
  return st;
}

static int linear_forward(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *a,
                          lutra_tensor **y) {
  return linear_forward_act(m, x, a, LUTRA_ACT_NONE, y, NULL);
}

/* a Residual's sums: the forward GEMM's C, the dgrad GEMM's C */
static bool linear_arm_residual(lutra_module *m, int pass, const lutra_tensor *r,
                                lutra_tensor *out) {
  lutra_linear_core *c = core_of(m);
  if (pass == LUTRA_PASS_FORWARD) {
    c->residual = r;
    c->residual_out = out;
  } else {
    c->grad_residual = r;
    c->grad_residual_out = out;
  }
  return true;
}

static int linear_backward_op(lutra_module *m, const lutra_linear_backward_op *op,
                              lutra_tensor **dx, bool *dact_fused) {
  RANGE_PUSH("lutra.linear.backward");
  int st = lutra_linear_core_backward(core_of(m), op, dx, dact_fused, "lutra_linear_backward");
  RANGE_POP();
  return st;
}

static int linear_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  return linear_backward_op(m, &(lutra_linear_backward_op){.dy = dy}, dx, NULL);
}

static bool linear_ends_in(const lutra_module *m, int act) {
  (void)m;
  return lutra_linear_core_ends_in(act);
}

static bool linear_starts_from_act_grad(const lutra_module *m, int act) {
  return lutra_linear_core_starts_from_act_grad(const_core_of(m), act);
}

static int linear_backward_from_act_grad(lutra_module *m, int act, const lutra_tensor *dy,
                                         lutra_tensor **dx) {
  return linear_backward_op(
      m, &(lutra_linear_backward_op){.dy = dy, .from_act_grad = true, .act_grad_act = act}, dx,
      NULL);
}

static bool linear_starts_with_act(const lutra_module *m, int act) {
  (void)m;
  return lutra_linear_core_starts_with_act(act);
}

static int linear_forward_from_act(lutra_module *m, const lutra_tensor *pre,
                                   const lutra_forward_args *a, int act, lutra_tensor **y,
                                   const lutra_tensor **act_y, bool *fused) {
  RANGE_PUSH("lutra.linear.forward");
  int st = lutra_linear_core_forward_from_act(core_of(m), pre, a, act, y, act_y, fused,
                                              "lutra_linear_forward");
  RANGE_POP();
  return st;
}

static int linear_backward_into_act(lutra_module *m, const lutra_tensor *dy, int act,
                                    const lutra_tensor *pre, lutra_tensor **dx, bool *fused) {
  return linear_backward_op(
      m, &(lutra_linear_backward_op){.dy = dy, .dact_act = act, .dact_pre = pre}, dx, fused);
}

static int linear_num_params(const lutra_module *m) {
  return lutra_linear_core_num_params(const_core_of(m));
}

static int linear_param(const lutra_module *m, int i, lutra_param *out) {
  lutra_linear_core_param(const_core_of(m), i, out);
  return LUTRA_OK;
}

/* its weight can be shared (lutra_linear_desc.tie): the state is its owner's when it is tied */
static lutra_tie *linear_tie(lutra_module *m, int i) {
  return i == 0 ? core_of(m)->tie : NULL;
}

static void linear_release(lutra_module *m) {
  lutra_linear_core_release(core_of(m));
}

static const lutra_fusion_ops linear_fusion = {
    .activation = LUTRA_ACT_NONE,
    .ends_in = linear_ends_in,
    .forward_ending_in = linear_forward_act,
    .starts_from_act_grad = linear_starts_from_act_grad,
    .backward_from_act_grad = linear_backward_from_act_grad,
    .backward_into_act = linear_backward_into_act,
    .starts_with_act = linear_starts_with_act,
    .forward_from_act = linear_forward_from_act,
    .arm_residual = linear_arm_residual,
};

static int linear_quantizers(lutra_module *m, const lutra_recipe *build_for,
                             lutra_module_quantizers *out, const char *fn) {
  return lutra_linear_core_quantizers(core_of(m), build_for, NULL, out, fn);
}

static void linear_adopt_quantizers(lutra_module *m, const lutra_recipe *r,
                                    const lutra_module_quantizers *q) {
  lutra_linear_core_adopt_quantizers(core_of(m), r, q);
}

static bool linear_in_window(const lutra_module *m) {
  return lutra_linear_core_in_accumulation_window(const_core_of(m));
}

static const lutra_checkpoint_ops linear_checkpoint = {
    .quantizers = linear_quantizers,
    .adopt_quantizers = linear_adopt_quantizers,
    .in_accumulation_window = linear_in_window,
};

static lutra_module_choice *linear_choice(lutra_module *m) {
  return &core_of(m)->choice;
}

static const lutra_module_ops linear_ops = {
    .kind = "linear",
    .forward = linear_forward,
    .backward = linear_backward,
    .num_params = linear_num_params,
    .param = linear_param,
    .release = linear_release,
    .fusion = &linear_fusion,
    .checkpoint = &linear_checkpoint,
    .tie = linear_tie,
    .choice = linear_choice,
};

void lutra_linear_defaults(lutra_linear_desc *d) {
  if (!d) return;
  *d = (lutra_linear_desc){.bias = 1, .dtype = LUTRA_F32, .device = LUTRA_CPU};
  /* two layers made from the defaults must not start from the same weights */
  lutra_seed_next(&d->seed);
}

int lutra_linear_new(const lutra_linear_desc *d, lutra_module **out) {
  static const char fn[] = "lutra_linear_new";
  CHECK_ARG(d, "desc is NULL");
  CHECK_ARG(out, "out is NULL");
  linear *l = calloc(1, sizeof *l);
  if (!l) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  int st = lutra_linear_core_init(&l->core, d, fn);
  if (st != LUTRA_OK) {
    free(l);
    return st;
  }
  lutra_module_init(&l->base, &linear_ops);
  *out = &l->base;
  return LUTRA_OK;
}

int lutra_linear_quantizer(const lutra_module *m, int role, lutra_quantizer **out) {
  static const char fn[] = "lutra_linear_quantizer";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(m->ops == &linear_ops, "module is a %s, not a linear", m->ops->kind);
  CHECK_ARG(role >= 0 && role < LUTRA_NUM_ROLES, "unknown role %d", role);
  CHECK_ARG(out, "out is NULL");
  *out = const_core_of(m)->q[role];
  return LUTRA_OK;
}

/* The modules a factory recipe chooses for take a name (lutra_module_ops.choice). */
int lutra_module_set_name(lutra_module *m, const char *name) {
  static const char fn[] = "lutra_module_set_name";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  lutra_module_choice *mc = m->ops->choice ? m->ops->choice(m) : NULL;
  CHECK_ARG(mc,
            "a %s takes no name (the modules a factory recipe chooses for do: linear, "
            "layernorm_linear, linear_parallel, grouped_linear)",
            m->ops->kind);
  CHECK_ARG(name, "name is NULL");
  CHECK_ARG(strlen(name) < LUTRA_MODULE_NAME_MAX, "name is longer than %d bytes",
            LUTRA_MODULE_NAME_MAX - 1);
  strcpy(mc->name, name);
  return LUTRA_OK;
}

int lutra_linear_quantized(const lutra_module *m, int role, lutra_tensor **out) {
  static const char fn[] = "lutra_linear_quantized";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(m->ops == &linear_ops, "module is a %s, not a linear", m->ops->kind);
  CHECK_ARG(role == LUTRA_ROLE_INPUT || role == LUTRA_ROLE_WEIGHT,
            "role %d is not the input's or the weight's", role);
  CHECK_ARG(out, "out is NULL");
  const lutra_linear_core *c = const_core_of(m);
  *out = !c->forward_done || !c->forward_fp8 ? NULL : role == LUTRA_ROLE_INPUT ? c->xq : c->wq;
  return LUTRA_OK;
}

int lutra_linear_tied_to(const lutra_module *m, const char **kind) {
  static const char fn[] = "lutra_linear_tied_to";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(m->ops == &linear_ops, "module is a %s, not a linear", m->ops->kind);
  CHECK_ARG(kind, "kind is NULL");
  const lutra_module *owner = const_core_of(m)->tie_owner;
  *kind = owner ? owner->ops->kind : NULL;
  return LUTRA_OK;
}

const lutra_tensor *lutra_linear_fp8_weight_view(const lutra_module *m) {
  if (m->ops != &linear_ops) return NULL;
  return lutra_linear_core_fp8_weight(const_core_of(m));
}
