/* The backend's grouped arguments (GroupedLinear; backend/backend.h's grouped_quantize and
 * grouped_gemm entries). */
#ifndef LUTRA_BACKEND_ARGS_GROUPED_H
#define LUTRA_BACKEND_ARGS_GROUPED_H

#include "backend/args_common.h"

LUTRA_ARGS_NO_PADDING_BEGIN
/* ---- grouped operations (GroupedLinear; backend/grouped_layout.h has the packed FP8 layout) ----
 * Expert e owns rows [R_e, R_e + splits[e]) of the token-side matrices (x, y, dy, dx), R_e the
 * prefix sum. splits is backend memory, read where the work runs: the host never reads it on a
 * device. A split < 0, or splits summing to anything but total_rows, is an error: the CPU
 * refuses at once (LUTRA_EINVAL); a device backend sets *bad_split = 1 and writes nothing. */

/* The FP8 copy of one grouped operand in the packed layout. */
typedef struct lutra_grouped_fp8 {
  void *data, *scale_inv;         /* rowwise */
  void *col_data, *col_scale_inv; /* columnwise (each expert's transpose) */
  int32_t dtype;                  /* E4M3 / E5M2 */
  int32_t scaling;                /* LUTRA_SCALING_* */
  int32_t align;                  /* rows of each expert padded to a multiple of align */
  int32_t pad;
} lutra_grouped_fp8;

/* Quantize every expert's rows in one call, each with its own scaling state (its own scale and
 * amax for per-tensor scaling), into the packed layout. Expert e's rows are xs[e] [rows_each,
 * cols] when xs is not NULL (the weights), else its token rows of x (splits). */
typedef struct lutra_grouped_quant_args {
  int32_t num;
  int32_t kind; /* LUTRA_QUANT_DELAYED, _CURRENT, _MXFP8, _BLOCK_1D, _BLOCK_2D */
  const int32_t *splits;
  int32_t *bad_split;
  int64_t total_rows, cols;
  const void *x;
  const void *const *xs; /* backend memory [num] */
  int64_t rows_each;
  int32_t x_dtype;
  int32_t power_2_scale;
  float amax_epsilon;
  float fp8_max;
  int32_t block_dim;
  int32_t amax_stride; /* amax of expert e at amax[e * amax_stride] */
  /* per-tensor: expert e multiplies by scale[4 e]; current scaling writes it, and amax (e's
   * max|x|; delayed: max-accumulated into when amax is not NULL) */
  float *scale;
  float *amax;
  uint32_t *work; /* current scaling: 3 zero words per expert at work[4 e] (current_scale) */
  /* current scaling on CUDA: 2 zero words, the one-launch cast's tile tickets (left zero);
   * NULL: the amax pass and the cast are two launches */
  uint32_t *tickets;
  lutra_grouped_fp8 out;
  /* the bias gradient of each expert's rows: dbias[e] [cols] (+= when dbias_accumulate) */
  void *const *dbias; /* backend memory [num], or NULL */
  int32_t dbias_dtype;
  int32_t dbias_accumulate;
  const int32_t *skip; /* lutra_quant_args.skip */
  /* device scratch of lutra_grouped_scratch_bytes(num, in, out) bytes owned by the caller (the
   * offsets and GEMM argument arrays the kernels derive from splits); NULL on the CPU */
  void *scratch;
  /* An activation inside the cast, as lutra_quant_args.act_kind / act_forward say of one
   * matrix, over each expert's token rows (xs NULL; per-tensor scaling): act (not NULL) is the
   * activation's input, [total_rows, 2 cols] for a gated forward, else [total_rows, cols];
   * act_forward 0: x is the gradient of its output ([total_rows, cols / 2] for gated kinds).
   * The matrix quantized (and summed into dbias, and max'ed into amax) is the activation's
   * output or input gradient, each value rounded once into x_dtype as the activation's kernel
   * stores it; act_out, when not NULL, receives it ([total_rows, cols], x_dtype, unpadded). */
  const void *act;
  int32_t act_kind; /* LUTRA_ACT_*, not NONE with act */
  int32_t act_forward;
  void *act_out;
} lutra_grouped_quant_args;

/* Which of a GroupedLinear's three GEMMs, per expert e with s_e rows (W_e [out, in]):
 *   FPROP  y_e [s_e, out]  = x_e W_e^T (+ bias[e])
 *   DGRAD  dx_e [s_e, in]  = dy_e W_e
 *   WGRAD  dw[e] [out, in] (+)= dy_e^T x_e, and db[e] [out] = the column sums of dy_e */
enum { LUTRA_GROUPED_FPROP = 0, LUTRA_GROUPED_DGRAD = 1, LUTRA_GROUPED_WGRAD = 2 };

typedef struct lutra_grouped_gemm_args {
  int32_t pass; /* LUTRA_GROUPED_* */
  int32_t num;
  const int32_t *splits;
  int32_t *bad_split;
  int64_t total_rows, in, out;
  int32_t dtype;      /* of x, dy, W, y and dx */
  int32_t fp8;        /* 1: the operands are xq, dyq and wq (TN through their columnwise copies) */
  const void *x, *dy; /* high precision token operands */
  const void *const *w; /* backend memory [num]: W_e */
  lutra_grouped_fp8 xq, dyq, wq;
  void *y, *dx;
  void *const *dw; /* backend memory [num] */
  int32_t dw_dtype;
  int32_t accumulate;      /* WGRAD: dw[e] += (main_grad); db[e] += */
  const void *const *bias; /* FPROP: backend memory [num], or NULL */
  void *const *db;         /* WGRAD, high precision: backend memory [num], or NULL */
  int32_t bias_dtype;      /* bias's and db's */
  int32_t fast_accum;      /* FP8 FPROP: no split accumulator */
  void *scratch;           /* as lutra_grouped_quant_args.scratch */
  /* FPROP: where splits are copied as the GEMM reads them, or NULL. A module's forward reads
   * the caller's device splits in place and keeps this copy for its backward, so that a
   * forward issues no copy of its own. */
  int32_t *save_splits;
  /* the calling module's slot for the backend's cached graphs of its calls (CUDA: the call's
   * launches replayed as one graph, backend/cuda/call_graphs.c; freed by call_graphs_free), or
   * NULL: every call runs directly */
  void **call_graphs;
} lutra_grouped_gemm_args;
LUTRA_ARGS_NO_PADDING_END

#endif
