/* lutra/nvfp4.h: NVFP4 (TransformerEngine's NVFP4BlockScaling), emulated bit-exactly on the CPU.
 * Part of lutra.h (include that one; its conventions hold here).
 *
 * Values: x = e2m1 * e4m3_block_scale * f32_tensor_decode_scale.
 *   E2M1 codes: 1 sign, 2 exponent (bias 1), 1 mantissa bit: +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}.
 *     Encoding is RNE and saturates (|x| > 6 and +-inf give +-6, NaN gives +6, as cuda_fp4.h's
 *     __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest) does; tools/check_fp4.cpp checks).
 *   Per copy (rowwise, columnwise) of a [R, C] matrix quantized along its rows:
 *     global_encode = 448 * 6 / amax(copy) (FLT_MAX when that overflows; 1 when amax is 0)
 *     block scale   = e4m3(block_amax * (global_encode * (1/6))), RNE, saturating at 448
 *     block encode  = 1 / (block scale * (1 / global_encode)), at most FLT_MAX
 *     (TE's compute_decoding_scaling_factor and compute_scaling_coefficient, in their order)
 *     code          = e2m1(x * block encode) (RNE; stochastic rounding for SR roles)
 *     decoded       = (e2m1 value * block scale) * (1 / global_encode), the product exact, one
 *                     rounding by the f32 multiply
 *   Blocks are 1x16 along the copy's rows; a 2D role (weights) takes one amax per 16x16 tile and
 *   writes the tile's scale into each of its 16 rows' entries, so its columnwise copy is the
 *   rowwise one transposed, codes and scales alike.
 * Layout of an NVFP4 tensor (dtype LUTRA_E2M1, scaling LUTRA_SCALING_NVFP4), [rows, cols] both
 * multiples of 16:
 *   data       [rows][cols / 2] bytes, two codes per byte, element 2k in the low nibble (as
 *              cuda_fp4.h's __nv_fp4x2 packs them); col_data: the transpose, [cols][rows / 2]
 *   scale_inv  [rows][cols / 16] E4M3 block scales, then at byte offset
 *              roundup(rows * cols / 16, 16) two f32: the copy's decode scale 1 / global_encode
 *              and the copy's amax (col_scale_inv: the same for the columnwise copy,
 *              [cols][rows / 16])
 * Memory per element, both copies: 2 x (0.5 + 1/16) = 1.125 bytes (NUMERICS.md's table).
 *
 * Stochastic rounding (grad_output by default): |v| between neighbouring E2M1 values lo < hi
 * rounds to hi when u < (|v| - lo) / (hi - lo) (exact in f32), u = 24 random bits / 2^24 from
 * splitmix64's finalizer of (seed ^ stream) + (index + 1) * 0x9E3779B97F4A7C15, where index is the
 * element's position in its copy, stream 0 for the rowwise copy and 0xD1B54A32D192ED03 for the
 * columnwise one, and seed = splitmix64(recipe seed + n * 0x9E3779B97F4A7C15) for the quantizer's
 * n-th quantization (n counts from 0 per quantizer): reproducible for a seed, the same on every
 * backend. |v| above 6 saturates to 6. The count n lives in the quantizer on the host: a CUDA
 * graph replays the seeds it captured; checkpoints carry n (<m>.fp8.<role>.quantizations), so a
 * resumed run draws the seeds the uninterrupted one would.
 *
 * Random Hadamard transform (RHT; the columnwise copies of input and grad_output by default, the
 * operands of the wgrad GEMM): each 16 consecutive values of a copy's row (along the GEMM's k),
 * y_j = (sum_i (s_i x_i) H_ij) / 4 with H the 16x16 Sylvester Hadamard matrix (H_ij =
 * (-1)^popcount(i & j)) and s_i = -1 where bit i of the sign mask is set (TE's wgrad sign
 * vector by default), summed in i order in f32. It is orthogonal, so the wgrad GEMM's result is
 * unchanged in exact arithmetic; amax and the scales are those of the transformed values (so an
 * RHT copy dequantizes to the transformed values, not to x's).
 *
 * GEMMs: Hopper has no FP4 tensor cores, so an NVFP4 GEMM dequantizes both operands to BF16
 * (the decoded value above, rounded once to BF16) and runs a BF16 GEMM with f32 accumulation;
 * the CPU backend computes the same BF16 operands and multiplies them in f32. Both operands of a
 * GEMM must be NVFP4, and the RHT is on both of the wgrad GEMM's operands (input, grad_output)
 * or on neither, never on the weight (recipes are checked at creation). */
#ifndef LUTRA_NVFP4_H
#define LUTRA_NVFP4_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { LUTRA_E2M1 = 7 };          /* FP4 E2M1 codes, two per byte (a dtype; numbered after i32) */
enum { LUTRA_SCALING_NVFP4 = 6 }; /* E4M3 per 16 elements + one f32 per copy (above) */
enum { LUTRA_QUANT_NVFP4 = 7 };   /* a custom recipe's (or factory's) quantizer kind */
/* per-role options (lutra_custom_desc.nvfp4, lutra_factory_choice.nvfp4) */
enum {
  LUTRA_NVFP4_2D = 1,  /* 16x16 tiles (TE: weights) */
  LUTRA_NVFP4_SR = 2,  /* stochastic rounding of the codes (TE: grad_output) */
  LUTRA_NVFP4_RHT = 4, /* RHT on the columnwise copy (TE: input and grad_output) */
  LUTRA_NVFP4_OPTION_MASK = 7
};
/* TE's wgrad sign vector {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1} as a mask
 * (bit i set: s_i = -1) */
enum { LUTRA_NVFP4_TE_SIGNS = 0xD7E8 };

/* The RHT (above) of each 16 consecutive values along the rows of x (f32, cols a multiple of 16)
 * into out (f32, x's shape; may be x), or its inverse (x_i = s_i (sum_j H_ij y_j) / 4) when
 * inverse != 0. CPU tensors; the reference the quantizers' RHT follows. */
LUTRA_API int lutra_nvfp4_rht(const lutra_tensor *x, uint32_t signs, int inverse,
                              lutra_tensor *out);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_NVFP4_H */
