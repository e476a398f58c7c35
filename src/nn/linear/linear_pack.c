/* The CPU inference forward's packed weights (nn/linear/linear_pack.h) and their switch. */
#include "nn/linear/linear_pack.h"
#include "core/error.h"
#include "runtime/tensor.h"

atomic_int lutra_inference_pack_flag;

int lutra_cpu_set_inference_pack(int on) {
  static const char fn[] = "lutra_cpu_set_inference_pack";
  CHECK_ARG(on == 0 || on == 1, "on must be 0 or 1, not %d", on);
  atomic_store(&lutra_inference_pack_flag, on);
  return LUTRA_OK;
}

int lutra_cpu_inference_pack(void) {
  return atomic_load(&lutra_inference_pack_flag);
}

/* dst [cols, rows] = src [rows, cols]^T, in tiles that stay in L1 on both sides */
static void transpose_f32(const float *restrict src, float *restrict dst, int64_t rows,
                          int64_t cols) {
  enum { TILE = 32 };
  for (int64_t r0 = 0; r0 < rows; r0 += TILE)
    for (int64_t c0 = 0; c0 < cols; c0 += TILE) {
      const int64_t r1 = r0 + TILE < rows ? r0 + TILE : rows;
      const int64_t c1 = c0 + TILE < cols ? c0 + TILE : cols;
      for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++)
          dst[c * rows + r] = src[r * cols + c];
    }
}

int lutra_linear_pack(lutra_linear_core *c, const char *fn) {
  const bool fresh = c->packed == NULL || c->packed_from != c->weight;
  if (!fresh && !(c->weight->flags & LUTRA_TENSOR_REPACK)) return LUTRA_OK;
  const int64_t shape[2] = {c->in, c->out};
  TRY(lutra_tensor_ensure(&c->packed, PLAIN_TENSOR(LUTRA_F32, 2, shape, LUTRA_CPU), fn));
  transpose_f32(c->weight->data, c->packed->data, c->out, c->in);
  c->packed_from = c->weight;
  c->weight->flags &= ~(uint32_t)LUTRA_TENSOR_REPACK;
  return LUTRA_OK;
}
