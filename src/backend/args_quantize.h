/* The backend's quantization arguments (backend/backend.h's cast, quantize_*, dequantize,
 * current_scale_act, delayed_update and rules_* entries): the delayed-scaling state of one
 * quantizer, one quantization and one dequantization. */
#ifndef LUTRA_BACKEND_ARGS_QUANTIZE_H
#define LUTRA_BACKEND_ARGS_QUANTIZE_H

#include "backend/args_common.h"

/* Delayed-scaling state of one quantizer. The struct lives on the host; the pointers point at
 * backend memory. scale and scale_inv are 16-byte aligned (cuBLASLt needs that for FP8). */
typedef struct lutra_scale_meta {
  float *scale;        /* [1] */
  float *scale_inv;    /* [1] */
  float *amax_history; /* [history_len]; [0] collects this step's amax (max-accumulated) */
  int32_t history_len;
  int32_t amax_compute_algo; /* LUTRA_AMAX_MAX or LUTRA_AMAX_MOST_RECENT */
  float fp8_max;
  int32_t margin;
  /* bookkeeping owned by autocast.c: which update list this meta joined last */
  uint64_t epoch;
  /* an external scaling rule's id (fp8/rules.c; 0: the built-in update, delayed_update) */
  int32_t rule;
} lutra_scale_meta;

LUTRA_ARGS_NO_PADDING_BEGIN
/* One quantization: x [rows, cols] (F32/BF16/F16) into FP8 rowwise and/or columnwise outputs,
 * in the layouts documented at lutra_tensor in lutra.h. NULL outputs are skipped. */
typedef struct lutra_quant_args {
  const void *x;
  int32_t x_dtype;
  int32_t out_dtype; /* LUTRA_E4M3 or LUTRA_E5M2 */
  int64_t rows, cols;
  void *data, *scale_inv;         /* rowwise output */
  void *col_data, *col_scale_inv; /* columnwise output (the transpose, quantized along its rows) */
  /* per-tensor casts */
  const float *scale; /* scale to multiply by before the cast; scale_inv outputs get 1/scale */
  float *amax;        /* if not NULL: *amax = max(*amax, max|x|) */
  /* block quantization (MXFP8 ignores these) */
  int32_t power_2_scale;
  float amax_epsilon;
  int32_t block_dim; /* 1: 1x128 blocks, 2: 128x128 tiles */
  int32_t pad;
  /* bias gradient of x, computed with the quantization (TransformerEngine's quantize_dbias):
   * dbias[c] (+= when dbias_accumulate) sum_r x[r, c], rounded once into dbias_dtype. The CPU
   * sums in double; a fused CUDA kernel sums each tile (64 rows, or 128 for k_cast16's) in f32
   * into dbias_scratch (lutra_dbias_scratch_floats(rows, cols) floats the backend provides) and
   * a second launch the tiles in double. */
  void *dbias;
  int32_t dbias_dtype;
  int32_t dbias_accumulate;
  float *dbias_scratch;
  /* GELU's backward fused in front (TransformerEngine's dgelu + cast + transpose + dbias): when
   * not NULL, the matrix quantized (and summed into dbias, and max'ed into amax) is
   * x * gelu'(act), in f32, where act is the GELU's input (x's dtype and shape): x is then the
   * gradient of the GELU's output. Per-tensor casts only (backend->cast); act_kind below
   * generalizes it to every activation kind and to the forward direction. */
  const void *act;
  /* TransformerEngine's noop flag: when not NULL and *skip != 0 at the time the work runs, the
   * quantization writes nothing at all (codes, scales, scale_inv, amax, dbias). Backend memory,
   * read by every kernel of the quantization on the device (so a CUDA graph can be replayed with
   * a different value); the CPU reads it directly. */
  const int32_t *skip;
  /* The activation kind of `act` (LUTRA_ACT_*; 0 with act set: the tanh GELU above) and its
   * direction, so that every kind's backward (TE's dact + dbias + cast + transpose) and forward
   * (quantize(act(x)) in one pass) runs inside the cast. rows and cols are always the shape of
   * the matrix quantized; act is the activation's input (the pre-activation):
   *   act_forward 0  x is the gradient of the activation's output ([rows, cols / 2] for gated
   *                  kinds, else [rows, cols]), act [rows, cols]; the matrix quantized is the
   *                  gradient of act (the gated kinds' both halves)
   *   act_forward 1  x is not read; act is [rows, 2 cols] for gated kinds, else [rows, cols];
   *                  the matrix quantized is act's output
   * Either way each value is the f32 formula of the activation backend entry, rounded once into
   * x_dtype, as activation_forward / activation_backward store it: the fused cast sees the
   * values the activation's own kernel would have written, bit for bit. act_out, when not
   * NULL, receives that matrix (x_dtype, [rows, cols]): the activation's output or input
   * gradient in high precision, written only when a caller needs it. */
  int32_t act_kind;
  int32_t act_forward;
  void *act_out;
  /* NVFP4 (lutra/nvfp4.h; out_dtype LUTRA_E2M1): LUTRA_NVFP4_* options, the RHT sign mask and
   * this quantization's stochastic-rounding seed (fp4_call_seed, core/fp4.h) */
  int32_t nvfp4;
  uint32_t rht_signs;
  uint64_t seed;
} lutra_quant_args;
LUTRA_ARGS_NO_PADDING_END

/* partial column sums kept by a fused quantize + bias gradient: one row per 64-row tile */
static inline int64_t lutra_dbias_scratch_floats(int64_t rows, int64_t cols) {
  return (rows + 63) / 64 * cols;
}

LUTRA_ARGS_NO_PADDING_BEGIN
/* Current scaling's amax and scale in one call (backend.h's current_scale): *amax = max|x| over
 * n elements of dtype (NaNs ignored; 0 when n == 0), *scale from it (TransformerEngine's
 * compute_scale_from_amax: fp8_max, power_2_scale, amax_epsilon). work: 2 words of backend
 * memory that are zero on entry and left zero (CUDA: the blocks' shared maximum and arrival
 * count; the last block to arrive writes *amax and *scale and clears them), so no memset
 * precedes it. Writes nothing at all when skip && *skip. */
typedef struct lutra_current_scale_args {
  const void *x;
  float *amax, *scale;
  uint32_t *work;
  const int32_t *skip;
  int32_t dtype;
  int32_t power_2_scale;
  float fp8_max;
  float amax_epsilon;
  int64_t n;
} lutra_current_scale_args;

/* The same with an activation inside the cast (backend.h's current_scale_act): the amax is over
 * the matrix that the cast of a (a->act_kind) quantizes, the scale from a->power_2_scale and
 * a->amax_epsilon; work as above; nothing written when a->skip is set. */
typedef struct lutra_current_scale_act_args {
  lutra_quant_args a;
  float *amax, *scale;
  uint32_t *work;
  float fp8_max;
  int32_t pad;
} lutra_current_scale_act_args;

/* Dequantize an FP8 matrix stored as [rows, cols] with the given scaling layout. */
typedef struct lutra_dequant_args {
  const void *data;
  const void *scale_inv;
  int32_t dtype;   /* E4M3 or E5M2 */
  int32_t scaling; /* LUTRA_SCALING_* */
  int64_t rows, cols;
  void *out;
  int32_t out_dtype; /* F32, BF16 or F16 */
  int32_t pad;
} lutra_dequant_args;
LUTRA_ARGS_NO_PADDING_END

#endif
