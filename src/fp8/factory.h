/* Factory recipes, the C side (fp8/factory.c): the choice a module stores, and the request. */
#ifndef LUTRA_FP8_FACTORY_H
#define LUTRA_FP8_FACTORY_H

#include "fp8/recipe.h"

#include <stdbool.h>

/* What a module keeps: its name and kind (for the factory) and its choice for one recipe. */
typedef struct lutra_module_choice {
  uint64_t key; /* the recipe the roles were chosen for */
  bool set;
  lutra_quantizer_spec roles[LUTRA_NUM_ROLES];
  const char *kind; /* the module kind ("linear" when NULL) */
  char name[LUTRA_MODULE_NAME_MAX];
} lutra_module_choice;

/* The specs a module uses under r: r's roles, or for a factory recipe the module's choice; when
 * it has none for r, LUTRA_FACTORY_PENDING with the request recorded (nothing else changes). */
int lutra_factory_roles(const lutra_recipe *r, lutra_module_choice *mc,
                        const lutra_quantizer_spec **roles, const char *fn);

/* The module owning mc is released: a request of it is dropped. */
void lutra_factory_forget(lutra_module_choice *mc);

#endif
