/* dtype facts the core needs beyond the public lutra_dtype_* (core/dtype.c). */
#ifndef LUTRA_CORE_DTYPE_H
#define LUTRA_CORE_DTYPE_H

#include "lutra.h"

#include <math.h>
#include <stdbool.h>

/* inline: every GEMM, quantization and module call asks these several times */
static inline bool lutra_dtype_is_float(int dtype) { /* F32, BF16, F16 */
  return dtype == LUTRA_F32 || dtype == LUTRA_BF16 || dtype == LUTRA_F16;
}
static inline bool lutra_dtype_is_fp8(int dtype) { /* E4M3, E5M2 */
  return dtype == LUTRA_E4M3 || dtype == LUTRA_E5M2;
}
/* FP8 or E2M1 (lutra/nvfp4.h): values that need their tensor's scales */
static inline bool lutra_dtype_is_quantized(int dtype) {
  return lutra_dtype_is_fp8(dtype) || dtype == LUTRA_E2M1;
}
/* bytes of n elements (E2M1: two per byte, so lutra_dtype_size, bytes per element, says 0) */
size_t lutra_dtype_bytes(int dtype, int64_t n);

/* Every NaN as the one quiet NaN (0x7FC00000), for values handed to the host: LuaJIT keeps its
 * type tags in NaN payloads, so a float NaN such as 0xFFFFFFFF, widened to a double, reaches Lua
 * as a nil-typed value that `v ~= v` does not catch (and a hole in a table). */
static inline float lutra_canonical_nan(float v) {
  return v != v ? NAN : v;
}
static inline void lutra_canonical_nans(float *v, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    v[i] = lutra_canonical_nan(v[i]);
}

#endif
