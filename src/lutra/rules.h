/* lutra/rules.h: external scaling rules for delayed scaling (the Lua front's
 * lutra.recipe.delayed{amax_compute_algo = function, scaling_factor_compute_algo = function}).
 * Part of lutra.h (include that one; its conventions hold here).
 *
 * A delayed recipe (or a custom recipe's delayed roles) made with a nonzero `rule` id leaves
 * the scale update of its quantizers to the caller. At the points where the built-in update
 * runs (the exit of the outermost autocast scope for the forward roles; the backward of the
 * scope's first module for grad_output), their metas are set aside and the call that got there
 * (lutra_autocast_exit, lutra_module_backward) returns LUTRA_RULES_PENDING after doing all its
 * other work. The caller then takes the pending items, computes a scale for each and applies
 * them, before any other lutra call on that thread:
 *
 *   lutra_rule_item *items; int n;
 *   lutra_rules_take(&items, &n);          // rolls the histories; CUDA: one copy to the host
 *   for (i < n) items[i].new_scale = f(items[i].history, ...);
 *   lutra_rules_apply();                   // writes the scales; CUDA: one copy to the device
 *
 * A batch that is still pending when the next update comes makes that update fail (ESTATE).
 * Such recipes cannot run inside a CUDA graph capture (their rules run on the host). */
#ifndef LUTRA_RULES_H
#define LUTRA_RULES_H

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Returned by the calls above when external rules wait; not an error (the call succeeded). */
enum { LUTRA_RULES_PENDING = 64 };

/* One quantizer waiting for its rule. history (a host copy) as it was before the roll:
 * history[0] is this step's amax, history[1..len-1] the earlier steps' from the oldest to the
 * newest (TransformerEngine's layout). */
typedef struct lutra_rule_item {
  const float *history;
  int32_t history_len;
  int32_t rule; /* the recipe's rule id */
  float scale;  /* the current scale */
  float fp8_max;
  int32_t margin;
  int32_t amax_compute_algo; /* the recipe's LUTRA_AMAX_* */
  float amax;                /* what that built-in algorithm gives (max: fmaxf over the history) */
  float new_scale; /* set by the caller; apply keeps the old scale where it is not finite > 0 */
} lutra_rule_item;

/* Number of quantizers waiting to be taken (0: none). */
LUTRA_API int lutra_rules_pending(void);
/* LUTRA_RULES_PENDING when rules wait and the last error of this thread is still the one the
 * pending status set (no call failed since); else LUTRA_OK. For fronts that see a nonzero
 * status without its value. */
LUTRA_API int lutra_rules_status(void);
/* The waiting items (owned by the thread, valid until lutra_rules_apply). Taking them copies
 * the scales and histories (CUDA: one device-to-host copy and a sync) and rolls the histories
 * (as the built-in update does), so from here on the quantizers are consistent: a batch taken
 * and never applied (the caller's rule failed) leaves the old scales, and is dropped by the
 * next update. new_scale starts as the current scale. */
LUTRA_API int lutra_rules_take(lutra_rule_item **items, int *n);
/* Writes the new scales (scale_inv = 1 / scale; CUDA: one host-to-device copy); an item whose
 * new_scale is not finite and positive keeps its old scale. */
LUTRA_API int lutra_rules_apply(void);
/* Forgets the waiting batch without updating (error recovery): scales as they were; an untaken
 * batch's histories as they were with this step's amaxes zeroed. */
LUTRA_API int lutra_rules_discard(void);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_RULES_H */
