/* lutra/autocast.h: process groups and autocast scopes.
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_AUTOCAST_H
#define LUTRA_AUTOCAST_H

#include "recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- process groups (amax reduction); NULL is the single-process group ----------------- */
typedef struct lutra_group lutra_group;

/* ---- autocast scopes --------------------------------------------------------------------- */
typedef struct lutra_autocast lutra_autocast;

LUTRA_API int lutra_autocast_new(lutra_recipe *r, lutra_group *g, int enabled, int calibrating,
                                 lutra_autocast **out);
LUTRA_API int lutra_autocast_unref(lutra_autocast *a);
LUTRA_API int lutra_autocast_destroy(lutra_autocast *a);
LUTRA_API int lutra_autocast_enter(lutra_autocast *a); /* refuses a scope already entered */
LUTRA_API int lutra_autocast_exit(lutra_autocast *a);  /* refuses a scope not innermost */
/* Error recovery: exits every scope of this thread above depth (lutra_autocast_state's depth
 * saved before entering), innermost first. Exiting the outermost scope this way discards the
 * amaxes recorded inside it instead of updating the scales with them (what a failed step
 * observed must not feed the next update). */
LUTRA_API int lutra_autocast_unwind(int depth);
/* The calling thread's state: depth of nesting, whether FP8 compute is on, calibration. */
LUTRA_API int lutra_autocast_state(int *depth, int *enabled, int *calibrating);
/* Number of delayed-scaling updates run on this thread (forward and backward), and the
 * number of quantizer metas the last one covered: for specs and benchmarks. */
LUTRA_API int lutra_autocast_update_stats(uint64_t *updates, int *last_count);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_AUTOCAST_H */
