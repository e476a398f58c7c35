/* Counts the process's heap allocations, for the examples' "allocations per step" line.
 *
 * Include it in exactly one file of an executable (the examples do) on glibc: the executable's
 * own malloc, calloc, realloc, posix_memalign, aligned_alloc and memalign come first in symbol
 * lookup, so every library of the process (liblutra, OpenBLAS, LuaJIT, libc itself) calls
 * them; each counts one allocation and hands the request to glibc's allocator (__libc_*).
 * frees are not counted. alloc_count() reads the total. Not for a process that preloads
 * another allocator (ASan's): its malloc would be bypassed. */
#ifndef LUTRA_EXAMPLE_ALLOC_COUNT_H
#define LUTRA_EXAMPLE_ALLOC_COUNT_H

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>

void *__libc_malloc(size_t n);
void *__libc_calloc(size_t count, size_t n);
void *__libc_realloc(void *p, size_t n);
void *__libc_memalign(size_t align, size_t n);
void __libc_free(void *p);

static atomic_ulong alloc_calls;

static unsigned long alloc_count(void) {
  return atomic_load_explicit(&alloc_calls, memory_order_relaxed);
}

static void alloc_counted(void) {
  atomic_fetch_add_explicit(&alloc_calls, 1, memory_order_relaxed);
}

void *malloc(size_t n) {
  alloc_counted();
  return __libc_malloc(n);
}
void *calloc(size_t count, size_t n) {
  alloc_counted();
  return __libc_calloc(count, n);
}
void *realloc(void *p, size_t n) {
  alloc_counted();
  return __libc_realloc(p, n);
}
void free(void *p) { __libc_free(p); }
void *memalign(size_t align, size_t n) {
  alloc_counted();
  return __libc_memalign(align, n);
}
void *aligned_alloc(size_t align, size_t n) {
  alloc_counted();
  return __libc_memalign(align, n);
}
int posix_memalign(void **out, size_t align, size_t n) {
  alloc_counted();
  if (align < sizeof(void *) || (align & (align - 1)) != 0) return EINVAL;
  void *p = __libc_memalign(align, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}

#endif
