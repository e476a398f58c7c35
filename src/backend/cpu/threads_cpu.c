/* The CPU backend's GEMM threads: OpenBLAS's, which lutra sets at load (lutra/base.h says why
 * the default is one). OpenBLAS's threaded GEMM driver allocates its job table on the heap at
 * every call it splits across threads (Debian's build, with its large MAX_CPU_NUMBER, keeps it
 * off the stack), so a threaded GEMM breaks the no-allocation-per-step promise; one thread
 * never takes that path. */
#include "core/error.h"

#include <cblas.h>
#include <limits.h>
#include <stdlib.h>

static int openblas_own = 1; /* OpenBLAS's setting before lutra's (OPENBLAS_NUM_THREADS, cores) */

static void apply(int n) { /* 0: OpenBLAS's own */
  openblas_set_num_threads(n > 0 ? n : openblas_own);
}

__attribute__((constructor)) static void read_cpu_threads(void) {
  openblas_own = openblas_get_num_threads();
  const char *v = getenv("LUTRA_CPU_THREADS");
  char *end = NULL;
  long n = v && *v ? strtol(v, &end, 10) : 1;
  if (end && (*end != '\0' || n < 0 || n > INT_MAX)) n = 1; /* not a count: the default */
  apply((int)n);
}

int lutra_cpu_set_threads(int n) {
  static const char fn[] = "lutra_cpu_set_threads";
  CHECK_ARG(n >= 0, "thread count %d is negative (0: OpenBLAS's own setting)", n);
  apply(n);
  return LUTRA_OK;
}

int lutra_cpu_threads(void) {
  return openblas_get_num_threads();
}
