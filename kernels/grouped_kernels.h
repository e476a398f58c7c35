/* Host launchers of GroupedLinear's device code (kernels/grouped_quantize.cu and
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

/* One grouped GEMM pass through CUTLASS's Hopper pointer-array grouped GEMM (sm_90a): a setup
 * kernel turns the device splits into the problem sizes, operand pointers and alphas in
 * scratch, then one CUTLASS launch runs every expert, then (FPROP with bias) one kernel adds
 * each expert's bias to its rows. cudaErrorNotSupported for a combination without an
 * instantiation (kernels/grouped_gemm_sm90.cu lists them) or a device below sm_90. */
cudaError_t lk_grouped_gemm(const lutra_grouped_gemm_args *g, void *workspace,
                            size_t workspace_bytes, cudaStream_t s);
/* the workspace lk_grouped_gemm needs for num experts (the CUTLASS kernels' own) */
size_t lk_grouped_gemm_workspace(int num);

#ifdef __cplusplus
}
#endif
#endif
