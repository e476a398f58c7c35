/* CUDA graph capture in progress on this thread (set by runtime/graph.c): allocations, host
 * transfers, synchronizations and CPU-backend work refuse while it is. */
#ifndef LUTRA_CORE_CAPTURE_H
#define LUTRA_CORE_CAPTURE_H

#include "lutra.h"

#include <stdbool.h>

extern _Thread_local bool lutra_capture_active;
/* How many threads are capturing: a plain global the hot paths test before the thread-local
 * (which, in a shared library, costs a __tls_get_addr call). */
extern int lutra_capture_threads;
#define LUTRA_CAPTURING() (lutra_capture_threads && lutra_capture_active)
bool lutra_capturing(void);

/* What the graph being captured must keep: a tensor (its shell's refs), or an object (module,
 * loss, MoE router...: its header's refs and holds) with the function that drops a reference to
 * it, its owner's free. The graph drops them when freed, and refuses to replay once one of them
 * was freed (runtime/graph.c). The release function comes from the holder so that the graph,
 * below nn/ in the layers, never names the kinds above it. */
typedef int (*lutra_capture_release)(void *object);
int lutra_capture_hold_tensor(const lutra_tensor *t, const char *fn);
int lutra_capture_hold_object(void *object, lutra_capture_release release, const char *fn);

#endif
