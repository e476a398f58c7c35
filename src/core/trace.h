/* NVTX ranges (core/trace.c): LUTRA_NVTX=1 at load turns them on; off, a site costs one branch. */
#ifndef LUTRA_CORE_TRACE_H
#define LUTRA_CORE_TRACE_H

#include "lutra.h"

extern int lutra_nvtx_enabled;
void lutra_range_push(const char *name);
void lutra_range_pop(void);
#define RANGE_PUSH(name)                                                                           \
  do {                                                                                             \
    if (lutra_nvtx_enabled) lutra_range_push(name);                                                \
  } while (0)
#define RANGE_POP()                                                                                \
  do {                                                                                             \
    if (lutra_nvtx_enabled) lutra_range_pop();                                                     \
  } while (0)

#endif
