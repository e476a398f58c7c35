/* lutra/formats.h: scaling formats beyond the built-in recipes' (recipe prototyping).
 * Part of lutra.h (include that one; its conventions hold here).
 *
 * Rowwise scaling (torchao's ROWWISE): one f32 scale per row of the rowwise copy and one per row
 * of the columnwise (transposed) copy, i.e. per row and per column of the tensor, from that
 * row's amax by TransformerEngine's compute_scale_from_amax (power_2_scale and amax_epsilon as
 * current scaling's). The CPU backend emulates it bit-exactly; the CUDA kernels write the same
 * codes and scales, and CUDA GEMMs of rowwise operands run on operands dequantized to BF16 in
 * the workspace (exact with power-of-two scales). */
#ifndef LUTRA_FORMATS_H
#define LUTRA_FORMATS_H

#include "base.h"

enum { LUTRA_SCALING_ROWWISE = 5 }; /* one f32 scale_inv per row of the copy */
enum { LUTRA_QUANT_ROWWISE = 6 };   /* a custom recipe's (or factory's) quantizer kind */

#endif /* LUTRA_FORMATS_H */
