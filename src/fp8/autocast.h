/* Autocast internals (fp8/autocast.c): the calling thread's state and the update lists. */
#ifndef LUTRA_FP8_AUTOCAST_H
#define LUTRA_FP8_AUTOCAST_H

#include "backend/backend.h"
#include "fp8/recipe.h"

#include <stdbool.h>

typedef struct lutra_tls_state {
  const lutra_recipe *recipe; /* NULL when no scope with a recipe is active */
  lutra_group *group;
  int32_t enabled;
  int32_t calibrating;
  int32_t depth;
  int32_t pad;
} lutra_tls_state;
const lutra_tls_state *lutra_autocast_current(void);
/* Called by modules for each delayed-scaling meta they use in forward / backward. */
int lutra_autocast_note_forward(lutra_scale_meta *m, int device, const char *fn);
int lutra_autocast_note_backward(lutra_scale_meta *m, int device, const char *fn);
/* The same for the n metas m[0 .. n - 1] in one call (a GroupedLinear's experts of one role):
 * what n single calls do, and on error none of it. */
int lutra_autocast_note_forward_n(lutra_scale_meta *m, int n, int device, const char *fn);
int lutra_autocast_note_backward_n(lutra_scale_meta *m, int n, int device, const char *fn);
/* True for the first module to run forward in the current outermost scope. */
bool lutra_autocast_claim_backward_trigger(void);
/* Runs the pending backward update (one backend call); called by the trigger module. */
int lutra_autocast_backward_done(const char *fn);
/* A failed forward / backward: what the pending list's quantizers recorded so far this step is
 * forgotten (their amax slots zeroed, the list emptied), so it cannot feed the next update. */
int lutra_autocast_discard_forward(const char *fn);
int lutra_autocast_discard_backward(const char *fn);
/* Removes a meta from the pending lists (its owner is being freed). */
void lutra_autocast_forget(lutra_scale_meta *m);
/* Threads whose update lists (or held group) are not released yet: each thread's are when it
 * exits. Exported for the thread checks (tools/threads_check.c), not part of lutra.h. */
__attribute__((visibility("default"))) int lutra_autocast_live_threads(void);

#endif
