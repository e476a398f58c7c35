/* lutra/gemm.h: GEMMs and their epilogues.
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_GEMM_H
#define LUTRA_GEMM_H

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- GEMM -------------------------------------------------------------------------------- */
/* D = op_b(B) @ op_a(A) (+ bias broadcast over rows) (+ D when accumulate), row-major, with
 * TransformerEngine's layout names: transa/transb say whether A/B are used transposed.
 *   "TN" (transa=1, transb=0): D = B @ A^T   fprop: A = weight [out,in], B = input [N,in]
 *   "NN" (transa=0, transb=0): D = B @ A     dgrad: A = weight, B = grad_output
 *   "NT" (transa=0, transb=1): D = B^T @ A   wgrad: A = input, B = grad_output
 * FP8 operands are run as TN through their columnwise copies (Hopper's only FP8 layout). */
LUTRA_API int lutra_gemm(const lutra_tensor *a, int transa, const lutra_tensor *b, int transb,
                         lutra_tensor *d, const lutra_tensor *bias, int accumulate);

/* GEMM epilogues, as TransformerEngine runs them through cuBLASLt, in lutra's row-major naming
 * (P = op(B) [m,k] @ op(A) [k,n], computed in f32; everything below is applied to the f32 P
 * and rounded once into each output's dtype):
 *   NONE         D = P (+ bias[n]) (+ D when accumulate): lutra_gemm.
 *   GELU         D = gelu(P + bias)                                   (cuBLASLt GELU[_BIAS])
 *   GELU_AUX     D = gelu(P + bias), aux [m,n] = P + bias, the pre-activation that DGELU
 *                reads back in backward                       (cuBLASLt GELU_AUX[_BIAS])
 *   DGELU        D = P * gelu'(aux), aux [m,n] saved by GELU_AUX            (cuBLASLt DGELU)
 *   DGELU_BGRAD  DGELU, and dbias[n] = sum over rows of D: the bias gradient of the GELU input,
 *                summed from the f32 values before D's rounding          (cuBLASLt DGELU_BGRAD)
 *   BGRADB       D = P (+ D when accumulate), and dbias[m] = sum over k of op(B)[m,k]: in the
 *                wgrad layout NT (D[out,in] = dY^T X, B = dY [N,out]) the column sums of dY,
 *                the bias gradient                                          (cuBLASLt BGRADB)
 * gelu is the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the formula
 * of lutra_gelu_new and of cuBLASLt's GELU epilogue. Rules (refused with LUTRA_EINVAL,
 * nothing written, otherwise):
 * - aux: the shape of D ([m,n] as a matrix), D's dtype and device, not D itself; only for
 *   GELU_AUX, DGELU, DGELU_BGRAD. dbias: f32, bf16 or f16 on D's device, m or n elements as
 *   above; only for DGELU_BGRAD and BGRADB. Dbias sums run in double (CPU) and are rounded once.
 * - accumulate only with NONE and BGRADB: the GELU epilogues would apply to D_old + P.
 * - bias only with NONE, GELU, GELU_AUX (DGELU_BGRAD and BGRADB write dbias through
 *   cuBLASLt's bias pointer).
 * - FP8 operands with every kind but BGRADB (its bias gradient sums op(B), which must then be
 *   f32/bf16/f16): TE's FP8 fprop runs GELU_AUX_BIAS; lutra's FP8 MLP backward runs DGELU in
 *   the dgrad GEMM where cuBLASLt has it. */
enum {
  LUTRA_EPILOGUE_NONE = 0,
  LUTRA_EPILOGUE_GELU = 1,
  LUTRA_EPILOGUE_GELU_AUX = 2,
  LUTRA_EPILOGUE_DGELU = 3,
  LUTRA_EPILOGUE_DGELU_BGRAD = 4,
  LUTRA_EPILOGUE_BGRADB = 5,
  LUTRA_NUM_EPILOGUES = 6
};
typedef struct lutra_gemm_epilogue {
  int32_t kind; /* LUTRA_EPILOGUE_* */
  int32_t pad;
  lutra_tensor *aux;   /* GELU_AUX: output; DGELU, DGELU_BGRAD: input; else NULL */
  lutra_tensor *dbias; /* DGELU_BGRAD, BGRADB: output; else NULL */
} lutra_gemm_epilogue;
/* lutra_gemm with an epilogue; epi NULL is LUTRA_EPILOGUE_NONE (then it is lutra_gemm). */
LUTRA_API int lutra_gemm_ex(const lutra_tensor *a, int transa, const lutra_tensor *b, int transb,
                            lutra_tensor *d, const lutra_tensor *bias, int accumulate,
                            const lutra_gemm_epilogue *epi);
/* Plans (one per shape/dtype/layout/epilogue) and workspace bytes held by the caches. A thread
 * keeps at most 4096 plans per device: a new shape past that drops them (they are made again as
 * their shapes come back), so shapes that change every step cannot grow the cache forever. */
LUTRA_API int lutra_gemm_cache_stats(int *plans, size_t *workspace_bytes);
/* Eager cuda GEMMs replayed as CUDA graphs: a call seen again with the same arguments (pointers,
 * beta, stream) runs as a cudaGraphLaunch of its captured launches (a cublasLtMatmul; a
 * GroupedLinear's grouped GEMM: its setup and CUTLASS kernels), which costs the host less than
 * the call itself (docs/lab/), with the same results (src/backend/cuda/call_graphs.c;
 * LUTRA_GEMM_GRAPHS=0 at load turns it off). graphs: cached now; launches: calls served so
 * far. */
LUTRA_API int lutra_gemm_graph_stats(int64_t *graphs, int64_t *launches);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_GEMM_H */
