/* Quantizer internals used by modules and autocast (fp8/quantizer.c). */
#ifndef LUTRA_FP8_QUANTIZER_H
#define LUTRA_FP8_QUANTIZER_H

#include "backend/backend.h"
#include "fp8/recipe.h"

#include <stdbool.h>

lutra_scale_meta *lutra_quantizer_meta(lutra_quantizer *q);
int lutra_quantizer_create(const lutra_quantizer_spec *s, int rowwise, int columnwise, int device,
                           lutra_quantizer **out, const char *fn);
void lutra_quantizer_destroy(lutra_quantizer *q);
/* Checks dtype and the FP8 dims rule (multiples of 16; 32 for MXFP8) for a spec's input. */
int lutra_quantizer_check_input(const lutra_quantizer_spec *s, const lutra_tensor *x,
                                const char *fn);
/* whether q can take a fused GELU gradient (lutra_quantize_op.act): delayed scaling, whose scale
 * is known before the cast reads the gradient, and a columnwise copy on cuda */
bool lutra_quantizer_takes_dgelu(const lutra_quantizer *q);

/* One quantization as modules ask for it (what TransformerEngine spreads over quantize,
 * quantize_dbias, dact_cast and the noop flag). */
typedef struct lutra_quantize_op {
  const lutra_tensor *x;
  /* delayed scaling: max|x| goes into this step's amax slot (the scale update reads it) */
  bool record_amax;
  /* calibration: record max|x| (delayed scaling) and write no FP8 output (*out untouched) */
  bool observe;
  /* x is the gradient of a GELU's output and act the GELU's input: what is quantized (and summed
   * into dbias, and max'ed into amax) is x * gelu'(act), in one pass (lutra_quantizer_takes_dgelu)
   */
  const lutra_tensor *act;
  /* the bias gradient of what is quantized, from the same pass (lutra_quant_args.dbias) */
  lutra_tensor *dbias;
  bool dbias_accumulate;
  /* device flag (lutra_quant_args.skip): nonzero when the work runs -> nothing is written */
  const int32_t *skip;
} lutra_quantize_op;
int lutra_quantize_run(lutra_quantizer *q, const lutra_quantize_op *op, lutra_tensor **out,
                       const char *fn);

/* Checkpoints: the scaling state, in backend memory: scale and scale_inv (f32 [1] each, every
 * kind) and the delayed amax history (f32 [history_len], NULL for other kinds). */
typedef struct lutra_quantizer_state_view {
  float *scale, *scale_inv, *amax_history;
  int32_t history_len;
  const lutra_backend *be;
} lutra_quantizer_state_view;
int lutra_quantizer_state(lutra_quantizer *q, lutra_quantizer_state_view *v);

#endif
