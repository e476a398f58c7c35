/* An LD_PRELOAD interposer for spec/wrap_spec.lua and spec/moe_mlp_spec.lua: counts the
 * process's heap allocations (malloc, calloc, realloc, aligned_alloc, posix_memalign, memalign)
 * and forwards them to glibc. Not counted: those made by libgcc's unwinder, which LuaJIT calls to
 * register the unwind tables of each new machine-code area it compiles traces into - an area
 * fills up now and then, so a trace compiled inside a measured window would add two allocations
 * that are LuaJIT's, not the library's (seen as a sporadic "step=2" / "control=22"). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

void *__libc_malloc(size_t);
void *__libc_calloc(size_t, size_t);
void *__libc_realloc(void *, size_t);
void *__libc_memalign(size_t, size_t);

static _Atomic unsigned long allocs;
static _Thread_local int inside; /* dladdr below, should it allocate */

/* counts the allocation unless its caller is in libgcc_s (the unwinder, above) */
static void count(void *caller) {
  if (inside) return;
  inside = 1;
  Dl_info d;
  int unwinder = dladdr(caller, &d) && d.dli_fname && strstr(d.dli_fname, "libgcc_s");
  inside = 0;
  if (!unwinder) allocs++;
}
#define COUNT() count(__builtin_return_address(0))

unsigned long count_alloc_total(void) {
  return allocs;
}

void *malloc(size_t n) {
  COUNT();
  return __libc_malloc(n);
}

void *calloc(size_t n, size_t s) {
  COUNT();
  return __libc_calloc(n, s);
}

void *realloc(void *p, size_t n) {
  COUNT();
  return __libc_realloc(p, n);
}

void *memalign(size_t a, size_t n) {
  COUNT();
  return __libc_memalign(a, n);
}

void *aligned_alloc(size_t a, size_t n) {
  COUNT();
  return __libc_memalign(a, n);
}

int posix_memalign(void **out, size_t a, size_t n) {
  COUNT();
  void *p = __libc_memalign(a, n);
  if (!p) return 12; /* ENOMEM */
  *out = p;
  return 0;
}
