/* dtype facts the core needs beyond the public lutra_dtype_* (core/dtype.c). */
#ifndef LUTRA_CORE_DTYPE_H
#define LUTRA_CORE_DTYPE_H

#include "lutra.h"

#include <stdbool.h>

bool lutra_dtype_is_float(int dtype); /* F32, BF16, F16 */
bool lutra_dtype_is_fp8(int dtype);   /* E4M3, E5M2 */

#endif
