/* The parameters of a module with children, each listed once: a weight that two children share
 * (a tied Linear's, nn/tie.h) appears at its first child only, so that whatever runs over a
 * tree's parameters (optimizers, data-parallel syncs, zero_grad, lutra_module_param) sees it
 * once. Built when the module is made: tying is fixed at construction. */
#ifndef LUTRA_NN_PARAM_LIST_H
#define LUTRA_NN_PARAM_LIST_H

#include "lutra.h"

typedef struct lutra_param_list {
  int count;
  int32_t *child; /* [i]: the child that lists parameter i */
  int32_t *index; /* [i]: its index among that child's parameters */
} lutra_param_list;

int lutra_param_list_build(lutra_module *const *mods, int n, lutra_param_list *out, const char *fn);
/* parameter i of the list, from the children it was built from */
int lutra_param_list_get(const lutra_param_list *l, lutra_module *const *mods, int i,
                         lutra_param *out);
void lutra_param_list_free(lutra_param_list *l);

#endif
