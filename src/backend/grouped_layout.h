/* The packed layout of a grouped FP8 operand (GroupedLinear's experts quantized together), shared
 * by the CPU reference (backend/cpu/grouped_cpu.c), the CUDA kernels and the module that sizes
 * the buffers (nn/grouped/grouped_linear.c). Plain C with no dependency above the backend.
 *
 * Expert e has r_e rows (its split for tokens, out_features for weights), padded to
 * p_e = roundup(r_e, align) rows whose extra rows quantize as zeros. With P_e = sum_{j<e} p_j:
 *   rowwise data      [p_e, cols] at element P_e * cols (one byte per FP8 element)
 *   columnwise data   [cols, p_e] (the expert's transpose) at element P_e * cols
 *   scale arrays      expert e's own array, exactly as lutra.h lays out the scales of a
 *                     [p_e, cols] matrix, each rounded up to 16 elements (16-byte aligned
 *                     starts for the GEMMs), one after the other
 * so every expert's slice is the FP8 tensor a Linear would quantize from its zero-padded rows.
 * align: 16 for per-tensor scaling, 32 for MXFP8 (the 1x32 blocks of the columnwise copy run
 * along the rows), 128 for 1x128 / 128x128 blocks (lutra_grouped_align). */
#ifndef LUTRA_BACKEND_GROUPED_LAYOUT_H
#define LUTRA_BACKEND_GROUPED_LAYOUT_H

#include "lutra.h"

#include <stdbool.h>
#include <stdint.h>

/* host and device: the CUDA kernels (kernels/grouped_*.cu) compute the same offsets with these */
#ifdef __CUDACC__
#define LUTRA_GROUPED_HD __host__ __device__
#else
#define LUTRA_GROUPED_HD
#endif

static inline LUTRA_GROUPED_HD int64_t lutra_grouped_roundup(int64_t v, int64_t to) {
  return (v + to - 1) / to * to;
}

/* rows each expert's token rows are padded to for a scaling mode */
static inline LUTRA_GROUPED_HD int32_t lutra_grouped_align(int scaling) {
  switch (scaling) {
  case LUTRA_SCALING_MXFP8:
    return 32;
  case LUTRA_SCALING_BLOCK_1D:
  case LUTRA_SCALING_BLOCK_2D:
    return 128;
  default:
    return 16;
  }
}

/* scale elements of a [rows, cols] matrix (the columnwise copy's when columnwise), as
 * lutra_scale_count in runtime/tensor.c counts them (the layouts of lutra.h) */
static inline LUTRA_GROUPED_HD int64_t lutra_grouped_scale_elems(int scaling, int64_t rows,
                                                                 int64_t cols, bool columnwise) {
  if (columnwise) {
    int64_t t = rows;
    rows = cols;
    cols = t;
  }
  int64_t nb = (cols + 127) / 128;
  switch (scaling) {
  case LUTRA_SCALING_TENSOR:
    return 1;
  case LUTRA_SCALING_MXFP8:
    return rows * ((cols + 31) / 32);
  case LUTRA_SCALING_BLOCK_1D:
    return nb * lutra_grouped_roundup(rows, 4);
  case LUTRA_SCALING_BLOCK_2D:
    return (rows + 127) / 128 * lutra_grouped_roundup(nb, 4);
  default:
    return 0;
  }
}

/* expert scale arrays start 16 elements apart at least */
static inline LUTRA_GROUPED_HD int64_t lutra_grouped_scale_region(int scaling, int64_t padded_rows,
                                                                  int64_t cols, bool columnwise) {
  return lutra_grouped_roundup(lutra_grouped_scale_elems(scaling, padded_rows, cols, columnwise),
                               16);
}

/* bytes of one scale element */
static inline int64_t lutra_grouped_scale_size(int scaling) {
  return scaling == LUTRA_SCALING_MXFP8 ? 1 : 4;
}

/* Capacity of a packed operand whose experts' rows sum to at most total_rows: padded rows and
 * scale elements (rowwise and columnwise). Every expert adds at most align - 1 padding rows and
 * one region's rounding; the block layouts' round-ups add at most one 128-row block's worth. */
static inline int64_t lutra_grouped_rows_cap(int64_t total_rows, int num, int align) {
  return total_rows + (int64_t)num * (align - 1);
}
static inline int64_t lutra_grouped_scale_cap(int scaling, int64_t total_rows, int num, int align,
                                              int64_t cols, bool columnwise) {
  int64_t rows = lutra_grouped_rows_cap(total_rows, num, align);
  return lutra_grouped_scale_elems(scaling, rows, cols, columnwise) +
         (int64_t)num * (lutra_grouped_scale_elems(scaling, 128, cols, columnwise) + 16);
}

/* Device scratch of a grouped call (lutra_grouped_quant_args.scratch), zeroed once by its owner:
 * per expert the row offsets, the GEMM's problem size, operand pointers, strides and alpha
 * (256 bytes each, with room to spare), then lutra_grouped_zero_bytes(in, out) bytes that stay
 * zero (the K = 16 operands a weight gradient of an empty expert reads: the GEMM kernels need
 * at least one K step). */
static inline size_t lutra_grouped_zero_bytes(int64_t in, int64_t out) {
  return (size_t)(32 * (in > out ? in : out) + 255) / 256 * 256;
}
static inline size_t lutra_grouped_scratch_bytes(int num, int64_t in, int64_t out) {
  return 1024 + (size_t)(num + 1) * 256 + lutra_grouped_zero_bytes(in, out);
}

#endif
