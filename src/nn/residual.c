/* Residual: y = x + m(x), the pre-norm block's skip connection; backward dx = dy + m's input
 * gradient. Each sum is made by m's own last kernel where m can (lutra_fusion_ops.arm_residual:
 * a Linear's GEMM adds x as its epilogue's C, a norm's backward or a dgrad GEMM adds dy), in f32
 * and rounded once, else by an element-wise sum (backend add) after it. The output and
 * input-gradient buffers are the Residual's, reused while the shape stays. */
#include "backend/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/object.h"
#include "nn/module.h"
#include "runtime/tensor.h"

#include <stdlib.h>

typedef struct residual {
  lutra_module base;
  lutra_module *inner;
  const lutra_backend *be;
  lutra_tensor *y, *dx;
  bool forward_done;
} residual;

static int sum_into(residual *r, lutra_tensor **slot, const lutra_tensor *a, const lutra_tensor *b,
                    const char *fn) {
  CHECK_ARG(a->dtype == b->dtype && lutra_same_shape(a, b) && a->device == b->device &&
                a->scaling == LUTRA_SCALING_NONE && b->scaling == LUTRA_SCALING_NONE,
            "the wrapped module's tensor (%s) does not match the residual's (%s, same shape)",
            lutra_dtype_name(b->dtype), lutra_dtype_name(a->dtype));
  TRY(lutra_tensor_ensure(slot, PLAIN_TENSOR(a->dtype, a->ndim, a->shape, a->device), fn));
  TRY(lutra_backend_get(a->device, &r->be, fn));
  TRY(r->be->add(a->data, b->data, (*slot)->data, a->dtype, a->numel));
  return LUTRA_OK;
}

/* Arms the inner module's pass to write t + its result into *slot (sized like t here): not for
 * a t of no plain float dtype (sum_into refuses it after the pass), nor one that is *slot
 * itself (a Residual given its own last output). Returns whether the module took it. */
static int arm(residual *r, int pass, const lutra_tensor *t, lutra_tensor **slot, bool *armed,
               const char *fn) {
  *armed = false;
  if (!lutra_dtype_is_float(t->dtype) || t->scaling != LUTRA_SCALING_NONE) return LUTRA_OK;
  TRY(lutra_tensor_ensure(slot, PLAIN_TENSOR(t->dtype, t->ndim, t->shape, t->device), fn));
  if ((*slot)->data == t->data && t->numel > 0) return LUTRA_OK;
  *armed = lutra_module_arm_residual(r->inner, pass, t, *slot);
  return LUTRA_OK;
}

static int res_forward(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *a,
                       lutra_tensor **y) {
  static const char fn[] = "lutra_residual_forward";
  residual *r = (residual *)m;
  bool armed;
  TRY(arm(r, LUTRA_PASS_FORWARD, x, &r->y, &armed, fn));
  lutra_tensor *h;
  int st = r->inner->ops->forward(r->inner, x, a, &h);
  /* a pass that failed, or never reached the armed kernel, must not leave it armed */
  if (armed) lutra_module_arm_residual(r->inner, LUTRA_PASS_FORWARD, NULL, NULL);
  TRY(st);
  if (!(armed && h == r->y)) TRY(sum_into(r, &r->y, x, h, fn)); /* else the module added x */
  r->forward_done = true;
  *y = r->y;
  return LUTRA_OK;
}

static int res_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  static const char fn[] = "lutra_residual_backward";
  residual *r = (residual *)m;
  CHECK_STATE(r->forward_done, "backward called before forward");
  CHECK_ARG(lutra_same_shape(dy, r->y) && dy->dtype == r->y->dtype,
            "grad_output shape or dtype does not match the forward output");
  bool armed = false;
  if (dx) TRY(arm(r, LUTRA_PASS_BACKWARD, dy, &r->dx, &armed, fn));
  lutra_tensor *g = NULL;
  int st = r->inner->ops->backward(r->inner, dy, dx ? &g : NULL);
  if (armed) lutra_module_arm_residual(r->inner, LUTRA_PASS_BACKWARD, NULL, NULL);
  TRY(st);
  if (!dx) return LUTRA_OK;
  if (!(armed && g == r->dx)) TRY(sum_into(r, &r->dx, dy, g, fn)); /* else the module added dy */
  *dx = r->dx;
  return LUTRA_OK;
}

static int res_num_params(const lutra_module *m) {
  const lutra_module *in = ((const residual *)m)->inner;
  return in->ops->num_params(in);
}
static int res_param(const lutra_module *m, int i, lutra_param *out) {
  const lutra_module *in = ((const residual *)m)->inner;
  return in->ops->param(in, i, out);
}
static void res_release(lutra_module *m) {
  residual *r = (residual *)m;
  lutra_tensor_owner_drop(r->y);
  lutra_tensor_owner_drop(r->dx);
  r->y = r->dx = NULL;
  lutra_module_unref(r->inner);
  r->inner = NULL;
  r->forward_done = false;
}

/* the skip connection has no state: the wrapped module's names are the Residual's own ("" adds
 * no level), so Residual(m) checkpoints as m does */
static int res_num_children(const lutra_module *m) {
  (void)m;
  return 1;
}
static lutra_module *res_child(const lutra_module *m, int i, const char **name) {
  (void)i;
  *name = "";
  return ((const residual *)m)->inner;
}
static const lutra_checkpoint_ops res_checkpoint = {
    .num_children = res_num_children,
    .child = res_child,
};

static const lutra_module_ops res_ops = {
    .kind = "residual",
    .forward = res_forward,
    .backward = res_backward,
    .num_params = res_num_params,
    .param = res_param,
    .release = res_release,
    .checkpoint = &res_checkpoint,
};

int lutra_residual_new(lutra_module *m, lutra_module **out) {
  static const char fn[] = "lutra_residual_new";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(out, "out is NULL");
  residual *r = calloc(1, sizeof *r);
  if (!r) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  lutra_module_retain(m);
  r->inner = m;
  lutra_module_init(&r->base, &res_ops);
  *out = &r->base;
  return LUTRA_OK;
}
