/* The backend's embedding arguments (backend/backend.h's embedding entries). */
#ifndef LUTRA_BACKEND_ARGS_EMBEDDING_H
#define LUTRA_BACKEND_ARGS_EMBEDDING_H

#include "backend/args_common.h"

LUTRA_ARGS_NO_PADDING_BEGIN
/* An embedding lookup and its weight gradient; weight is [vocab, dim] of dtype, ids [n].
 * forward: out[p, :] = weight[ids[p], :].
 * backward: for every row r, s_r = the sum of dy[p, :] over the positions p with ids[p] == r, in
 * increasing p, in f32 starting from 0 (deterministic: same bits on every backend and run);
 * accumulate LUTRA_EMBEDDING_ADD_F32: wgrad (f32, a main grad) row r += s_r for the rows some id
 * hit, others untouched; LUTRA_EMBEDDING_ADD: the same into wgrad of dtype (a tied weight's
 * gradient, nn/tie.h), row r = round(wgrad[r] + s_r) once; LUTRA_EMBEDDING_OVERWRITE: wgrad
 * (dtype) row r = s_r rounded once, 0 for the rows no id hit. */
enum { LUTRA_EMBEDDING_OVERWRITE = 0, LUTRA_EMBEDDING_ADD_F32 = 1, LUTRA_EMBEDDING_ADD = 2 };
typedef struct lutra_embedding_args {
  const int32_t *ids;
  const void *weight; /* forward */
  void *out;          /* forward: [n, dim] of dtype */
  const void *dy;     /* backward: [n, dim] of dtype */
  void *wgrad;        /* backward: [vocab, dim], f32 for ADD_F32, else dtype */
  int32_t dtype;      /* weight's, out's and dy's */
  int32_t accumulate; /* LUTRA_EMBEDDING_OVERWRITE, _ADD_F32 or _ADD */
  int64_t n, dim, vocab;
  /* on a device, if not NULL: backend memory set to 1 when an id is outside [0, vocab) (never
   * cleared by the backend); the forward's rows of such ids are NaN and the backward skips them.
   * As lutra_loss_args.bad_label: a kernel cannot return an error and a read-back would
   * synchronize every call, so the module reads it at its host read (lutra_embedding_check). The
   * CPU refuses such ids at once instead. */
  int32_t *bad_id;
  /* backward on a device: lutra_backend.embedding_scratch(n, vocab) bytes of backend memory */
  void *scratch;
  int64_t scratch_bytes;
} lutra_embedding_args;
LUTRA_ARGS_NO_PADDING_END

#endif
