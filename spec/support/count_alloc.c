/* An LD_PRELOAD interposer for spec/wrap_spec.lua: counts the process's heap allocations
 * (malloc, calloc, realloc, aligned_alloc, posix_memalign, memalign) and forwards them to glibc. */
#include <stddef.h>
#include <stdint.h>

void *__libc_malloc(size_t);
void *__libc_calloc(size_t, size_t);
void *__libc_realloc(void *, size_t);
void *__libc_memalign(size_t, size_t);

static _Atomic unsigned long allocs;

unsigned long count_alloc_total(void) {
  return allocs;
}

void *malloc(size_t n) {
  allocs++;
  return __libc_malloc(n);
}

void *calloc(size_t n, size_t s) {
  allocs++;
  return __libc_calloc(n, s);
}

void *realloc(void *p, size_t n) {
  allocs++;
  return __libc_realloc(p, n);
}

void *memalign(size_t a, size_t n) {
  allocs++;
  return __libc_memalign(a, n);
}

void *aligned_alloc(size_t a, size_t n) {
  allocs++;
  return __libc_memalign(a, n);
}

int posix_memalign(void **out, size_t a, size_t n) {
  allocs++;
  void *p = __libc_memalign(a, n);
  if (!p) return 12; /* ENOMEM */
  *out = p;
  return 0;
}
