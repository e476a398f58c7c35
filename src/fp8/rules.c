/* External scaling rules: the metas of recipes with a rule id are set aside by the scale update
 * (fp8/autocast.c) into a per-thread batch, which the caller (the Lua front) takes, computes new
 * scales for and applies (lutra/rules.h). The rules never run inside C: LuaJIT cannot compile a
 * trace across a C-to-Lua callback, and a callback made from a compiled trace fails, so C
 * returns to the front instead (LUTRA_RULES_PENDING) and the front runs them.
 *
 * Taking the batch copies the scales and histories to the host and rolls the histories at once,
 * so that once taken the quantizers are consistent whatever the rules do: a rule that raises
 * leaves them with their old scales (the batch is dropped at the next update). Buffers only
 * grow, so a steady loop allocates nothing here. */
#include "fp8/rules.h"
#include "backend/device.h"
#include "core/capture.h"
#include "core/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct batch {
  lutra_scale_meta **metas;
  lutra_rule_item *items;
  float *scales;
  int count, cap;
  int device;
  bool taken;
  float *host; /* gathered scales and histories */
  size_t host_cap;
} batch;

static _Thread_local batch tb;

/* The last error while a batch waits: lutra_rules_status tells a status returned for the batch
 * from an error that came after it. */
static const char pending_message[] =
    "scaling rules pending (run them: lutra_rules_take, lutra_rules_apply)";

static int grow(int need, const char *fn) {
  if (need <= tb.cap) return LUTRA_OK;
  int cap = tb.cap ? tb.cap : 16;
  while (cap < need)
    cap *= 2;
  lutra_scale_meta **m = realloc(tb.metas, (size_t)cap * sizeof *m);
  if (m) tb.metas = m;
  lutra_rule_item *it = m ? realloc(tb.items, (size_t)cap * sizeof *it) : NULL;
  if (it) tb.items = it;
  float *sc = it ? realloc(tb.scales, (size_t)cap * sizeof *sc) : NULL;
  if (!sc) return lutra_error(LUTRA_ENOMEM, fn, "cannot grow the scaling-rule batch");
  tb.scales = sc;
  tb.cap = cap;
  return LUTRA_OK;
}

static void clear(void) {
  tb.count = 0;
  tb.taken = false;
}

int lutra_rules_hand_over(lutra_scale_meta **items, int *count, int device, const char *fn) {
  /* taken and never applied: a rule raised; the quantizers kept their scales */
  if (tb.count && tb.taken) clear();
  CHECK_STATE(tb.count == 0,
              "the scaling rules of the last update were never run (a caller ignored "
              "LUTRA_RULES_PENDING; lutra_rules_take and lutra_rules_apply run them)");
  CHECK_STATE(!LUTRA_CAPTURING(),
              "a recipe with a scaling rule of its own (a Lua function) cannot run inside a CUDA "
              "graph capture: its rule runs on the host after every step");
  int ruled = 0;
  for (int i = 0; i < *count; i++)
    ruled += items[i]->rule != 0;
  if (!ruled) return LUTRA_OK;
  TRY(grow(ruled, fn));
  int kept = 0;
  for (int i = 0; i < *count; i++) {
    if (items[i]->rule)
      tb.metas[tb.count++] = items[i];
    else
      items[kept++] = items[i];
  }
  *count = kept;
  tb.device = device;
  tb.taken = false;
  return lutra_error(LUTRA_RULES_PENDING, fn, "%s", pending_message);
}

int lutra_rules_pending(void) {
  return tb.taken ? 0 : tb.count;
}

int lutra_rules_status(void) {
  if (!tb.count || tb.taken) return LUTRA_OK;
  const char *e = lutra_last_error(), *colon = strstr(e, ": ");
  return colon && strcmp(colon + 2, pending_message) == 0 ? LUTRA_RULES_PENDING : LUTRA_OK;
}

