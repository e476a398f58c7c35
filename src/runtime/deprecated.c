/* The lifetime names of lutra 0.1 (lutra/deprecated.h), each calling its new name; removed in
 * lutra 0.3. */
#include "lutra.h"

int lutra_autocast_free(lutra_autocast *a) {
  return lutra_autocast_unref(a);
}

int lutra_autocast_release(lutra_autocast *a) {
  return lutra_autocast_destroy(a);
}

int lutra_grad_sync_free(lutra_grad_sync *s) {
  return lutra_grad_sync_unref(s);
}

int lutra_graph_free(lutra_graph *g) {
  return lutra_graph_unref(g);
}

int lutra_graph_release(lutra_graph *g) {
  return lutra_graph_destroy(g);
}

int lutra_group_free(lutra_group *g) {
  return lutra_group_unref(g);
}

int lutra_loss_free(lutra_loss *l) {
  return lutra_loss_unref(l);
}

int lutra_loss_release(lutra_loss *l) {
  return lutra_loss_destroy(l);
}

int lutra_module_free(lutra_module *m) {
  return lutra_module_unref(m);
}

int lutra_module_release(lutra_module *m) {
  return lutra_module_destroy(m);
}

int lutra_moe_dispatch_free(lutra_moe_dispatch *d) {
  return lutra_moe_dispatch_unref(d);
}

int lutra_moe_dispatch_release(lutra_moe_dispatch *d) {
  return lutra_moe_dispatch_destroy(d);
}

int lutra_moe_router_free(lutra_moe_router *r) {
  return lutra_moe_router_unref(r);
}

int lutra_moe_router_release(lutra_moe_router *r) {
  return lutra_moe_router_destroy(r);
}

int lutra_optim_free(lutra_optim *o) {
  return lutra_optim_unref(o);
}

int lutra_optim_release(lutra_optim *o) {
  return lutra_optim_destroy(o);
}

int lutra_quantizer_free(lutra_quantizer *q) {
  return lutra_quantizer_unref(q);
}

int lutra_quantizer_release(lutra_quantizer *q) {
  return lutra_quantizer_destroy(q);
}

int lutra_recipe_free(lutra_recipe *r) {
  return lutra_recipe_unref(r);
}

int lutra_recipe_release(lutra_recipe *r) {
  return lutra_recipe_destroy(r);
}

int lutra_tensor_free(lutra_tensor *t) {
  return lutra_tensor_unref(t);
}

int lutra_tensor_release(lutra_tensor *t) {
  return lutra_tensor_destroy(t);
}
