/* The GEMM front as modules use it (gemm/gemm.c; lutra_gemm checks its arguments first). */
#ifndef LUTRA_GEMM_GEMM_H
#define LUTRA_GEMM_GEMM_H

#include "lutra.h"

#include <stdbool.h>

/* One GEMM as modules ask for it: D [m, n] = op(B) @ op(A) (+ bias) (+ D when accumulating),
 * then the epilogue, in TransformerEngine's layout names (lutra_gemm in lutra.h). */
typedef struct lutra_gemm_op {
  const lutra_tensor *a, *b;
  lutra_tensor *d;
  const lutra_tensor *bias;            /* NULL: none */
  const lutra_tensor *c;               /* lutra_gemm_args.c: an addend of D's shape; NULL: none */
  const lutra_gemm_epilogue *epilogue; /* NULL: LUTRA_EPILOGUE_NONE */
  bool transa, transb;
  bool accumulate;
  bool fast_accum; /* FP8: no split accumulator (TransformerEngine's fprop setting) */
  bool bias_first; /* lutra_gemm_args.bias_first (backend/args_gemm.h) */
  /* non-NULL: the epilogue only inside the GEMM; where the plan would run it in kernels after
   * the GEMM, nothing runs and *epilogue_declined is set (else cleared) */
  bool *epilogue_declined;
} lutra_gemm_op;

/* Checks the op (shapes, dtypes, devices, the epilogue's rules), finds or makes its plan and runs
 * it; errors name fn. */
int lutra_gemm_run(const lutra_gemm_op *op, const char *fn);

#endif
