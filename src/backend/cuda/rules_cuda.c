/* External scaling rules on CUDA (lutra_backend.rules_gather / rules_apply): one gather-and-roll
 * kernel and ONE device-to-host copy, then a sync (the host reads the copy); one host-to-device
 * copy of the new scales and one kernel writing them, then a sync (the host array is reused).
 * The staging buffer belongs to the calling thread and only grows. */
#include "cuda_backend.h"

#include "kernels.h"

static _Thread_local struct {
  float *buf;
  size_t floats;
} staging;

static int refuse_capture(const char *fn) {
  CHECK_STATE(!LUTRA_CAPTURING(), "a scaling rule's host round trip cannot be captured in a graph");
  return LUTRA_OK;
}

static int ensure_staging(size_t floats, const char *fn) {
  if (floats <= staging.floats) return LUTRA_OK;
  if (staging.buf) (void)cudaFreeAsync(staging.buf, lutra_cuda_stream());
  staging.buf = NULL;
  staging.floats = 0;
  TRY(lutra_cuda_status(
      cudaMallocAsync((void **)&staging.buf, floats * sizeof(float), lutra_cuda_stream()), fn,
      "cudaMallocAsync"));
  staging.floats = floats;
  return LUTRA_OK;
}

int lutra_cuda_rules_gather(lutra_scale_meta *const *metas, int n, float *host) {
  static const char fn[] = "lutra_cuda_rules_gather";
  CHECK_ARG(n >= 0 && (n == 0 || (metas && host)), "bad arguments");
  if (!n) return LUTRA_OK;
  TRY(refuse_capture(fn));
  size_t f = 0;
  for (int j = 0; j < n; j++)
    f += 1 + (size_t)metas[j]->history_len;
  TRY(ensure_staging(f, fn));
  cudaStream_t s = lutra_cuda_stream();
  TRY(lutra_cuda_status(lk_rules_gather(metas, n, staging.buf, s), fn, "kernel rules_gather"));
  TRY(lutra_cuda_status(
      cudaMemcpyAsync(host, staging.buf, f * sizeof(float), cudaMemcpyDeviceToHost, s), fn,
      "cudaMemcpyAsync"));
  return lutra_cuda_status(cudaStreamSynchronize(s), fn, "cudaStreamSynchronize");
}

int lutra_cuda_rules_apply(lutra_scale_meta *const *metas, int n, const float *scales) {
  static const char fn[] = "lutra_cuda_rules_apply";
  CHECK_ARG(n >= 0 && (n == 0 || (metas && scales)), "bad arguments");
  if (!n) return LUTRA_OK;
  TRY(refuse_capture(fn));
  TRY(ensure_staging((size_t)n, fn));
  cudaStream_t s = lutra_cuda_stream();
  TRY(lutra_cuda_status(
      cudaMemcpyAsync(staging.buf, scales, (size_t)n * sizeof(float), cudaMemcpyHostToDevice, s),
      fn, "cudaMemcpyAsync"));
  TRY(lutra_cuda_status(lk_rules_apply(metas, n, staging.buf, s), fn, "kernel rules_apply"));
  return lutra_cuda_status(cudaStreamSynchronize(s), fn, "cudaStreamSynchronize");
}
