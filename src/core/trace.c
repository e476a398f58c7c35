/* NVTX ranges around modules, quantizers, GEMMs and scale updates, on only when LUTRA_NVTX=1
 * at load time. When off, each site costs one predictable branch on a global. */
#include "core/trace.h"

#include <stdlib.h>
#include <string.h>

#ifdef LUTRA_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

int lutra_nvtx_enabled;

__attribute__((constructor)) static void read_nvtx_switch(void) {
  const char *v = getenv("LUTRA_NVTX");
  lutra_nvtx_enabled = v && strcmp(v, "1") == 0;
}

void lutra_range_push(const char *name) {
#ifdef LUTRA_WITH_CUDA
  nvtxRangePushA(name);
#else
  (void)name;
#endif
}

void lutra_range_pop(void) {
#ifdef LUTRA_WITH_CUDA
  nvtxRangePop();
#endif
}

int lutra_nvtx_active(void) {
  return lutra_nvtx_enabled;
}
