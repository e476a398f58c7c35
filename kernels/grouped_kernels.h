/* Host launchers of GroupedLinear's device code (kernels/grouped/grouped_quantize.cu and
 * kernels/grouped_gemm*.cu), callable from C (src/backend/cuda/grouped_cuda.c). Each queues its
 * launches on the stream and returns the CUDA status; none synchronizes, allocates or reads the
 * splits on the host. The scratch is the caller's lutra_grouped_scratch_bytes(num, in, out) bytes
 * of device memory: the row offsets first, then the GEMM's argument arrays. */
#ifndef LUTRA_GROUPED_KERNELS_H
#define LUTRA_GROUPED_KERNELS_H

#include <cuda_runtime.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* R [num + 1] (rows before expert e) then P [num + 1] (padded rows before it) */
static inline int64_t *lk_grouped_row_offsets(void *scratch, int num) {
  (void)num;
  return (int64_t *)scratch;
}
/* after them, 1 when the last kernel that read the splits found them good (0: bad, and the
 * kernels after it that read the offsets write nothing) */
static inline int64_t *lk_grouped_splits_ok(void *scratch, int num) {
  return (int64_t *)scratch + 2 * (size_t)(num + 1);
}
/* where the GEMM's arrays start: after the offsets and the flag, 256-byte aligned */
static inline char *lk_grouped_gemm_arrays(void *scratch, int num) {
  size_t off = ((2 * (size_t)(num + 1) + 1) * sizeof(int64_t) + 255) / 256 * 256;
  return (char *)scratch + off;
}

/* The split quantization (per-tensor scaling: LUTRA_QUANT_DELAYED and _CURRENT; others are
 * cudaErrorNotSupported). rows_cap: the padded rows the output holds (its grid). */
cudaError_t lk_grouped_quantize(const lutra_grouped_quant_args *q, int64_t rows_cap,
                                cudaStream_t s);

/* db[e] (+)= the column sums of expert e's rows of dy (in double, rows in order, as the CPU);
 * nothing is written when the splits are bad */
cudaError_t lk_grouped_dbias(const void *dy, int dtype, int64_t rows, int64_t cols, int num,
                             const int32_t *splits, void *const *db, int db_dtype, int accumulate,
                             cudaStream_t s);

/* The split quantization for the block-scaled recipes (LUTRA_QUANT_MXFP8, _BLOCK_1D, _BLOCK_2D;
 * kernels/grouped/grouped_quantize_blocks.cu): every expert's rows in one launch (and one more for
 * a bias gradient), codes and scales bit for bit the CPU's. */
cudaError_t lk_grouped_quantize_blocks(const lutra_grouped_quant_args *q, int64_t rows_cap,
                                       cudaStream_t s);

/* Dequantizes every expert's slice of a packed FP8 operand to bf16 in one launch
 * (kernels/grouped/grouped_dequant.cu), into the high-precision orientation: out holds expert e's
 * [p_e, cols] at element P_e * cols (p_e its rows padded to q->align, P_e their prefix sum),
 * from the rowwise copy, or from the columnwise copy transposed back. splits: the token counts
 * (device memory), or NULL for num experts of rows_each rows (weights). Any scaling mode; a
 * product of a code and a power-of-two scale is exact in bf16. */
cudaError_t lk_grouped_dequantize(const lutra_grouped_fp8 *q, int columnwise, const int32_t *splits,
                                  int64_t rows_each, int num, int64_t total_rows, int64_t cols,
                                  int64_t rows_cap, void *out, cudaStream_t s);

/* The bf16 operands of an FP8 grouped GEMM pass that runs dequantized (an operand in a block
 * scaling mode: Hopper has no MXFP8 tensor cores, and CUTLASS's grouped Hopper kernels take
 * per-tensor scales only; or a dtype pair without an FP8 instantiation): bytes of the token
 * operand A and of the other operand B, which lk_grouped_gemm expects in its workspace after
 * lk_grouped_gemm_workspace(num) bytes rounded up to 256. */
static inline int lk_grouped_gemm_dequantizes(const lutra_grouped_gemm_args *g) {
  if (!g->fp8) return 0;
  const lutra_grouped_fp8 *tok = g->pass == LUTRA_GROUPED_FPROP ? &g->xq : &g->dyq;
  const lutra_grouped_fp8 *oth = g->pass == LUTRA_GROUPED_WGRAD ? &g->xq : &g->wq;
  if (tok->scaling != LUTRA_SCALING_TENSOR || oth->scaling != LUTRA_SCALING_TENSOR) return 1;
  /* the FP8 instantiations: E4M3 or E5M2 tokens with E4M3 weights (x), bf16 out; E5M2 into
   * f32 main_grad */
  if (oth->dtype != LUTRA_E4M3) return 1;
  return g->pass == LUTRA_GROUPED_WGRAD && g->dw_dtype == LUTRA_F32 && tok->dtype != LUTRA_E5M2;
}
static inline void lk_grouped_dequant_bytes(const lutra_grouped_gemm_args *g, size_t *a_bytes,
                                            size_t *b_bytes) {
  const lutra_grouped_fp8 *tok = g->pass == LUTRA_GROUPED_FPROP ? &g->xq : &g->dyq;
  const int64_t tok_rows = g->total_rows + (int64_t)g->num * (tok->align - 1);
  const int64_t w_rows = (int64_t)g->num * ((g->out + g->wq.align - 1) / g->wq.align * g->wq.align);
  const int64_t a_cols = g->pass == LUTRA_GROUPED_FPROP ? g->in : g->out;
  const int64_t b_rows = g->pass == LUTRA_GROUPED_WGRAD ? tok_rows : w_rows;
  *a_bytes = ((size_t)(tok_rows * a_cols) * 2 + 255) / 256 * 256;
  *b_bytes = ((size_t)(b_rows * g->in) * 2 + 255) / 256 * 256;
}

/* One grouped GEMM pass through CUTLASS's Hopper pointer-array grouped GEMM (sm_90a): a setup
 * kernel turns the device splits into the problem sizes, operand pointers and alphas in
 * scratch, then one CUTLASS launch runs every expert, then (FPROP with bias) one kernel adds
 * each expert's bias to its rows. cudaErrorNotSupported for a combination without an
 * instantiation (kernels/grouped/grouped_gemm_sm90.cu lists them) or a device below sm_90. */
cudaError_t lk_grouped_gemm(const lutra_grouped_gemm_args *g, void *workspace,
                            size_t workspace_bytes, cudaStream_t s);
/* the workspace lk_grouped_gemm needs for num experts (the CUTLASS kernels' own) */
size_t lk_grouped_gemm_workspace(int num);

#ifdef __cplusplus
}
#endif
#endif
