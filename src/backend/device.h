/* Which backend runs a device (backend/device.c): the registry above the interface. */
#ifndef LUTRA_BACKEND_DEVICE_H
#define LUTRA_BACKEND_DEVICE_H

#include "backend/backend.h"

/* The backend for a device, or NULL with the error set (names the calling function). */
const lutra_backend *lutra_backend_get(int device, const char *fn);

#endif
