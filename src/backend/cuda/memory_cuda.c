/* The CUDA backend's memory (cuda_backend.h): allocation from the stream-ordered pool, copies
 * and synchronization on the calling thread's stream. Allocation is cudaMallocAsync on the
 * thread's stream with the pool's release threshold raised (context_cuda.c), so freed memory is
 * reused and a steady training loop makes no driver allocations. */
#include "cuda_backend.h"

int lutra_cuda_alloc(size_t bytes, void **out) {
  TRY(lutra_cuda_refuse_in_capture("lutra_cuda_alloc", "a device allocation"));
  return lutra_cuda_status(cudaMallocAsync(out, bytes ? bytes : 256, lutra_cuda_stream()),
                           "lutra_cuda_alloc", "cudaMallocAsync");
}

/* Inside a capture the free waits for the capture's end (context_cuda.c keeps the list): a
 * free node in the graph would free the buffer again at every replay. */
void lutra_cuda_free(void *p) {
  if (!p) return;
  if (lutra_capture_active) {
    lutra_cuda_defer_free(p);
    return;
  }
  cudaFreeAsync(p, lutra_cuda_stream());
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

int lutra_cuda_memory(int reset_peak, int64_t *in_use, int64_t *peak) {
  static const char fn[] = "lutra_device_memory";
  int device;
  cudaMemPool_t pool;
  uint64_t used = 0, high = 0;
  TRY(lutra_cuda_status(cudaGetDevice(&device), fn, "cudaGetDevice"));
  TRY(lutra_cuda_status(cudaDeviceGetDefaultMemPool(&pool, device), fn,
                        "cudaDeviceGetDefaultMemPool"));
  TRY(lutra_cuda_status(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used), fn,
                        "cudaMemPoolGetAttribute"));
  TRY(lutra_cuda_status(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high), fn,
                        "cudaMemPoolGetAttribute"));
  *in_use = (int64_t)used;
  *peak = (int64_t)high;
  if (reset_peak) {
    uint64_t zero = 0; /* the only value the attribute takes: the mark restarts at current use */
    TRY(lutra_cuda_status(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero), fn,
                          "cudaMemPoolSetAttribute"));
  }
  return LUTRA_OK;
}
