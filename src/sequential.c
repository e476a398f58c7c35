/* Sequential: runs its children in order, and their backward in reverse, in one C call. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sequential {
  lutra_module base;
  int count;
  lutra_module **mods;
} sequential;

static int seq_forward(lutra_module *m, const lutra_tensor *x, int first_microbatch,
                       lutra_tensor **y) {
  sequential *s = (sequential *)m;
  const lutra_tensor *h = x;
  lutra_tensor *out = NULL;
  for (int i = 0; i < s->count; i++) {
    TRY(s->mods[i]->ops->forward(s->mods[i], h, first_microbatch, &out));
    h = out;
  }
  *y = out;
  return LUTRA_OK;
}

static int seq_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  sequential *s = (sequential *)m;
  const lutra_tensor *g = dy;
  lutra_tensor *out = NULL;
  for (int i = s->count - 1; i >= 0; i--) {
    TRY(s->mods[i]->ops->backward(s->mods[i], g, &out));
    g = out;
  }
  *dx = out;
  return LUTRA_OK;
}

static int seq_num_params(const lutra_module *m) {
  const sequential *s = (const sequential *)m;
  int n = 0;
  for (int i = 0; i < s->count; i++)
    n += s->mods[i]->ops->num_params(s->mods[i]);
  return n;
}

static int seq_param(const lutra_module *m, int i, lutra_param *out) {
  const sequential *s = (const sequential *)m;
  for (int c = 0; c < s->count; c++) {
    int n = s->mods[c]->ops->num_params(s->mods[c]);
    if (i < n) return s->mods[c]->ops->param(s->mods[c], i, out);
    i -= n;
  }
  return LUTRA_EINVAL;
}

static void seq_release(lutra_module *m) {
  sequential *s = (sequential *)m;
  for (int i = 0; i < s->count; i++)
    lutra_module_free(s->mods[i]);
  free(s->mods);
  s->mods = NULL;
  s->count = 0;
}

static const lutra_module_ops seq_ops = {
    .kind = "sequential",
    .forward = seq_forward,
    .backward = seq_backward,
    .num_params = seq_num_params,
    .param = seq_param,
    .release = seq_release,
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
  }
  sequential *s = calloc(1, sizeof *s);
  lutra_module **copy = calloc((size_t)n, sizeof *copy);
  if (!s || !copy) {
    free(s);
    free(copy);
    return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  }
  memcpy(copy, mods, (size_t)n * sizeof *copy);
  for (int i = 0; i < n; i++)
    lutra_module_retain(copy[i]);
  s->base.obj.magic = LUTRA_MAGIC_MODULE;
  s->base.obj.refs = 1;
  s->base.ops = &seq_ops;
  s->count = n;
  s->mods = copy;
  *out = &s->base;
  return LUTRA_OK;
}
