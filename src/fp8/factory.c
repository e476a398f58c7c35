/* Factory recipes: the quantizer of each role chosen per module by the caller (the Lua front's
 * factory function), asked for once per module and recipe. C never calls the factory: a forward
 * that meets a module without a choice returns LUTRA_FACTORY_PENDING before doing anything, the
 * front asks its factory and resolves, then runs the forward again (see lutra/factory.h). */
#include "fp8/factory.h"
#include "core/error.h"
#include "core/object.h"

#include <string.h>

static const char pending_message[] =
    "a module waits for its quantizers from the recipe's factory (lutra_factory_request, "
    "lutra_factory_resolve, then the forward again)";

static _Thread_local struct {
  lutra_module_choice *mc; /* NULL: nothing waits */
  uint64_t key;
  int32_t factory;
  lutra_custom_desc base;
} req;

int lutra_factory_roles(const lutra_recipe *r, lutra_module_choice *mc,
                        const lutra_quantizer_spec **roles, const char *fn) {
  if (r->kind != LUTRA_RECIPE_FACTORY) {
    *roles = r->roles;
    return LUTRA_OK;
  }
  if (mc->set && mc->key == r->key) {
    *roles = mc->roles;
    return LUTRA_OK;
  }
  req.mc = mc;
  req.key = r->key;
  req.factory = r->factory;
  req.base = r->factory_base;
  return lutra_error(LUTRA_FACTORY_PENDING, fn, "%s", pending_message);
}

int lutra_factory_status(void) {
  if (!req.mc) return LUTRA_OK;
  const char *e = lutra_last_error(), *colon = strstr(e, ": ");
  return colon && strcmp(colon + 2, pending_message) == 0 ? LUTRA_FACTORY_PENDING : LUTRA_OK;
}

int lutra_factory_request(int *factory, const char **module_kind, const char **name) {
  static const char fn[] = "lutra_factory_request";
  CHECK_ARG(factory && module_kind && name, "output pointers must not be NULL");
  CHECK_STATE(req.mc, "no module waits for a choice");
  *factory = req.factory;
  *module_kind = req.mc->kind ? req.mc->kind : "linear";
  *name = req.mc->name;
  return LUTRA_OK;
}

int lutra_factory_resolve(const lutra_factory_choice choices[LUTRA_NUM_ROLES]) {
  static const char fn[] = "lutra_factory_resolve";
  CHECK_ARG(choices, "choices is NULL");
  CHECK_STATE(req.mc, "no module waits for a choice");
  lutra_custom_desc d = req.base;
  for (int i = 0; i < LUTRA_NUM_ROLES; i++) {
    d.kind[i] = choices[i].kind;
    d.format[i] = choices[i].format;
    d.power_2_scale[i] = choices[i].power_2_scale;
    d.amax_epsilon[i] = choices[i].amax_epsilon;
    d.columnwise_format[i] = choices[i].columnwise_format;
    d.nvfp4[i] = choices[i].nvfp4;
  }
  lutra_quantizer_spec roles[LUTRA_NUM_ROLES];
  TRY(lutra_recipe_custom_specs(&d, roles, fn));
  memcpy(req.mc->roles, roles, sizeof roles);
  req.mc->key = req.key;
  req.mc->set = true;
  req.mc = NULL;
  return LUTRA_OK;
}

void lutra_factory_cancel(void) {
  req.mc = NULL;
}

void lutra_factory_forget(lutra_module_choice *mc) {
  if (req.mc == mc) req.mc = NULL;
}
