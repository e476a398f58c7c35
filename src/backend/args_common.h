/* What the backend's argument headers (backend/args_*.h) share: the public types, and the rule
 * that argument structs have no padding. */
#ifndef LUTRA_BACKEND_ARGS_COMMON_H
#define LUTRA_BACKEND_ARGS_COMMON_H

#include "lutra.h"

#include <stdbool.h>
#include <stdint.h>

/* Argument structs are compared as bytes (backend/cuda/call_graphs.c keys a cached call by its
 * struct): no padding, which -Wpadded checks; a spare word is a named pad, zeroed by the
 * initializers that build every struct. Such structs sit between LUTRA_ARGS_NO_PADDING_BEGIN
 * and _END (C compilers that know GCC's pragmas check; nvcc and the C++ sims do not). */
#if defined(__GNUC__) && !defined(__CUDACC__) && !defined(__cplusplus)
#define LUTRA_ARGS_NO_PADDING_BEGIN                                                                \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic error \"-Wpadded\"")
#define LUTRA_ARGS_NO_PADDING_END _Pragma("GCC diagnostic pop")
#else
#define LUTRA_ARGS_NO_PADDING_BEGIN
#define LUTRA_ARGS_NO_PADDING_END
#endif

#endif
