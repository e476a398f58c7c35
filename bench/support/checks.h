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

/* the check behind the three: the call's value v_ (of type), unless it equals good, is reported
 * with fmt and its arguments, which may use v_ */
#define CHECK_CALL(type, good, call, fmt, ...)                                                     \
  do {                                                                                             \
    type v_ = (call);                                                                              \
    if (v_ != (good)) {                                                                            \
      fprintf(stderr, "%s:%d: %s failed: " fmt "\n", __FILE__, __LINE__, #call, __VA_ARGS__);      \
      CHECK_FAILED;                                                                                \
    }                                                                                              \
  } while (0)

#define CK(call)                                                                                   \
  CHECK_CALL(cudaError_t, cudaSuccess, call, "%s (%s)", cudaGetErrorString(v_),                    \
             cudaGetErrorName(v_))
#define CB(call)                                                                                   \
  CHECK_CALL(cublasStatus_t, CUBLAS_STATUS_SUCCESS, call, "cuBLASLt status %d %s (%s)", (int)v_,   \
             cublasLtGetStatusName(v_), cublasLtGetStatusString(v_))
#define LU(call)                                                                                   \
  CHECK_CALL(int, LUTRA_OK, call, "%s: %s", lutra_status_name(v_), lutra_last_error())

#endif
