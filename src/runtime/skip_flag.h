/* The device's "skip weight update" flag (runtime/skip_flag.c). */
#ifndef LUTRA_RUNTIME_SKIP_FLAG_H
#define LUTRA_RUNTIME_SKIP_FLAG_H

#include <stdbool.h>
#include <stdint.h>

/* Backend memory, allocated (zero) at first use, which must not be inside a CUDA graph capture.
 * *host_value: the value the host last set with lutra_set_skip_weight_update (what the flag
 * holds when work queued now runs). */
int lutra_skip_weight_flag(int device, const int32_t **flag, bool *host_value, const char *fn);

#endif
