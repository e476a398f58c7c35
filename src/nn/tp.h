/* Tensor parallelism for linear-like modules (nn/tp.c): the collectives around a module's GEMMs,
 * as TransformerEngine and Megatron place them (src/lutra/dist.h states the shardings). Not tied
 * to Linear: a module that runs the Linear core (LayerNormLinear, LayerNormMLP's FC1 / FC2,
 * GroupedLinear) calls the same four steps around its own GEMMs:
 *   forward_input    the GEMM's input: x, or with column + sequence parallelism x all-gathered
 *   forward_output   the module's output: row-parallel GEMM outputs all-reduced (or, with
 *                    sequence parallelism, reduce-scattered); column outputs as they are
 *   backward_input   the gradient the GEMMs read: dy, or row + sequence parallel dy all-gathered
 *   backward_output  the input gradient returned: column-parallel dgrads all-reduced (or
 *                    reduce-scattered); row dgrads as they are
 * Buffers are kept and reused while the shapes stay; the ranks' shapes (and the recipe key) are
 * compared once per new input shape (lutra_dist_agree), never per call otherwise. */
#ifndef LUTRA_NN_TP_H
#define LUTRA_NN_TP_H

#include "lutra.h"

#include <stdbool.h>

typedef struct lutra_tp {
  lutra_group *group; /* held */
  int32_t mode;
  bool sp;
  int rank, size;
  int32_t dtype, device;
  int64_t checked_rows; /* input rows the ranks agreed on (-1: none yet) */
  uint64_t checked_recipe;
  lutra_tensor *x_full;  /* column + SP: the gathered input */
  lutra_tensor *y;       /* row + SP: this rank's rows of the reduced output */
  lutra_tensor *dy_full; /* row + SP: the gathered output gradient */
  lutra_tensor *dx;      /* column + SP: this rank's rows of the reduced input gradient */
  lutra_tensor *xq_full; /* column + SP in FP8: the gathered codes (and their columnwise copy) */
  lutra_tensor *deq;     /* ... the gathered codes dequantized, to cast the columnwise copy from */
} lutra_tp;

/* Checks desc against the full layer [out, in] and gives the shard's features. */
int lutra_tp_init(lutra_tp *tp, const lutra_tp_desc *d, int64_t in, int64_t out, int dtype,
                  int device, int64_t *local_in, int64_t *local_out, const char *fn);
void lutra_tp_release(lutra_tp *tp);

/* *gather_rows: 1, or the group size when the module's core is to gather the input's FP8 codes
 * itself (lutra_linear_core.gather_fp8 = lutra_tp_gather_fp8; *gemm_x is then x): column + SP
 * under delayed scaling whose amaxes are reduced over this group (every rank then quantizes
 * with the same scale). Other recipes gather in high precision, before their quantization. */
int lutra_tp_forward_input(lutra_tp *tp, const lutra_tensor *x, const lutra_tensor **gemm_x,
                           int32_t *gather_rows, const char *fn);
/* TE's FP8 all-gather: every rank's codes of xq (per-tensor scale) stacked by rank; the
 * columnwise copy the wgrad GEMM needs is cast locally from the gathered codes with the same
 * scale (dequantize + cast reproduce each code exactly), so only one byte per element moves. */
int lutra_tp_gather_fp8(void *tp, const lutra_tensor *xq, const float *scale, lutra_tensor **full,
                        const char *fn);
int lutra_tp_forward_output(lutra_tp *tp, lutra_tensor *y_partial, lutra_tensor **y,
                            const char *fn);
int lutra_tp_backward_input(lutra_tp *tp, const lutra_tensor *dy, const lutra_tensor **gemm_dy,
                            const char *fn);
int lutra_tp_backward_output(lutra_tp *tp, lutra_tensor *dx_partial, lutra_tensor **dx,
                             const char *fn);

#endif
