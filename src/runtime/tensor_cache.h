/* A module's buffer of one role kept per shape seen, a few at most: a module that alternates
 * between shapes (a training batch and an evaluation batch, say) finds each shape's buffer
 * again instead of reallocating on every switch, and its addresses stay stable per shape (CUDA
 * graphs of either step keep replaying). The least recently used buffer gives way to a new
 * shape once every slot is taken. */
#ifndef LUTRA_RUNTIME_TENSOR_CACHE_H
#define LUTRA_RUNTIME_TENSOR_CACHE_H

#include "runtime/tensor.h"

#include <stdint.h>

enum { LUTRA_TENSOR_CACHE_SLOTS = 4 };

typedef struct lutra_tensor_cache {
  lutra_tensor *slot[LUTRA_TENSOR_CACHE_SLOTS];
  uint64_t last_use[LUTRA_TENSOR_CACHE_SLOTS];
  uint64_t clock;
  int32_t recent; /* the slot the last lookup returned: it is already the most recently used */
} lutra_tensor_cache;

int lutra_tensor_cache_lookup(lutra_tensor_cache *c, const lutra_tensor_spec *s,
                              lutra_tensor **out, const char *fn);

/* The cached buffer that fits s (made, BORROWED, when none does); nothing changes on failure.
 * Inline for the steady state, where the shape is the last call's. */
static inline int lutra_tensor_cache_get(lutra_tensor_cache *c, const lutra_tensor_spec *s,
                                         lutra_tensor **out, const char *fn) {
  lutra_tensor *t = c->slot[c->recent];
  if (t && lutra_tensor_fits(t, s)) {
    *out = t;
    return 0;
  }
  return lutra_tensor_cache_lookup(c, s, out, fn);
}
/* the buffers made so far (for specs: a switch between known shapes makes none) */
int lutra_tensor_cache_count(const lutra_tensor_cache *c);
void lutra_tensor_cache_release(lutra_tensor_cache *c);

#endif
