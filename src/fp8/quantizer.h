/* Quantizer internals used by modules and autocast (fp8/quantizer.c). */
#ifndef LUTRA_FP8_QUANTIZER_H
#define LUTRA_FP8_QUANTIZER_H

#include "backend/backend.h"
#include "fp8/recipe.h"

#include <stdbool.h>

lutra_scale_meta *lutra_quantizer_meta(lutra_quantizer *q);
int lutra_quantize_run(lutra_quantizer *q, const lutra_tensor *x, bool record_amax,
                       lutra_tensor **out, const char *fn);
int lutra_quantizer_create(const lutra_quantizer_spec *s, int rowwise, int columnwise, int device,
                           lutra_quantizer **out, const char *fn);
void lutra_quantizer_destroy(lutra_quantizer *q);
/* Checks dtype and the FP8 dims rule (multiples of 16; 32 for MXFP8) for a spec's input. */
int lutra_quantizer_check_input(const lutra_quantizer_spec *s, const lutra_tensor *x,
                                const char *fn);
/* lutra_quantize_run that also writes the bias gradient of x into dbias (see lutra_quant_args) */
int lutra_quantize_dbias_run(lutra_quantizer *q, const lutra_tensor *x, bool record_amax,
                             lutra_tensor *dbias, bool dbias_accumulate, lutra_tensor **out,
                             const char *fn);
/* Calibration: a delayed quantizer records max|x| without quantizing. */
int lutra_quantize_observe(lutra_quantizer *q, const lutra_tensor *x, const char *fn);
/* whether q can take the fused GELU gradient below (delayed scaling; a columnwise copy on cuda) */
bool lutra_quantizer_takes_dgelu(const lutra_quantizer *q);
/* lutra_quantize_dbias_run of dy * gelu'(act) (GELU's backward fused in front; delayed scaling
 * only): dy is the gradient of a GELU's output, act the GELU's input */
int lutra_quantize_dgelu_run(lutra_quantizer *q, const lutra_tensor *dy, const lutra_tensor *act,
                             lutra_tensor *dbias, bool dbias_accumulate, lutra_tensor **out,
                             const char *fn);
/* lutra_quantize_dbias_run governed by a skip flag (lutra_quant_args.skip; NULL: never skip) */
int lutra_quantize_skip_run(lutra_quantizer *q, const lutra_tensor *x, bool record_amax,
                            lutra_tensor *dbias, bool dbias_accumulate, const int32_t *skip,
                            lutra_tensor **out, const char *fn);

#endif
