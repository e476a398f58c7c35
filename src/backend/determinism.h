/* The determinism switch's state for the layers that act on it (lutra/determinism.h): a
 * process-wide flag read where plans are keyed (GEMM, attention) and by the CPU backend's GEMM
 * threads; set between steps. */
#ifndef LUTRA_BACKEND_DETERMINISM_H
#define LUTRA_BACKEND_DETERMINISM_H

#include <stdatomic.h>
#include <stdbool.h>

extern atomic_int lutra_deterministic_flag;

static inline bool lutra_deterministic_on(void) {
  return atomic_load_explicit(&lutra_deterministic_flag, memory_order_relaxed) != 0;
}

/* the CPU backend's GEMM threads under the switch (cpu/threads_cpu.c): one while on, the count
 * asked for (LUTRA_CPU_THREADS, lutra_cpu_set_threads) otherwise */
void lutra_cpu_threads_follow_switch(void);

#endif
