/* The GEMM front as modules use it (gemm/gemm.c; lutra_gemm checks its arguments first). */
#ifndef LUTRA_GEMM_GEMM_H
#define LUTRA_GEMM_GEMM_H

#include "lutra.h"

int lutra_gemm_run(const lutra_tensor *a, int transa, const lutra_tensor *b, int transb,
                   lutra_tensor *d, const lutra_tensor *bias, int accumulate, int fast_accum,
                   const char *fn);
/* The same with an epilogue (NULL: LUTRA_EPILOGUE_NONE); checks the epilogue's rules. */
int lutra_gemm_run_ex(const lutra_tensor *a, int transa, const lutra_tensor *b, int transb,
                      lutra_tensor *d, const lutra_tensor *bias, int accumulate, int fast_accum,
                      const lutra_gemm_epilogue *epi, const char *fn);

#endif
