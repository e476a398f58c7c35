/* Rotary position embedding on the CPU: the reference of kernels/rope/rope.cu
 * (lutra_rope_args). Each pair is rotated in f32 with the products and the sum rounded as
 * written (C11 contracts no multiply-add), then rounded once to the dtype: the kernel, which
 * spells the same operations with __fmul_rn / __fadd_rn, gives the same bits. */
#include "cpu.h"

#include <string.h>

int lutra_cpu_rope(const lutra_rope_args *a) {
  static const char fn[] = "lutra_cpu_rope";
  CHECK_ARG(a != NULL, "arguments are NULL");
  const char *why = lutra_rope_args_problem(a);
  CHECK_ARG(!why, "%s", why);
  const int64_t half = a->rotary_dim / 2, *is = a->in_stride, *os = a->out_stride;
  const size_t esize = lutra_dtype_size(a->dtype);
  const bool in_place = a->in == a->out;
  const float sign = a->inverse ? -1.0f : 1.0f; /* the inverse rotates by -angle: sin negated */
  for (int64_t b = 0; b < a->b; b++)
    for (int64_t t = 0; t < a->s; t++) {
      const float *cs = a->table + (a->position_offset + t) * half * 2;
      for (int64_t h = 0; h < a->h; h++) {
        const int64_t in_row = b * is[0] + t * is[1] + h * is[2];
        const int64_t out_row = b * os[0] + t * os[1] + h * os[2];
        for (int64_t i = 0; i < half; i++) {
          const int64_t j0 = a->interleaved ? 2 * i : i, j1 = a->interleaved ? 2 * i + 1 : i + half;
          const float x0 = lutra_elem_load(a->in, a->dtype, in_row + j0 * is[3]);
          const float x1 = lutra_elem_load(a->in, a->dtype, in_row + j1 * is[3]);
          const float c = cs[2 * i], s = sign * cs[2 * i + 1];
          lutra_elem_store(a->out, a->dtype, out_row + j0 * os[3], x0 * c - x1 * s);
          lutra_elem_store(a->out, a->dtype, out_row + j1 * os[3], x1 * c + x0 * s);
        }
        if (in_place) continue;
        for (int64_t j = a->rotary_dim; j < a->d; j++) /* pass-through: the bits as they are */
          memcpy((char *)a->out + (size_t)(out_row + j * os[3]) * esize,
                 (const char *)a->in + (size_t)(in_row + j * is[3]) * esize, esize);
      }
    }
  return LUTRA_OK;
}
