/* Whether this thread is capturing a CUDA graph (src/runtime/graph.c sets it between
 * lutra_graph_begin and lutra_graph_end/abort). Calls that cannot be captured check it and refuse.
 */
#include "core/capture.h"

_Thread_local bool lutra_capture_active;
int lutra_capture_threads;

bool lutra_capturing(void) {
  return lutra_capture_active;
}
