/* The element-wise sum of a residual connection on the CPU: the reference of kernels/residual.cu
 * (one f32 addition per element, rounded once into the dtype: exact on both backends). */
#include "cpu.h"

int lutra_cpu_add(const void *a, const void *b, void *out, int dtype, int64_t n) {
  static const char fn[] = "lutra_cpu_add";
  CHECK_FLOAT_DTYPE(dtype, "element");
  CHECK_ARG(n >= 0, "negative count %lld", (long long)n);
  CHECK_ARG(n == 0 || (a && b && out), "a, b or out is NULL");
  for (int64_t i = 0; i < n; i++)
    lutra_elem_store(out, dtype, i, lutra_elem_load(a, dtype, i) + lutra_elem_load(b, dtype, i));
  return LUTRA_OK;
}
