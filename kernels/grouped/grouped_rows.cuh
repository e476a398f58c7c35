/* What the split quantizers share (kernels/grouped/grouped_quantize.cu,
 * kernels/grouped/grouped_quantize_blocks.cu): the rows being quantized, split among the experts,
 * and the scale rule's settings, as lutra_grouped_quant_args (src/backend/backend.h) gives them.
 * Each kernel's argument struct derives from it and adds its own outputs. */
#ifndef LUTRA_KERNELS_GROUPED_ROWS_CUH
#define LUTRA_KERNELS_GROUPED_ROWS_CUH

#include "backend/backend.h"
#include "backend/grouped_layout.h"

struct GroupedRows {
  const void *x;
  const void *const *xs;
  const int32_t *splits;
  int32_t *bad_split;
  int64_t total_rows, cols, rows_each;
  int num, align, power_2_scale;
  float fp8_max, eps;
  const int32_t *skip;
};

/* the rows of q (its splits only when the rows are a token matrix, not the weights xs) */
inline void take_rows(GroupedRows &a, const lutra_grouped_quant_args *q) {
  a.x = q->x;
  a.xs = q->xs;
  a.splits = q->xs ? nullptr : q->splits;
  a.bad_split = q->bad_split;
  a.total_rows = q->total_rows;
  a.cols = q->cols;
  a.rows_each = q->rows_each;
  a.num = q->num;
  a.align = q->out.align;
  a.power_2_scale = q->power_2_scale;
  a.fp8_max = q->fp8_max;
  a.eps = q->amax_epsilon;
  a.skip = q->skip;
}

/* The experts' splits in order (splits[e], or rows_each each when splits is null), for the
 * kernels that find where a row or a block of rows lies (the split quantizers, the grouped
 * dequantization): calls visit(e, r, s, p) for each expert e with a good split, given the good
 * experts' rows before it r, its rows s and its rows padded to align p. Returns false when a split
 * is negative (that expert is skipped) or, with splits, when they do not add up to total_rows. */
template <class Visit>
__device__ bool walk_splits(const int32_t *splits, int64_t rows_each, int64_t total_rows, int num,
                            int align, Visit &&visit) {
  bool ok = true;
  int64_t r = 0;
  /* the alignments are powers of two (src/backend/grouped_layout.h): a mask instead of the
   * 64-bit division, which the device emulates in tens of instructions, once per expert */
  const bool pow2 = align > 0 && (align & (align - 1)) == 0;
  const int64_t mask = ~(int64_t)(align - 1);
  for (int e = 0; e < num; e++) {
    const int64_t s = splits ? (int64_t)splits[e] : rows_each;
    if (s < 0) {
      ok = false;
      continue;
    }
    visit(e, r, s, pow2 ? (s + align - 1) & mask : lutra_grouped_roundup(s, align));
    r += s;
  }
  return ok && !(splits && r != total_rows);
}

#endif
