/* Counts the GPU work a process issues through the CUDA runtime and cuBLASLt, for
 * bench/host_overhead.lua --count: preloaded (LD_PRELOAD) in front of libcudart.so and
 * libcublasLt.so, it wraps the calls below, counts them and forwards each to the real one.
 * The benchmark reads the counts through lutra_launch_counts() (found with ffi.C) around one
 * call of each figure, so each figure's floor is the sum of the raw floors of the work it
 * really issued. It is never loaded in the timing run.
 *
 * Build (bench/host_suite.sh does this):
 *   gcc -std=c11 -O2 -shared -fPIC -I/usr/local/cuda/include bench/launch_count.c \
 *     -o build/launch_count.so -ldl
 *
 * Counted: kernel launches (nvcc's <<<>>> calls __cudaLaunchKernel in CUDA 13, cudaLaunchKernel
 * before), cudaMemsetAsync, cudaMemcpyAsync, cublasLtMatmul, and the stream-ordered allocator's
 * cudaMallocAsync and cudaFreeAsync (host calls that are not in any floor), cudaGraphLaunch
 * (lutra's cached one-GEMM graphs, and whole-step graphs). cuBLASLt links its own static
 * runtime, so the kernels a cublasLtMatmul runs are not counted as launches (the matmul floor
 * includes them). */
#define _GNU_SOURCE
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { N_LAUNCH, N_MEMSET, N_MEMCPY, N_MATMUL, N_MALLOC, N_FREE, N_GRAPH, N_COUNTS };
static uint64_t counts[N_COUNTS]; /* the benchmark is single-threaded */

__attribute__((visibility("default"))) void lutra_launch_counts(uint64_t out[N_COUNTS]) {
  for (int i = 0; i < N_COUNTS; i++)
    out[i] = counts[i];
}

/* The real function: next in the global scope, else in the CUDA library lutra loaded. LuaJIT's
 * ffi.load opens liblutra.so (and with it libcudart and libcublasLt) RTLD_LOCAL, so their
 * symbols are not in the global scope RTLD_NEXT searches; they are already loaded when the
 * first wrapped call arrives, which RTLD_NOLOAD finds. */
static void *real(const char *name) {
  static const char *const libs[] = {"libcudart.so.13",   "libcublasLt.so.13", "libcudart.so.12",
                                     "libcublasLt.so.12", "libcudart.so",      "libcublasLt.so"};
  void *f = dlsym(RTLD_NEXT, name);
  for (size_t i = 0; !f && i < sizeof libs / sizeof *libs; i++) {
    void *h = dlopen(libs[i], RTLD_LAZY | RTLD_NOLOAD);
    if (h) f = dlsym(h, name);
  }
  if (!f) {
    fprintf(stderr, "launch_count: %s not found after the preloaded library\n", name);
    abort();
  }
  return f;
}

/* CUDA 13's launch entry point behind <<<>>> (crt/device_functions.h) */
typedef cudaError_t (*launch13_fn)(cudaKernel_t, dim3, dim3, void **, size_t, cudaStream_t);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t smem,
                               cudaStream_t stream) {
  static launch13_fn f;
  if (!f) f = (launch13_fn)real("__cudaLaunchKernel");
  counts[N_LAUNCH]++;
  return f(kernel, grid, block, args, smem, stream);
}

typedef cudaError_t (*launch_fn)(const void *, dim3, dim3, void **, size_t, cudaStream_t);
cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t smem,
                             cudaStream_t stream) {
  static launch_fn f;
  if (!f) f = (launch_fn)real("cudaLaunchKernel");
  counts[N_LAUNCH]++;
  return f(func, grid, block, args, smem, stream);
}

typedef cudaError_t (*memset_fn)(void *, int, size_t, cudaStream_t);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream) {
  static memset_fn f;
  if (!f) f = (memset_fn)real("cudaMemsetAsync");
  counts[N_MEMSET]++;
  return f(dst, value, bytes, stream);
}

typedef cudaError_t (*memcpy_fn)(void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  static memcpy_fn f;
  if (!f) f = (memcpy_fn)real("cudaMemcpyAsync");
  counts[N_MEMCPY]++;
  return f(dst, src, bytes, kind, stream);
}

typedef cublasStatus_t (*matmul_fn)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *,
                                    const void *, cublasLtMatrixLayout_t, const void *,
                                    cublasLtMatrixLayout_t, const void *, const void *,
                                    cublasLtMatrixLayout_t, void *, cublasLtMatrixLayout_t,
                                    const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha,
                              const void *a, cublasLtMatrixLayout_t la, const void *b,
                              cublasLtMatrixLayout_t lb, const void *beta, const void *c,
                              cublasLtMatrixLayout_t lc, void *d, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes,
                              cudaStream_t stream) {
  static matmul_fn f;
  if (!f) f = (matmul_fn)real("cublasLtMatmul");
  counts[N_MATMUL]++;
  return f(h, op, alpha, a, la, b, lb, beta, c, lc, d, ld, algo, ws, ws_bytes, stream);
}

typedef cudaError_t (*malloc_fn)(void **, size_t, cudaStream_t);
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t stream) {
  static malloc_fn f;
  if (!f) f = (malloc_fn)real("cudaMallocAsync");
  counts[N_MALLOC]++;
  return f(p, bytes, stream);
}

typedef cudaError_t (*free_fn)(void *, cudaStream_t);
cudaError_t cudaFreeAsync(void *p, cudaStream_t stream) {
  static free_fn f;
  if (!f) f = (free_fn)real("cudaFreeAsync");
  counts[N_FREE]++;
  return f(p, stream);
}

typedef cudaError_t (*graph_fn)(cudaGraphExec_t, cudaStream_t);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  static graph_fn f;
  if (!f) f = (graph_fn)real("cudaGraphLaunch");
  counts[N_GRAPH]++;
  return f(exec, stream);
}
