/* External scaling rules, the C side (fp8/rules.c): the batch of metas set aside by an update. */
#ifndef LUTRA_FP8_RULES_H
#define LUTRA_FP8_RULES_H

#include "backend/backend.h"

/* Moves the metas with a rule out of items[0..*count) (the rest keep their order) into this
 * thread's pending batch. LUTRA_RULES_PENDING when it moved any; an error (nothing moved) when
 * a batch is still pending or a graph is being captured. */
int lutra_rules_hand_over(lutra_scale_meta **items, int *count, int device, const char *fn);

/* Removes a meta from the pending batch (its quantizer is being freed). */
void lutra_rules_forget(lutra_scale_meta *m);

#endif
