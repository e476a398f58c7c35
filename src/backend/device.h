/* Which backend runs a device (backend/device.c): the registry above the interface. */
#ifndef LUTRA_BACKEND_DEVICE_H
#define LUTRA_BACKEND_DEVICE_H

#include "backend/backend.h"

/* *out = the backend for a device; else the status of why not (EINVAL: no such device,
 * EUNSUPPORTED: not in this build, EBACKEND: no usable GPU, ESTATE: cpu work while capturing),
 * with the error set for fn. */
int lutra_backend_get(int device, const lutra_backend **out, const char *fn);

/* Threads whose per-thread caches are still held: *gemm (GEMM plans and per-thread workspaces,
 * gemm/gemm.c) and *cuda (a CUDA context: stream, cuBLASLt handle, per-stream scratch; 0 without
 * CUDA). Each is released when its thread exits, so after threads have joined these count only
 * the live ones. Exported for spec/native/threads_check.c, not part of lutra.h's API. */
__attribute__((visibility("default"))) int lutra_thread_caches(int *gemm, int *cuda);

#endif
