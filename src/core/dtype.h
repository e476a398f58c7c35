/* dtype facts the core needs beyond the public lutra_dtype_* (core/dtype.c). */
#ifndef LUTRA_CORE_DTYPE_H
#define LUTRA_CORE_DTYPE_H

#include "lutra.h"

#include <stdbool.h>

bool lutra_dtype_is_float(int dtype); /* F32, BF16, F16 */
bool lutra_dtype_is_fp8(int dtype);   /* E4M3, E5M2 */
/* FP8 or E2M1 (lutra/nvfp4.h): values that need their tensor's scales */
bool lutra_dtype_is_quantized(int dtype);
/* bytes of n elements (E2M1: two per byte, so lutra_dtype_size, bytes per element, says 0) */
size_t lutra_dtype_bytes(int dtype, int64_t n);

#endif
