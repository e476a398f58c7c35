/* The determinism switch (lutra/determinism.h): the flag, LUTRA_DETERMINISTIC read at load, and
 * what turning it on or off changes at once (the CPU backend's GEMM threads). The rest reads the
 * flag where it builds plans: gemm/gemm.c keys cuBLASLt plans by it, nn/attention.c cuDNN's. */
#include "backend/determinism.h"
#include "core/capture.h"
#include "core/error.h"

#include <stdlib.h>
#include <string.h>

atomic_int lutra_deterministic_flag;

/* before the default-priority constructors (the CPU backend's threads read the flag in theirs) */
__attribute__((constructor(101))) static void read_deterministic_env(void) {
  const char *v = getenv("LUTRA_DETERMINISTIC");
  atomic_store(&lutra_deterministic_flag, v && *v && strcmp(v, "0") != 0);
}

int lutra_set_deterministic(int on) {
  static const char fn[] = "lutra_set_deterministic";
  CHECK_ARG(on == 0 || on == 1, "on must be 0 or 1, not %d", on);
  CHECK_STATE(!lutra_capturing(),
              "inside a CUDA graph capture: the captured calls were planned under the old setting");
  atomic_store(&lutra_deterministic_flag, on);
  lutra_cpu_threads_follow_switch();
  return LUTRA_OK;
}

int lutra_deterministic(void) {
  return lutra_deterministic_on() ? 1 : 0;
}
