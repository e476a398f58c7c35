/* The status checks of the floors library (bench/host_floors.cu, bench/host_replay.cu): each
 * prints the failed call with its file and line and returns 1 from the calling function, which
 * the library's API passes on (0: success). CK (CUDA runtime) and CB (cuBLASLt) are
 * support/checks.h's, with that action; CU checks a driver API call. */
#ifndef LUTRA_BENCH_HOST_CHECKS_H
#define LUTRA_BENCH_HOST_CHECKS_H

#include <cuda.h>
#include <cuda_runtime.h>

#include <stdio.h>

#define CHECK_FAILED return 1
#include "support/checks.h"

#define EXPORT extern "C" __attribute__((visibility("default")))

#define CU(call)                                                                                   \
  do {                                                                                             \
    CUresult r_ = (call);                                                                          \
    if (r_ != CUDA_SUCCESS) {                                                                      \
      const char *s_ = NULL, *n_ = NULL;                                                           \
      cuGetErrorString(r_, &s_);                                                                   \
      cuGetErrorName(r_, &n_);                                                                     \
      fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #call,                    \
              s_ ? s_ : "unknown error", n_ ? n_ : "?");                                           \
      CHECK_FAILED;                                                                                \
    }                                                                                              \
  } while (0)
#define TRY(call)                                                                                  \
  do {                                                                                             \
    if ((call) != 0) return 1;                                                                     \
  } while (0)

#endif
