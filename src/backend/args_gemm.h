/* The backend's GEMM arguments (backend/backend.h's gemm_plan, gemm_plan_free and gemm
 * entries): operands, the plan key and the plan, one GEMM. */
#ifndef LUTRA_BACKEND_ARGS_GEMM_H
#define LUTRA_BACKEND_ARGS_GEMM_H

#include "backend/args_common.h"

/* A GEMM operand as stored (row-major [rows, cols]) and how it is used. */
typedef struct lutra_gemm_operand {
  const void *data;
  const void *scale_inv; /* FP8 only */
  int32_t dtype;
  int32_t scaling;
  int64_t rows, cols;
  int32_t trans;
} lutra_gemm_operand;

/* What a plan is cached by. Compared with memcmp: build it zeroed. */
typedef struct lutra_gemm_key {
  int64_t m, n, k;
  int32_t a_dtype, b_dtype, d_dtype, bias_dtype; /* bias_dtype -1: no bias */
  int32_t a_scaling, b_scaling;
  int32_t transa, transb;
  int32_t accumulate;
  int32_t fast_accum;
  int32_t device;
  int32_t epilogue;    /* LUTRA_EPILOGUE_* */
  int32_t aux_dtype;   /* -1: no aux */
  int32_t dbias_dtype; /* -1: no dbias */
  /* 1 under the determinism switch (lutra/determinism.h): an algorithm that sums each dot
   * product in one sequence (no split-K) */
  int32_t deterministic;
  int32_t reserved; /* 0: the key stays a whole number of 8-byte words */
} lutra_gemm_key;

typedef struct lutra_gemm_plan {
  lutra_gemm_key key;
  size_t workspace_bytes; /* scratch the backend needs for this shape */
  void *backend_plan;     /* descriptors and algorithm (CUDA); NULL on CPU */
  /* the key's epilogue runs in kernels after the GEMM (CUDA, where cuBLASLt has no algorithm
   * with it), not inside it as cuBLASLt's and the CPU's own */
  bool epilogue_after;
} lutra_gemm_plan;

/* D [m, n] = op(B) [m, k] @ op(A) [k, n] (+ bias [n]) (+ D if accumulate) (+ C), then the
 * epilogue (lutra_gemm_epilogue in lutra.h; the front has checked its combination rules). */
typedef struct lutra_gemm_args {
  lutra_gemm_operand a, b;
  void *d;
  int32_t d_dtype;
  int32_t accumulate;
  int64_t m, n, k;
  /* an addend [m, n] in d_dtype (a residual), not D's buffer: D = op(B) op(A) + bias + C in f32,
   * rounded once (cuBLASLt's C with beta 1; the CPU adds it after the bias). NULL: none. Only
   * with epilogue NONE and without accumulate; its plans are accumulate's (key.accumulate 1) */
  const void *c;
  const void *bias;
  int32_t bias_dtype;
  int32_t epilogue; /* LUTRA_EPILOGUE_* */
  void *aux;        /* [m, n] row-major, aux_dtype (= d_dtype): GELU_AUX out, DGELU* in */
  void *dbias;      /* DGELU_BGRAD: [n]; BGRADB: [m] */
  int32_t aux_dtype;
  int32_t dbias_dtype;
  /* CPU, an f32 bias and no accumulate: D starts as the bias rows and BLAS adds the product to
   * them (beta 1), one pass over D less; the bias then joins the sum before BLAS's later K blocks
   * rather than after all of them, so the bits may differ from the plain order (the packed
   * inference forward's, nn/linear/linear_pack.h). Other backends and cases ignore it. */
  int32_t bias_first;
  const lutra_gemm_plan *plan;
  void *workspace;
  size_t workspace_bytes;
} lutra_gemm_args;

#endif
