/* DotProductAttention's plans (nn/attention_plans.c): what the backend's attention_plan builds
 * for one (shape, strides, dtype, causal, dropout, determinism), kept with the workspace size it
 * needs (the workspace itself is shared: nn/attention_workspace.h), a few per module.
 * The least recently used gives way to a new key once every slot is taken, as the module's
 * per-shape buffers do (runtime/tensor_cache.h); a call whose key is the last call's finds it
 * with one comparison, builds and allocates nothing. */
#ifndef LUTRA_NN_ATTENTION_PLANS_H
#define LUTRA_NN_ATTENTION_PLANS_H

#include "backend/backend.h"

#include <stdbool.h>

typedef struct attention_plan_slot {
  lutra_attention_args key; /* the arguments with their pointers, seed and offset zeroed */
  void *plan;               /* the backend's (NULL on the CPU) */
  int64_t workspace_bytes;  /* what it needs (0: none) */
  int32_t deterministic;
  bool used;
  uint64_t last_use;
} attention_plan_slot;

typedef struct attention_plans {
  attention_plan_slot slot[LUTRA_ATTENTION_PLANS];
  uint64_t clock;
  int32_t recent; /* the slot the last lookup returned */
} attention_plans;

/* The slot of a's key, built (plan and workspace) when none holds it, in a free slot or in the
 * least recently used one other than keep (the slot a kept forward's backward still needs; -1:
 * none). Nothing changes on failure. The backend's attention_plan is given the key, its
 * pointers NULL: a plan serves every call of its key, whatever the addresses. */
int attention_plans_get(attention_plans *c, const lutra_backend *be, int device,
                        const lutra_attention_args *a, int keep, int *slot, const char *fn);
/* a's plan from slot i and its workspace, the shared one of the device and stream (*ws: its
 * tensor, NULL when the plan needs none; a capture must hold it) */
int attention_plans_use(const attention_plans *c, int i, const lutra_backend *be, int device,
                        lutra_attention_args *a, lutra_tensor **ws, const char *fn);
int attention_plans_count(const attention_plans *c);
void attention_plans_release(attention_plans *c, const lutra_backend *be);

#endif
