/* CPU backend memory: aligned host allocations and plain copies. */
#include "cpu.h"

#include <stdlib.h>
#include <string.h>

int lutra_cpu_alloc(size_t bytes, void **out) {
  /* 256-byte alignment matches what the CUDA allocator gives, so layouts behave the same. */
  size_t rounded = (bytes + 255) & ~(size_t)255;
  void *p = aligned_alloc(256, rounded ? rounded : 256);
  if (!p) return lutra_error(LUTRA_ENOMEM, "lutra_cpu_alloc", "cannot allocate %zu bytes", bytes);
  *out = p;
  return LUTRA_OK;
}

void lutra_cpu_free(void *p) {
  free(p);
}

int lutra_cpu_memcpy(void *dst, const void *src, size_t bytes) {
  if (bytes) memmove(dst, src, bytes);
  return LUTRA_OK;
}

int lutra_cpu_memset(void *dst, int value, size_t bytes) {
  if (bytes) memset(dst, value, bytes);
  return LUTRA_OK;
}
