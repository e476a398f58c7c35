/* DotProductAttention's FP8 path (nn/attention_fp8.c; lutra/attention.h says what it computes):
 * the six delayed-scaling metas and their state in one backend buffer (the layout of
 * backend/args_attention.h), the FP8 copies of the inputs, output and gradients, and the steps
 * around the backend's attention calls: cast in, amaxes and saved scales out, dequantize out.
 * The metas join the autocast scope's update lists as a Linear's quantizers do. */
#ifndef LUTRA_NN_ATTENTION_FP8_H
#define LUTRA_NN_ATTENTION_FP8_H

#include "backend/backend.h"
#include "runtime/tensor_cache.h"

#include <stdbool.h>

typedef struct attention_fp8 {
  const lutra_backend *be;
  int32_t device;
  int32_t history_len; /* 0: not built */
  float *state;        /* backend memory: LUTRA_ATTN_FP8_HISTORY + 6 history_len floats */
  lutra_scale_meta metas[LUTRA_ATTENTION_FP8_TENSORS];
  uint64_t recipe_key; /* the recipe the state was built for */
  int32_t fwd_dtype, grad_dtype;
  /* FP8 copies: the inputs' (packed: [0] only), the output's, dout's, the gradients' */
  lutra_tensor_cache in_cache[3], out_cache, dout_cache, grad_cache[3];
  /* the last FP8 forward with grad's copies, held for its backward */
  const lutra_tensor *in[3], *out;
  int32_t inputs;
  bool last;    /* the last forward ran FP8 */
  bool trigger; /* this module's backward runs the scope's backward update */
} attention_fp8;

/* Whether this forward runs FP8 (*on): the module opted in and an enabled autocast scope has a
 * recipe; a recipe that does not scale input and grad_output by delayed scaling is refused.
 * Builds the state for the scope's recipe (again after a recipe change). */
int attention_fp8_begin(attention_fp8 *f, const lutra_attention_desc *d, bool *on, const char *fn);
/* Casts the n inputs x (1: packed, 3: q, k, v) into their FP8 copies with QKV's scale (its amax
 * recorded), points a's q, k, v (which address x) and out at the copies (out: into an E4M3
 * copy of out's shape) and sets its FP8 fields. */
int attention_fp8_forward_in(attention_fp8 *f, const lutra_tensor *const *x, int n,
                             const lutra_tensor *out, lutra_attention_args *a, const char *fn);
/* After the backend's forward: S's and O's amaxes into their histories, the scales the forward
 * used saved for its backward, O dequantized into out, the forward metas noted (and the
 * scope's backward trigger claimed by a forward with grad, its copies held). */
int attention_fp8_forward_out(attention_fp8 *f, lutra_tensor *out, bool grad, const char *fn);
/* The backward's: dout cast (grad_output's format, dO's scale), a's dout, dq, dk, dv (which
 * address the n gradient tensors g) pointed at FP8 copies; after the backend's backward, the
 * amaxes recorded, the copies dequantized into g, the backward metas noted. */
int attention_fp8_backward_in(attention_fp8 *f, const lutra_tensor *dout, lutra_tensor *const *g,
                              int n, lutra_attention_args *a, const char *fn);
int attention_fp8_backward_out(attention_fp8 *f, lutra_tensor *const *g, int n, const char *fn);
/* Checkpoints (lutra_checkpoint_ops.fp8_state): the six metas' scale, scale_inv and amax history
 * as views "qkv", "s", "o", "do", "dp", "dqkv" (<m>.fp8.qkv.scale, ...). With build_for and no
 * state built: fresh state for that recipe in *fresh (a delayed-scaling recipe; none for
 * others), installed by attention_fp8_adopt once the load succeeded or freed by _drop. */
struct lutra_fp8_state_sink;
int attention_fp8_checkpoint(attention_fp8 *f, const lutra_recipe *build_for,
                             const struct lutra_fp8_state_sink *sink, void **fresh, const char *fn);
void attention_fp8_adopt(attention_fp8 *f, void *fresh);
void attention_fp8_drop(void *fresh);
/* the tensors a CUDA graph of the last FP8 call must keep */
int attention_fp8_capture_hold(const attention_fp8 *f, bool backward, const char *fn);
void attention_fp8_release(attention_fp8 *f);

#endif
