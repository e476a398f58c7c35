/* The data-parallel sync of a module (lutra_grad_sync_new; lutra/dist.h): the module's
 * gradients (a parameter's main grad where it accumulates into one), the last parameter's
 * first as a backward finishes them, handed to parallel/grad_sync.c, which averages them over
 * the group and holds a reference to the module for as long as it lives. */
#include "core/error.h"
#include "core/object.h"
#include "nn/module.h"
#include "parallel/group.h"

#include <stdlib.h>

static void drop_module(void *m) {
  lutra_module_unref(m);
}

/* grads[0..*n): the module's gradients, the last parameter's first */
static int collect(lutra_module *m, lutra_tensor **grads, int *n, const char *fn) {
  int count = m->ops->num_params(m);
  *n = 0;
  for (int i = count - 1; i >= 0; i--) {
    lutra_param p;
    TRY(lutra_module_param(m, i, &p));
    lutra_tensor *g = p.main_grad ? p.main_grad : p.grad;
    if (!g) continue;
    CHECK_ARG(g->dtype == LUTRA_F32 || g->dtype == LUTRA_BF16,
              "parameter %d's gradient is %s (f32 or bf16 are averaged)", i,
              lutra_dtype_name(g->dtype));
    grads[(*n)++] = g;
  }
  return LUTRA_OK;
}

int lutra_grad_sync_new(lutra_group *g, lutra_module *m, int64_t bucket_bytes,
                        lutra_grad_sync **out) {
  static const char fn[] = "lutra_grad_sync_new";
  TRY(lutra_group_check(g, fn));
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(out, "out is NULL");
  int count = m->ops->num_params(m);
  lutra_tensor **grads = calloc((size_t)(count ? count : 1), sizeof *grads);
  if (!grads) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate the lists");
  int n = 0;
  int st = collect(m, grads, &n, fn);
  const lutra_grad_sync_owner owner = {
      .obj = m, .magic = LUTRA_MAGIC_MODULE, .what = "module", .drop = drop_module};
  if (st == LUTRA_OK) st = lutra_grad_sync_make(g, grads, n, bucket_bytes, &owner, out, fn);
  free(grads);
  if (st == LUTRA_OK) lutra_module_retain(m);
  return st;
}