/* Drops the entries lutra_rules_forget cleared. */
static void compact(void) {
  int kept = 0;
  for (int i = 0; i < tb.count; i++)
    if (tb.metas[i]) tb.metas[kept++] = tb.metas[i];
  tb.count = kept;
}

int lutra_rules_take(lutra_rule_item **items, int *n) {
  static const char fn[] = "lutra_rules_take";
  CHECK_ARG(items && n, "output pointers must not be NULL");
  CHECK_STATE(!tb.taken, "the pending items were taken already (lutra_rules_apply them)");
  compact();
  *items = tb.items;
  *n = 0;
  if (!tb.count) return LUTRA_OK;
  const lutra_backend *be;
  TRY(lutra_backend_get(tb.device, &be, fn));
  CHECK_STATE(be->rules_gather && be->rules_apply, "the %s backend runs no scaling rules",
              be->name);
  size_t floats = 0;
  for (int i = 0; i < tb.count; i++)
    floats += 1 + (size_t)tb.metas[i]->history_len;
  if (floats > tb.host_cap) {
    float *h = realloc(tb.host, floats * sizeof *h);
    if (!h) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate the host copy of the histories");
    tb.host = h;
    tb.host_cap = floats;
  }
  TRY(be->rules_gather(tb.metas, tb.count, tb.host));
  size_t off = 0;
  for (int i = 0; i < tb.count; i++) {
    const lutra_scale_meta *m = tb.metas[i];
    const float *h = tb.host + off + 1;
    /* the built-in amax, for a recipe with a scaling rule only: lutra_cpu_delayed_update's */
    float mx = 0.0f;
    for (int32_t k = 0; k < m->history_len; k++)
      mx = fmaxf(mx, h[k]);
    tb.items[i] = (lutra_rule_item){
        .history = h,
        .history_len = m->history_len,
        .rule = m->rule,
        .scale = tb.host[off],
        .fp8_max = m->fp8_max,
        .margin = m->margin,
        .amax_compute_algo = m->amax_compute_algo,
        .amax = m->amax_compute_algo == LUTRA_AMAX_MOST_RECENT ? h[0] : mx,
        .new_scale = tb.host[off],
    };
    off += 1 + (size_t)m->history_len;
  }
  tb.taken = true;
  *n = tb.count;
  return LUTRA_OK;
}

int lutra_rules_apply(void) {
  static const char fn[] = "lutra_rules_apply";
  if (!tb.count) return LUTRA_OK;
  CHECK_STATE(tb.taken, "the pending items were not taken (lutra_rules_take first)");
  const lutra_backend *be;
  TRY(lutra_backend_get(tb.device, &be, fn));
  /* entries forgotten since the take (a quantizer freed while the rules ran) are skipped */
  int kept = 0;
  for (int i = 0; i < tb.count; i++) {
    if (!tb.metas[i]) continue;
    const float s = tb.items[i].new_scale;
    tb.scales[kept] = isfinite(s) && s > 0.0f ? s : tb.items[i].scale;
    tb.metas[kept++] = tb.metas[i];
  }
  int st = be->rules_apply(tb.metas, kept, tb.scales);
  clear();
  return st;
}

int lutra_rules_discard(void) {
  static const char fn[] = "lutra_rules_discard";
  if (!tb.count) return LUTRA_OK;
  int st = LUTRA_OK;
  if (!tb.taken) {
    const lutra_backend *be;
    st = lutra_backend_get(tb.device, &be, fn);
    for (int i = 0; st == LUTRA_OK && i < tb.count; i++)
      if (tb.metas[i]) st = be->memset(tb.metas[i]->amax_history, 0, sizeof(float));
  }
  clear();
  return st;
}

/* A quantizer freed while its meta waits in the batch (the garbage collector may run while the
 * rules do): its entry is cleared, so that the items taken keep their indices. */
void lutra_rules_forget(lutra_scale_meta *m) {
  for (int i = 0; i < tb.count; i++)
    if (tb.metas[i] == m) tb.metas[i] = NULL;
}
