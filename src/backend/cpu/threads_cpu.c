/* The CPU backend's GEMM threads: OpenBLAS's, which lutra sets at load (lutra/base.h says why
 * the default is one). OpenBLAS's threaded GEMM driver allocates its job table on the heap at
 * every call it splits across threads (Debian's build, with its large MAX_CPU_NUMBER, keeps it
 * off the stack), so a threaded GEMM breaks the no-allocation-per-step promise; one thread
 * never takes that path. Under the determinism switch (lutra/determinism.h) GEMMs run on one
 * thread whatever was asked: OpenBLAS splits some shapes' sums by its thread count, so its bits
 * depend on it (e.g. a 128 x 96 x 3000 SGEMM differs between 1 and 2 threads). */
#include "backend/determinism.h"
#include "core/error.h"

#include <cblas.h>
#include <limits.h>
#include <stdlib.h>

static int openblas_own = 1; /* OpenBLAS's setting before lutra's (OPENBLAS_NUM_THREADS, cores) */
static int asked = 1;        /* LUTRA_CPU_THREADS or lutra_cpu_set_threads; 0: OpenBLAS's own */

static void apply(int n) {
  asked = n;
  lutra_cpu_threads_follow_switch();
}

void lutra_cpu_threads_follow_switch(void) {
  openblas_set_num_threads(lutra_deterministic_on() ? 1 : asked > 0 ? asked : openblas_own);
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
  CHECK_STATE(n == 1 || !lutra_deterministic_on(),
              "the determinism switch is on (lutra_set_deterministic): GEMMs run on one thread, "
              "since OpenBLAS's results depend on its thread count; turn it off first");
  apply(n);
  return LUTRA_OK;
}

int lutra_cpu_threads(void) {
  return openblas_get_num_threads();
}
