/* CUDA graph capture in progress on this thread (set by runtime/graph.c): allocations, host
 * transfers, synchronizations and CPU-backend work refuse while it is. */
#ifndef LUTRA_CORE_CAPTURE_H
#define LUTRA_CORE_CAPTURE_H

#include <stdbool.h>

extern _Thread_local bool lutra_capture_active;
/* How many threads are capturing: a plain global the hot paths test before the thread-local
 * (which, in a shared library, costs a __tls_get_addr call). */
extern int lutra_capture_threads;
#define LUTRA_CAPTURING() (lutra_capture_threads && lutra_capture_active)
bool lutra_capturing(void);

/* What the graph being captured must keep: an object (module, loss, quantizer: its header's
 * refs and holds) or a tensor (its shell's refs). The graph drops them when freed, and refuses
 * to replay once one of them was freed (runtime/graph.c). */
enum { LUTRA_HOLD_OBJECT = 0, LUTRA_HOLD_TENSOR = 1 };
int lutra_capture_hold(int kind, void *p, const char *fn);

#endif
