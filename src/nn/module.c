/* The module protocol every module kind shares: checks, reference counting, parameters. */
#include "nn/module.h"
#include "core/capture.h"
#include "core/error.h"
#include "core/object.h"
#include "fp8/autocast.h"

#include <stdlib.h>

void lutra_module_init(lutra_module *m, const lutra_module_ops *ops) {
  m->obj.magic = LUTRA_MAGIC_MODULE;
  m->obj.refs = 1;
  m->ops = ops;
}

int lutra_module_no_params(const lutra_module *m) {
  (void)m;
  return 0;
}

int lutra_module_no_param(const lutra_module *m, int i, lutra_param *out) {
  (void)m;
  (void)i;
  (void)out;
  return LUTRA_EINVAL;
}

void lutra_module_retain(lutra_module *m) {
  m->obj.refs++;
}

int lutra_module_unref(lutra_module *m) {
  if (!m) return LUTRA_OK;
  if (--m->obj.refs > 0) return LUTRA_OK;
  if (!(m->obj.flags & LUTRA_OBJ_FREED)) m->ops->release(m);
  free(m);
  return LUTRA_OK;
}

int lutra_module_destroy(lutra_module *m) {
  static const char fn[] = "lutra_module_destroy";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_STATE(m->obj.refs - m->obj.holds <= 1,
              "module is still used by a Sequential, an optimizer or a Linear tied to its "
              "weight; destroy those first");
  m->ops->release(m);
  m->obj.flags |= LUTRA_OBJ_FREED;
  return LUTRA_OK;
}

const char *lutra_module_kind(const lutra_module *m) {
  if (lutra_check_object(m, LUTRA_MAGIC_MODULE, "lutra_module_kind", "module") != LUTRA_OK)
    return "?";
  return m->ops->kind;
}

/* a captured graph drops its reference to the module through this */
static int release_module(void *p) {
  return lutra_module_unref(p);
}

/* A graph replays into these buffers: it keeps the module and both tensors referenced, and
 * refuses to replay once one of them was freed. */
static int hold_captured(lutra_module *m, const lutra_tensor *in, const lutra_tensor *out,
                         const char *fn) {
  TRY(lutra_capture_hold_object(m, release_module, fn));
  TRY(lutra_capture_hold_tensor(in, fn));
  if (out) TRY(lutra_capture_hold_tensor(out, fn));
  return LUTRA_OK;
}

void lutra_forward_defaults(lutra_forward_args *a) {
  if (a) *a = (lutra_forward_args){.is_first_microbatch = LUTRA_FIRST_MICROBATCH_NONE, .grad = 1};
}

int lutra_module_forward_ex(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *a,
                            lutra_tensor **y) {
  static const char fn[] = "lutra_module_forward";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  TRY(lutra_check_tensor(x, fn, "input"));
  CHECK_ARG(a, "args is NULL (lutra_forward_defaults gives the defaults)");
  CHECK_ARG(y, "y is NULL");
  CHECK_ARG(a->is_first_microbatch >= -1 && a->is_first_microbatch <= LUTRA_FIRST_MICROBATCH_DEVICE,
            "is_first_microbatch must be -1 (none), 0, 1 or 2 (device flag)");
  int st = m->ops->forward(m, x, a, y);
  if (st != LUTRA_OK) {
    /* a forward that failed half-way may have recorded amaxes already (the layers before the bad
     * one): they must not feed the scope's update, which would then change those scales */
    if (lutra_autocast_current()->depth > 0) (void)lutra_autocast_discard_forward(fn);
    return st;
  }
  if (LUTRA_CAPTURING()) TRY(hold_captured(m, x, *y, fn));
  return LUTRA_OK;
}

int lutra_module_forward(lutra_module *m, const lutra_tensor *x, int is_first_microbatch,
                         lutra_tensor **y) {
  lutra_forward_args a = {.is_first_microbatch = is_first_microbatch, .grad = 1};
  return lutra_module_forward_ex(m, x, &a, y);
}

int lutra_module_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  static const char fn[] = "lutra_module_backward";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  TRY(lutra_check_tensor(dy, fn, "grad_output"));
  int st = m->ops->backward(m, dy, dx);
  if (st != LUTRA_OK) {
    (void)lutra_autocast_discard_backward(fn);
    return st;
  }
  if (LUTRA_CAPTURING()) TRY(hold_captured(m, dy, dx ? *dx : NULL, fn));
  /* the scope's backward update set quantizers aside for their scaling rules (lutra/rules.h) */
  if (lutra_rules_pending()) return LUTRA_RULES_PENDING;
  return LUTRA_OK;
}

int lutra_module_num_params(const lutra_module *m, int *n) {
  static const char fn[] = "lutra_module_num_params";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(n, "n is NULL");
  *n = m->ops->num_params(m);
  return LUTRA_OK;
}

int lutra_module_param(const lutra_module *m, int i, lutra_param *out) {
  static const char fn[] = "lutra_module_param";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(out, "out is NULL");
  int n = m->ops->num_params(m);
  CHECK_ARG(i >= 0 && i < n, "parameter %d is out of range 0..%d", i, n - 1);
  return m->ops->param(m, i, out);
}

int lutra_module_zero_grad(lutra_module *m) {
  static const char fn[] = "lutra_module_zero_grad";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  int n = m->ops->num_params(m);
  for (int i = 0; i < n; i++) {
    lutra_param p;
    TRY(m->ops->param(m, i, &p));
    if (p.grad) TRY(lutra_tensor_fill(p.grad, 0.0f));
    if (p.main_grad) TRY(lutra_tensor_fill(p.main_grad, 0.0f));
  }
  return LUTRA_OK;
}

const lutra_checkpoint_ops lutra_checkpoint_stateless = {0};

bool lutra_module_takes_splits(const lutra_module *m) {
  if (m->ops->takes_splits) return true;
  const lutra_checkpoint_ops *c = m->ops->checkpoint;
  if (!c || !c->num_children || !c->child) return false;
  for (int i = 0, n = c->num_children(m); i < n; i++) {
    const char *name;
    if (lutra_module_takes_splits(c->child(m, i, &name))) return true;
  }
  return false;
}
