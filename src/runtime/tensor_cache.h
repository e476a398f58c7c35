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
} lutra_tensor_cache;

/* The cached buffer that fits s (made, BORROWED, when none does); nothing changes on failure. */
int lutra_tensor_cache_get(lutra_tensor_cache *c, const lutra_tensor_spec *s, lutra_tensor **out,
                           const char *fn);
/* the buffers made so far (for specs: a switch between known shapes makes none) */
int lutra_tensor_cache_count(const lutra_tensor_cache *c);
void lutra_tensor_cache_release(lutra_tensor_cache *c);

#endif
