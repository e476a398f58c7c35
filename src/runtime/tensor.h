/* Tensor internals for the layers above the runtime: shapes, owned buffers, scale layouts. */
#ifndef LUTRA_RUNTIME_TENSOR_H
#define LUTRA_RUNTIME_TENSOR_H

#include "lutra.h"

#include <stdbool.h>
#include <stdint.h>

static inline int64_t lutra_rows(const lutra_tensor *t) {
  return t->ndim >= 1 ? t->numel / t->shape[t->ndim - 1] : 1;
}
static inline int64_t lutra_cols(const lutra_tensor *t) {
  return t->ndim >= 1 ? t->shape[t->ndim - 1] : 1;
}

/* Tensors owned by modules and quantizers: created borrowed (Lua must not free them) and
 * resized only when the shape changes. *t is replaced only on success. */
int lutra_tensor_ensure(lutra_tensor **t, int dtype, int scaling, int ndim, const int64_t *shape,
                        int device, bool rowwise, bool columnwise, const char *fn);
/* The same in two steps, for calls that must change nothing when a later step fails:
 * prepare gives the current tensor when it fits, else a new one (the current one untouched);
 * commit installs it (destroying the old), discard drops it. */
int lutra_tensor_prepare(lutra_tensor *cur, int dtype, int scaling, int ndim, const int64_t *shape,
                         int device, bool rowwise, bool columnwise, lutra_tensor **out,
                         const char *fn);
void lutra_tensor_commit(lutra_tensor **slot, lutra_tensor *t);
void lutra_tensor_discard(lutra_tensor *slot, lutra_tensor *t);
/* Allocates a tensor (FP8 ones with their scale arrays) with the given flags. */
int lutra_tensor_make(int dtype, int scaling, int ndim, const int64_t *shape, int device,
                      bool rowwise, bool columnwise, uint32_t flags, lutra_tensor **out,
                      const char *fn);
/* Frees a tensor's buffers and shell regardless of flags (for owners). */
void lutra_tensor_destroy(lutra_tensor *t);
bool lutra_same_shape(const lutra_tensor *a, const lutra_tensor *b);

/* Element count of the scale_inv arrays of a quantized [rows, cols] matrix. */
int64_t lutra_scale_count(int scaling, int64_t rows, int64_t cols, bool columnwise);

#endif
