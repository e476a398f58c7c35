/* The CUDA backend's memory (cuda_backend.h): allocation from the stream-ordered pool, copies
 * and synchronization on the calling thread's stream. Allocation is cudaMallocAsync on the
 * thread's stream with the pool's release threshold raised (context_cuda.c), so freed memory is
 * reused and a steady training loop makes no driver allocations. */
#include "cuda_backend.h"

#include <stdlib.h>

int lutra_cuda_alloc(size_t bytes, void **out) {
  TRY(lutra_cuda_refuse_in_capture("lutra_cuda_alloc", "a device allocation"));
  return lutra_cuda_status(cudaMallocAsync(out, bytes ? bytes : 256, lutra_cuda_stream()),
                           "lutra_cuda_alloc", "cudaMallocAsync");
}

/* Frees that arrive while this thread captures a graph (a :free(), or the garbage collector
 * finalizing a tensor from before the capture) must not become free nodes of the graph, which
 * would free the buffer again at every replay: they wait until the capture ends. */
static _Thread_local struct {
  void **ptrs;
  size_t count, cap;
} deferred;

void lutra_cuda_free(void *p) {
  if (!p) return;
  if (lutra_capture_active) {
    if (deferred.count == deferred.cap) {
      size_t cap = deferred.cap ? 2 * deferred.cap : 64;
      void **grown = realloc(deferred.ptrs, cap * sizeof *grown);
      if (!grown) return; /* cannot defer: leaking is safe, freeing into the graph is not */
      deferred.ptrs = grown;
      deferred.cap = cap;
    }
    deferred.ptrs[deferred.count++] = p;
    return;
  }
  cudaFreeAsync(p, lutra_cuda_stream());
}

void lutra_cuda_free_deferred(void) {
  for (size_t i = 0; i < deferred.count; i++)
    cudaFreeAsync(deferred.ptrs[i], lutra_cuda_stream());
  deferred.count = 0;
}

void lutra_cuda_deferred_release(void) {
  free(deferred.ptrs);
  deferred.ptrs = NULL;
  deferred.count = deferred.cap = 0;
}

int lutra_cuda_sync(void) {
  TRY(lutra_cuda_refuse_in_capture("lutra_device_synchronize", "a synchronization"));
  return lutra_cuda_status(cudaStreamSynchronize(lutra_cuda_stream()), "lutra_device_synchronize",
                           "cudaStreamSynchronize");
}

/* Host transfers synchronize: the host buffer may be reused as soon as the call returns. */
static int host_copy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                     const char *fn, const char *what) {
  TRY(lutra_cuda_refuse_in_capture(fn, what));
  TRY(lutra_cuda_status(cudaMemcpyAsync(dst, src, bytes, kind, lutra_cuda_stream()), fn,
                        "cudaMemcpyAsync"));
  return lutra_cuda_sync();
}

int lutra_cuda_from_host(void *dst, const void *src, size_t bytes) {
  return host_copy(dst, src, bytes, cudaMemcpyHostToDevice, "lutra_cuda_from_host",
                   "a host-to-device copy (it waits for the copy)");
}

int lutra_cuda_to_host(void *dst, const void *src, size_t bytes) {
  return host_copy(dst, src, bytes, cudaMemcpyDeviceToHost, "lutra_cuda_to_host",
                   "reading device memory on the host (e.g. a loss value)");
}

int lutra_cuda_copy(void *dst, const void *src, size_t bytes) {
  return lutra_cuda_status(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, lutra_cuda_stream()),
      "lutra_cuda_copy", "cudaMemcpyAsync");
}

int lutra_cuda_memset(void *dst, int value, size_t bytes) {
  return lutra_cuda_status(cudaMemsetAsync(dst, value, bytes, lutra_cuda_stream()),
                           "lutra_cuda_memset", "cudaMemsetAsync");
}
