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

/* What a tensor is made as. FP8 tensors (scaling != NONE) have a rowwise and/or a columnwise
 * copy with their scale arrays; high-precision ones have only the rowwise data. */
typedef struct lutra_tensor_spec {
  int32_t dtype;
  int32_t scaling; /* LUTRA_SCALING_* */
  int32_t ndim;
  int32_t device;
  const int64_t *shape;
  bool rowwise, columnwise;
  uint32_t flags; /* LUTRA_TENSOR_* (lutra_tensor_make only) */
} lutra_tensor_spec;

/* The spec (a pointer to a compound literal) of a high-precision tensor of dtype and shape. */
#define PLAIN_TENSOR(dtype_, ndim_, shape_, device_)                                               \
  (&(lutra_tensor_spec){.dtype = (dtype_),                                                         \
                        .ndim = (ndim_),                                                           \
                        .device = (device_),                                                       \
                        .shape = (shape_),                                                         \
                        .rowwise = true})

/* Allocates a tensor (FP8 ones with their scale arrays). */
int lutra_tensor_make(const lutra_tensor_spec *s, lutra_tensor **out, const char *fn);
/* Tensors owned by modules and quantizers: created borrowed (Lua must not free them) and
 * resized only when the spec changes. *t is replaced only on success. */
int lutra_tensor_ensure(lutra_tensor **t, const lutra_tensor_spec *s, const char *fn);
/* The same in two steps, for calls that must change nothing when a later step fails:
 * prepare gives the current tensor when it fits, else a new one (the current one untouched);
 * commit installs it (destroying the old), discard drops it. */
/* whether cur is what s describes (dtype, scaling, device, shape, rowwise/columnwise parts);
 * inline: every forward asks it of each of its buffers */
static inline bool lutra_tensor_fits(const lutra_tensor *cur, const lutra_tensor_spec *s) {
  if (!cur || cur->dtype != s->dtype || cur->scaling != s->scaling || cur->device != s->device ||
      cur->ndim != s->ndim || (cur->data != NULL) != s->rowwise ||
      (cur->col_data != NULL) != s->columnwise)
    return false;
  for (int i = 0; i < s->ndim; i++)
    if (cur->shape[i] != s->shape[i]) return false;
  return true;
}
int lutra_tensor_prepare(lutra_tensor *cur, const lutra_tensor_spec *s, lutra_tensor **out,
                         const char *fn);
void lutra_tensor_commit(lutra_tensor **slot, lutra_tensor *t);
void lutra_tensor_discard(lutra_tensor *slot, lutra_tensor *t);
/* An owner letting go of its tensor: the buffers are freed now whatever the flags; the shell
 * when no other reference remains, else it stays marked FREED. */
void lutra_tensor_owner_drop(lutra_tensor *t);
/* A holder's reference to the shell (a module's saved input, a captured graph), not counted as
 * the caller's (lutra_tensor_retain/unref, which refuse to drop an owner's reference). */
void lutra_tensor_take_ref(lutra_tensor *t);
void lutra_tensor_drop_ref(lutra_tensor *t);
/* Keeps a tensor seen by a module (a forward's input) from being freed under it: a Lua-owned
 * tensor keeps its buffers until the module lets go; a borrowed one whose owner frees or
 * replaces it is marked FREED instead. Free of allocation: the hot path calls it. */
static inline void lutra_tensor_hold(const lutra_tensor **slot, const lutra_tensor *t) {
  if (*slot == t) return;
  lutra_tensor_take_ref((lutra_tensor *)t);
  lutra_tensor_drop_ref((lutra_tensor *)*slot);
  *slot = t;
}
bool lutra_same_shape(const lutra_tensor *a, const lutra_tensor *b);

/* st, after marking t as written through the API when st is LUTRA_OK (an optimizer's f32 master
 * copy of t is then refreshed from t before its next step) */
static inline int lutra_tensor_mark_written(lutra_tensor *t, int st) {
  if (st == LUTRA_OK) t->flags |= LUTRA_TENSOR_WRITTEN | LUTRA_TENSOR_UPDATED | LUTRA_TENSOR_REPACK;
  return st;
}

/* Element count of the scale_inv arrays of a quantized [rows, cols] matrix. */
int64_t lutra_scale_count(int scaling, int64_t rows, int64_t cols, bool columnwise);

#endif
