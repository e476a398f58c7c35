/* Quantizer internals used by modules and autocast (fp8/quantizer.c). */
#ifndef LUTRA_FP8_QUANTIZER_H
#define LUTRA_FP8_QUANTIZER_H

#include "backend/backend.h"
#include "fp8/recipe.h"

#include <stdbool.h>

lutra_scale_meta *lutra_quantizer_meta(lutra_quantizer *q);
int lutra_quantizer_create(const lutra_quantizer_spec *s, int rowwise, int columnwise, int device,
                           lutra_quantizer **out, const char *fn);
void lutra_quantizer_owner_drop(lutra_quantizer *q);
/* Checks dtype and the FP8 dims rule (multiples of 16; 32 for MXFP8) for a spec's input. */
int lutra_quantizer_check_input(const lutra_quantizer_spec *s, const lutra_tensor *x,
                                const char *fn);
/* whether q can take an activation inside its cast (lutra_quantize_op.act / act_forward): the
 * per-tensor scalings, delayed (its scale is known before the cast reads the values) and current
 * (an amax pass over the activation's values first: backend current_scale_act); the block
 * scalings' kernels read no activation */
bool lutra_quantizer_takes_act(const lutra_quantizer *q);

/* One quantization as modules ask for it (what TransformerEngine spreads over quantize,
 * quantize_dbias, dact_cast and the noop flag). */
typedef struct lutra_quantize_op {
  const lutra_tensor *x;
  /* delayed scaling: max|x| goes into this step's amax slot (the scale update reads it) */
  bool record_amax;
  /* calibration: record max|x| (delayed scaling) and write no FP8 output (*out untouched) */
  bool observe;
  /* An activation inside the cast (lutra_quant_args.act_kind; lutra_quantizer_takes_act):
   * act set (backward): x is the gradient of the activation's output and act its input; what is
   * quantized (and summed into dbias, and max'ed into amax) is the gradient of act, in one pass;
   * act_forward (act NULL): x is the activation's input and what is quantized its output.
   * act_kind LUTRA_ACT_* (0: the tanh GELU). The matrix quantized has act's shape (backward) or
   * the activation's output shape (forward); act_out, when not NULL, receives it in x's dtype. */
  const lutra_tensor *act;
  int32_t act_kind;
  bool act_forward;
  lutra_tensor *act_out;
  /* the bias gradient of what is quantized, from the same pass (lutra_quant_args.dbias) */
  lutra_tensor *dbias;
  bool dbias_accumulate;
  /* device flag (lutra_quant_args.skip): nonzero when the work runs -> nothing is written */
  const int32_t *skip;
  /* an inference forward's cast: the rowwise output only (no columnwise copy made), into a
   * buffer of its own (the quantizer keeps one per shape and layout seen) */
  bool rowwise_only;
} lutra_quantize_op;
int lutra_quantize_run(lutra_quantizer *q, const lutra_quantize_op *op, lutra_tensor **out,
                       const char *fn);

/* The norm writing this quantizer's output (backend norm_quantize, lutra_norm_quant_args):
 * whether q's scaling can (per-tensor delayed or current, MXFP8, 1x128 blocks; the backend has
 * the op), and that quantization of norm(n) into q's output for shape's shape (record_amax as in
 * lutra_quantize_op; n.y may be NULL; rowwise_only: an inference forward, no columnwise copy).
 * The output is what lutra_quantize_run of the norm's stored output gives, codes, scales and
 * amax. */
bool lutra_quantizer_fuses_norm(const lutra_quantizer *q);
int lutra_quantize_norm_run(lutra_quantizer *q, const lutra_norm_args *n, const lutra_tensor *shape,
                            bool record_amax, bool rowwise_only, lutra_tensor **out,
                            const char *fn);
/* Checkpoints: the scaling state, in backend memory: scale and scale_inv (f32 [1] each, every
 * kind) and the delayed amax history (f32 [history_len], NULL for other kinds); in host memory,
 * NVFP4's count of quantizations (each draws its stochastic-rounding seed from it; NULL for
 * other kinds), which an exact resume needs. */
typedef struct lutra_quantizer_state_view {
  float *scale, *scale_inv, *amax_history;
  int32_t history_len;
  const lutra_backend *be;
  uint64_t *calls;
} lutra_quantizer_state_view;
int lutra_quantizer_state(lutra_quantizer *q, lutra_quantizer_state_view *v);

#endif
