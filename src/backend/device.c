/* Which backend runs a device. The CUDA backend exists only in builds with CUDA, and even
 * there only when a CUDA device answers (checked once, at first use). */
#include "backend/device.h"
#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "core/capture.h"
#include "core/error.h"

#ifdef LUTRA_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

int lutra_backend_get(int device, const lutra_backend **out, const char *fn) {
  if (device == LUTRA_CPU) {
    /* CPU work runs now, not when a graph is replayed: it cannot be part of one */
    if (LUTRA_CAPTURING())
      return lutra_error(LUTRA_ESTATE, fn,
                         "work on the cpu device while capturing a CUDA graph (it would run once, "
                         "now, not at each replay): keep every tensor and module of the step on "
                         "cuda");
    *out = &lutra_cpu_backend;
    return LUTRA_OK;
  }
  if (device == LUTRA_CUDA) {
#ifdef LUTRA_WITH_CUDA
    return lutra_cuda_backend(out, fn);
#else
    return lutra_error(LUTRA_EUNSUPPORTED, fn,
                       "device 'cuda' is not available: this liblutra was built without CUDA");
#endif
  }
  return lutra_error(LUTRA_EINVAL, fn, "unknown device %d (expected LUTRA_CPU or LUTRA_CUDA)",
                     device);
}

int lutra_device_available(int device) {
  if (device == LUTRA_CPU) return 1;
#ifdef LUTRA_WITH_CUDA
  const lutra_backend *be;
  if (device == LUTRA_CUDA) return lutra_cuda_backend(&be, "lutra_device_available") == LUTRA_OK;
#endif
  return 0;
}

int lutra_device_synchronize(int device) {
  static const char fn[] = "lutra_device_synchronize";
  const lutra_backend *be;
  TRY(lutra_backend_get(device, &be, fn));
  return be->synchronize ? be->synchronize() : LUTRA_OK;
}

int lutra_cuda_set_stream(void *stream) {
#ifdef LUTRA_WITH_CUDA
  return lutra_cuda_use_stream(stream);
#else
  (void)stream;
  return lutra_error(LUTRA_EUNSUPPORTED, "lutra_cuda_set_stream",
                     "this liblutra was built without CUDA");
#endif
}

int lutra_device_memory(int device, int reset_peak, int64_t *in_use, int64_t *peak) {
  static const char fn[] = "lutra_device_memory";
  CHECK_ARG(in_use && peak, "in_use and peak must not be NULL");
  const lutra_backend *be;
  TRY(lutra_backend_get(device, &be, fn));
#ifdef LUTRA_WITH_CUDA
  if (device == LUTRA_CUDA) return lutra_cuda_memory(reset_peak, in_use, peak);
#endif
  (void)reset_peak;
  return lutra_error(LUTRA_EUNSUPPORTED, fn, "the cpu backend does not count its memory");
}
