/* The rotary position embedding on CUDA (the table's rope entry): kernels/rope/rope.cu's
 * launcher on the calling thread's stream. The arguments it cannot take are refused here first,
 * with the reason (lutra_rope_args_problem, the CPU's check too). */
#include "cuda_backend.h"

#include "rope/rope.h"

int lutra_cuda_rope(const lutra_rope_args *a) {
  static const char fn[] = "lutra_cuda_rope";
  CHECK_ARG(a != NULL, "arguments are NULL");
  const char *why = lutra_rope_args_problem(a);
  CHECK_ARG(!why, "%s", why);
  return lutra_cuda_status(lk_rope(a, lutra_cuda_stream()), fn, "kernel rope");
}
