/* Parameters listed once (nn/param_list.h). */
#include "nn/param_list.h"
#include "core/error.h"
#include "nn/module.h"

#include <stdlib.h>

int lutra_param_list_build(lutra_module *const *mods, int n, lutra_param_list *out,
                           const char *fn) {
  int total = 0;
  for (int c = 0; c < n; c++)
    total += mods[c]->ops->num_params(mods[c]);
  lutra_param_list l = {0};
  l.child = calloc((size_t)total + 1, sizeof *l.child);
  l.index = calloc((size_t)total + 1, sizeof *l.index);
  const lutra_tensor **seen = calloc((size_t)total + 1, sizeof *seen);
  int st = l.child && l.index && seen ? LUTRA_OK
                                      : lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  for (int c = 0; c < n && st == LUTRA_OK; c++) {
    for (int i = 0, np = mods[c]->ops->num_params(mods[c]); i < np && st == LUTRA_OK; i++) {
      lutra_param p;
      st = mods[c]->ops->param(mods[c], i, &p);
      int k = 0;
      while (st == LUTRA_OK && k < l.count && seen[k] != p.value)
        k++;
      if (st != LUTRA_OK || k < l.count) continue; /* shared with an earlier child */
      seen[l.count] = p.value;
      l.child[l.count] = c;
      l.index[l.count++] = i;
    }
  }
  free(seen);
  if (st != LUTRA_OK) {
    lutra_param_list_free(&l);
    return st;
  }
  *out = l;
  return LUTRA_OK;
}

int lutra_param_list_get(const lutra_param_list *l, lutra_module *const *mods, int i,
                         lutra_param *out) {
  if (i < 0 || i >= l->count) return LUTRA_EINVAL;
  lutra_module *m = mods[l->child[i]];
  return m->ops->param(m, l->index[i], out);
}

void lutra_param_list_free(lutra_param_list *l) {
  free(l->child);
  free(l->index);
  *l = (lutra_param_list){0};
}
