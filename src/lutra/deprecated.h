/* lutra/deprecated.h: the lifetime names of lutra 0.1, kept for one version; removed in 0.3.
 * Part of lutra.h (include that one; its conventions hold here). Not in LuaJIT's cdef: the Lua
 * front calls only the current names.
 *
 *   0.1 name          now                  what it does
 *   lutra_X_free      lutra_X_unref        drops the caller's reference (the last frees)
 *   lutra_X_release   lutra_X_destroy      frees the buffers now, keeps a shell marked freed
 *
 * Each one calls the new name and returns what it returns (errors name the new call). Define
 * LUTRA_NO_DEPRECATED before including lutra.h to check that a host no longer uses them. */
#ifndef LUTRA_DEPRECATED_H
#define LUTRA_DEPRECATED_H

#if !defined(LUTRA_CDEF) && !defined(LUTRA_NO_DEPRECATED)

#include "autocast.h"
#include "dist.h"
#include "graph.h"
#include "moe.h"
#include "nn.h"
#include "quantizer.h"
#include "recipe.h"
#include "tensor.h"
#include "train.h"

#if defined(__GNUC__) || defined(__clang__)
#define LUTRA_DEPRECATED(use) __attribute__((deprecated("removed in lutra 0.3: use " use)))
#else
#define LUTRA_DEPRECATED(use)
#endif

#ifdef __cplusplus
extern "C" {
#endif

LUTRA_DEPRECATED("lutra_autocast_unref") LUTRA_API int lutra_autocast_free(lutra_autocast *a);
LUTRA_DEPRECATED("lutra_autocast_destroy")
LUTRA_API int lutra_autocast_release(lutra_autocast *a);
LUTRA_DEPRECATED("lutra_grad_sync_unref") LUTRA_API int lutra_grad_sync_free(lutra_grad_sync *s);
LUTRA_DEPRECATED("lutra_graph_unref") LUTRA_API int lutra_graph_free(lutra_graph *g);
LUTRA_DEPRECATED("lutra_graph_destroy") LUTRA_API int lutra_graph_release(lutra_graph *g);
LUTRA_DEPRECATED("lutra_group_unref") LUTRA_API int lutra_group_free(lutra_group *g);
LUTRA_DEPRECATED("lutra_loss_unref") LUTRA_API int lutra_loss_free(lutra_loss *l);
LUTRA_DEPRECATED("lutra_loss_destroy") LUTRA_API int lutra_loss_release(lutra_loss *l);
LUTRA_DEPRECATED("lutra_module_unref") LUTRA_API int lutra_module_free(lutra_module *m);
LUTRA_DEPRECATED("lutra_module_destroy") LUTRA_API int lutra_module_release(lutra_module *m);
LUTRA_DEPRECATED("lutra_moe_dispatch_unref")
LUTRA_API int lutra_moe_dispatch_free(lutra_moe_dispatch *d);
LUTRA_DEPRECATED("lutra_moe_dispatch_destroy")
LUTRA_API int lutra_moe_dispatch_release(lutra_moe_dispatch *d);
LUTRA_DEPRECATED("lutra_moe_router_unref")
LUTRA_API int lutra_moe_router_free(lutra_moe_router *r);
LUTRA_DEPRECATED("lutra_moe_router_destroy")
LUTRA_API int lutra_moe_router_release(lutra_moe_router *r);
LUTRA_DEPRECATED("lutra_optim_unref") LUTRA_API int lutra_optim_free(lutra_optim *o);
LUTRA_DEPRECATED("lutra_optim_destroy") LUTRA_API int lutra_optim_release(lutra_optim *o);
LUTRA_DEPRECATED("lutra_quantizer_unref") LUTRA_API int lutra_quantizer_free(lutra_quantizer *q);
LUTRA_DEPRECATED("lutra_quantizer_destroy")
LUTRA_API int lutra_quantizer_release(lutra_quantizer *q);
LUTRA_DEPRECATED("lutra_recipe_unref") LUTRA_API int lutra_recipe_free(lutra_recipe *r);
LUTRA_DEPRECATED("lutra_recipe_destroy") LUTRA_API int lutra_recipe_release(lutra_recipe *r);
LUTRA_DEPRECATED("lutra_tensor_unref") LUTRA_API int lutra_tensor_free(lutra_tensor *t);
LUTRA_DEPRECATED("lutra_tensor_destroy") LUTRA_API int lutra_tensor_release(lutra_tensor *t);

#ifdef __cplusplus
}
#endif
#endif /* !LUTRA_CDEF && !LUTRA_NO_DEPRECATED */
#endif /* LUTRA_DEPRECATED_H */
