/* DotProductAttention's plan cache (nn/attention_plans.h). */
#include "nn/attention_plans.h"
#include "core/error.h"
#include "nn/attention_workspace.h"
#include "runtime/tensor.h"

#include <string.h>

static void key_of(const lutra_attention_args *a, lutra_attention_args *key) {
  *key = *a;
  key->q = key->k = key->v = key->dout = NULL;
  key->out = key->dq = key->dk = key->dv = key->plan = key->workspace = NULL;
  key->stats = NULL;
  key->fp8_state = NULL;
  key->rng = NULL;
  key->seed = key->offset = 0;
  key->workspace_bytes = 0;
}

static int find(const attention_plans *c, const lutra_attention_args *key) {
  if (c->slot[c->recent].used && !memcmp(&c->slot[c->recent].key, key, sizeof *key))
    return c->recent;
  for (int i = 0; i < LUTRA_ATTENTION_PLANS; i++)
    if (c->slot[i].used && !memcmp(&c->slot[i].key, key, sizeof *key)) return i;
  return -1;
}

/* a free slot, else the least recently used one that is not keep */
static int victim(const attention_plans *c, int keep) {
  int best = -1;
  for (int i = 0; i < LUTRA_ATTENTION_PLANS; i++) {
    if (!c->slot[i].used) return i;
    if (i != keep && (best < 0 || c->slot[i].last_use < c->slot[best].last_use)) best = i;
  }
  return best;
}

static void free_slot(attention_plan_slot *s, const lutra_backend *be) {
  if (!s->used) return;
  if (s->plan) be->attention_plan_free(s->plan);
  memset(s, 0, sizeof *s);
}

/* the plan, and the shared workspace grown to its need now (so that a capture later finds it
 * large enough) */
static int build(const lutra_backend *be, int device, const lutra_attention_args *key,
                 attention_plan_slot *out, const char *fn) {
  void *plan = NULL;
  size_t bytes = 0;
  int deterministic = 0;
  int st = be->attention_plan(key, &plan, &bytes, &deterministic);
  if (st != LUTRA_OK) return lutra_error_wrap(st, fn);
  lutra_tensor *ws;
  st = attention_workspace_get(be, device, (int64_t)bytes, &ws, fn);
  if (st != LUTRA_OK) {
    if (plan) be->attention_plan_free(plan);
    return st;
  }
  *out = (attention_plan_slot){.key = *key,
                               .plan = plan,
                               .workspace_bytes = (int64_t)bytes,
                               .deterministic = deterministic,
                               .used = true};
  return LUTRA_OK;
}

int attention_plans_use(const attention_plans *c, int i, const lutra_backend *be, int device,
                        lutra_attention_args *a, lutra_tensor **ws, const char *fn) {
  const attention_plan_slot *s = &c->slot[i];
  TRY(attention_workspace_get(be, device, s->workspace_bytes, ws, fn));
  a->plan = s->plan;
  a->workspace = *ws ? (*ws)->data : NULL;
  a->workspace_bytes = *ws ? (*ws)->numel * 4 : 0;
  return LUTRA_OK;
}

int attention_plans_get(attention_plans *c, const lutra_backend *be, int device,
                        const lutra_attention_args *a, int keep, int *slot, const char *fn) {
  lutra_attention_args key;
  key_of(a, &key);
  int i = find(c, &key);
  if (i < 0) {
    attention_plan_slot fresh;
    TRY(build(be, device, &key, &fresh, fn));
    i = victim(c, keep);
    free_slot(&c->slot[i], be);
    c->slot[i] = fresh;
  }
  c->slot[i].last_use = ++c->clock;
  c->recent = i;
  *slot = i;
  return LUTRA_OK;
}

int attention_plans_count(const attention_plans *c) {
  int n = 0;
  for (int i = 0; i < LUTRA_ATTENTION_PLANS; i++)
    n += c->slot[i].used;
  return n;
}

void attention_plans_release(attention_plans *c, const lutra_backend *be) {
  for (int i = 0; i < LUTRA_ATTENTION_PLANS; i++)
    free_slot(&c->slot[i], be);
  c->recent = 0;
}
