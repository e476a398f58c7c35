/* Per-shape buffers of one role (runtime/tensor_cache.h). A lookup compares a handful of specs:
 * no allocation while the shapes seen fit in the slots. */
#include "runtime/tensor_cache.h"
#include "core/error.h"

#include <string.h>

int lutra_tensor_cache_lookup(lutra_tensor_cache *c, const lutra_tensor_spec *s,
                              lutra_tensor **out, const char *fn) {
  int victim = 0;
  for (int i = 0; i < LUTRA_TENSOR_CACHE_SLOTS; i++) {
    lutra_tensor *t = c->slot[i];
    if (t && lutra_tensor_fits(t, s)) {
      c->last_use[i] = ++c->clock;
      c->recent = i;
      *out = t;
      return LUTRA_OK;
    }
    /* an empty slot first, else the least recently used */
    if (c->slot[victim] && (!t || c->last_use[i] < c->last_use[victim])) victim = i;
  }
  lutra_tensor_spec borrowed = *s;
  borrowed.flags = LUTRA_TENSOR_BORROWED;
  lutra_tensor *fresh;
  TRY(lutra_tensor_make(&borrowed, &fresh, fn));
  lutra_tensor_owner_drop(c->slot[victim]);
  c->slot[victim] = fresh;
  c->last_use[victim] = ++c->clock;
  c->recent = victim;
  *out = fresh;
  return LUTRA_OK;
}

int lutra_tensor_cache_count(const lutra_tensor_cache *c) {
  int n = 0;
  for (int i = 0; i < LUTRA_TENSOR_CACHE_SLOTS; i++)
    n += c->slot[i] != NULL;
  return n;
}

void lutra_tensor_cache_release(lutra_tensor_cache *c) {
  for (int i = 0; i < LUTRA_TENSOR_CACHE_SLOTS; i++)
    lutra_tensor_owner_drop(c->slot[i]);
  memset(c, 0, sizeof *c);
}
