/* CUDA graph capture in progress on this thread (set by runtime/graph.c): allocations, host
 * transfers, synchronizations and CPU-backend work refuse while it is. */
#ifndef LUTRA_CORE_CAPTURE_H
#define LUTRA_CORE_CAPTURE_H

#include <stdbool.h>

extern _Thread_local bool lutra_capture_active;
bool lutra_capturing(void);

#endif
