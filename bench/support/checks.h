/* Status checks for the bench programs, the probes (bench/probes/) and tools/norm_ab: a failed
 * call prints itself with its file, line and error, then runs CHECK_FAILED, which ends the
 * program (exit 1) unless the includer defined it before (bench/host_checks.h: the floors
 * library returns 1 to its caller instead). C and C++ alike.
 *   CK(call)  a CUDA runtime call (cudaError_t)
 *   CB(call)  a cuBLASLt call (cublasStatus_t; the includer includes cublasLt.h)
 *   LU(call)  a lutra call (its status; the includer includes lutra.h)
 * Include it as "support/checks.h": bench/'s own files find it beside them, the others build
 * with -Ibench. */
#ifndef LUTRA_BENCH_CHECKS_H
#define LUTRA_BENCH_CHECKS_H

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#ifndef CHECK_FAILED
#define CHECK_FAILED exit(1)
#endif

#define CK(call)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #call,                    \
              cudaGetErrorString(e_), cudaGetErrorName(e_));                                       \
      CHECK_FAILED;                                                                                \
    }                                                                                              \
  } while (0)

#define CB(call)                                                                                   \
  do {                                                                                             \
    cublasStatus_t s_ = (call);                                                                    \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                             \
      fprintf(stderr, "%s:%d: %s failed: cuBLASLt status %d %s (%s)\n", __FILE__, __LINE__, #call, \
              (int)s_, cublasLtGetStatusName(s_), cublasLtGetStatusString(s_));                    \
      CHECK_FAILED;                                                                                \
    }                                                                                              \
  } while (0)

#define LU(call)                                                                                   \
  do {                                                                                             \
    int st_ = (call);                                                                              \
    if (st_ != LUTRA_OK) {                                                                         \
      fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call,                     \
              lutra_status_name(st_), lutra_last_error());                                         \
      CHECK_FAILED;                                                                                \
    }                                                                                              \
  } while (0)

#endif
