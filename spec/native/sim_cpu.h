/* The CPU backend (src/backend/cpu/cpu.h) for the kernel emulators' checks, as cpu::...: a sim
 * includes this after the kernels. The namespace keeps codec.h's inline conversions apart from
 * kernels/common/'s (lkc), which the kernels' files pull into the global scope. */
#ifndef LUTRA_SIM_CPU_H
#define LUTRA_SIM_CPU_H

namespace cpu {
extern "C" {
#include "backend/cpu/cpu.h"
}
} // namespace cpu

#endif
