/* Which backend runs a device (backend/device.c): the registry above the interface. */
#ifndef LUTRA_BACKEND_DEVICE_H
#define LUTRA_BACKEND_DEVICE_H

#include "backend/backend.h"

/* *out = the backend for a device; else the status of why not (EINVAL: no such device,
 * EUNSUPPORTED: not in this build, EBACKEND: no usable GPU, ESTATE: cpu work while capturing),
 * with the error set for fn. */
int lutra_backend_get(int device, const lutra_backend **out, const char *fn);

#endif
