/* GroupedLinear's FP8 operands dequantized to bf16 for the grouped GEMM that Hopper runs in
 * their place (MXFP8 has no Hopper tensor cores, CUTLASS's Hopper grouped kernels take
 * per-tensor scales only): one launch for all experts of a packed operand
 * (src/backend/grouped_layout.h). Each expert's slice comes out in the high-precision
 * orientation, [p_e, cols] at element P_e * cols, from its rowwise copy or from its columnwise
 * copy transposed back, so the GEMM takes the bf16 path's layouts. A block covers 16 padded rows
 * (expert slices start at multiples of 16) by 64 columns through a shared tile: the columnwise
 * source is read along its rows, the output written along its rows. Values are
 * decode(code) * scale_inv in f32, as the CPU's dequantize, rounded once to bf16 (exact for the
 * power-of-two scales of MXFP8 and of power-of-two block scales). */
#include "common/codec.cuh"
#include "common/elements.cuh"
#include "common/launch.cuh"
#include "grouped_kernels.h"
#include "grouped_rows.cuh"

#include "backend/grouped_layout.h"

namespace {

using namespace lkc;

constexpr int DT_ROWS = 16, DT_COLS = 64, DT_THREADS = 256;

struct Deq {
  const uint8_t *src;
  const void *scales;
  const int32_t *splits;
  int64_t rows_each, total_rows, cols;
  int num, align, scaling, columnwise;
  uint16_t *out;
};

struct Slice {
  int ok, e;
  int64_t P, p, sc; /* padded rows before, padded rows, the scale array's start */
};

__device__ void locate(const Deq &a, int64_t prow, Slice *w) {
  int64_t P = 0, sc = 0;
  w->e = -1;
  w->ok = walk_splits(a.splits, a.rows_each, a.total_rows, a.num, a.align,
                      [&](int e, int64_t, int64_t, int64_t p) {
                        if (w->e < 0 && prow < P + p) w->e = e, w->P = P, w->p = p, w->sc = sc;
                        P += p;
                        sc += lutra_grouped_scale_region(a.scaling, p, a.cols, a.columnwise != 0);
                      });
}

/* scale_inv of element (r, c) of the expert's [p, cols] matrix, read from the copy stored: the
 * rowwise one ([p, cols]) or the transpose ([cols, p]), in lutra.h's layouts */
__device__ __forceinline__ float factor(const Deq &a, const Slice &w, int64_t r, int64_t c) {
  const int64_t rows = a.columnwise ? a.cols : w.p, cols = a.columnwise ? w.p : a.cols;
  const int64_t i = a.columnwise ? c : r, j = a.columnwise ? r : c; /* in the stored copy */
  const uint8_t *s8 = static_cast<const uint8_t *>(a.scales) + w.sc;
  const float *sf = static_cast<const float *>(a.scales) + w.sc;
  switch (a.scaling) {
  case LUTRA_SCALING_MXFP8:
    return e8m0_value(s8[i * (cols / 32) + j / 32]);
  case LUTRA_SCALING_BLOCK_1D:
    return sf[(j / 128) * lutra_grouped_roundup(rows, 4) + i];
  case LUTRA_SCALING_BLOCK_2D:
    return sf[(i / 128) * lutra_grouped_roundup((cols + 127) / 128, 4) + j / 128];
  default:
    return sf[0];
  }
}

template <int DT> __global__ void __launch_bounds__(DT_THREADS) k_dequant(Deq a) {
  __shared__ Slice w;
  __shared__ float tile[DT_ROWS][DT_COLS + 1];
  const int64_t prow0 = (int64_t)blockIdx.x * DT_ROWS, c0 = (int64_t)blockIdx.y * DT_COLS;
  if (threadIdx.x == 0) locate(a, prow0, &w);
  __syncthreads();
  if (!w.ok || w.e < 0) return; /* uniform per block */
  const int64_t r0 = prow0 - w.P, cols = a.cols;
  for (int k = threadIdx.x; k < DT_ROWS * DT_COLS; k += DT_THREADS) {
    /* the columnwise copy is contiguous along the expert's rows: read it that way */
    const int rl = a.columnwise ? k % DT_ROWS : k / DT_COLS;
    const int cl = a.columnwise ? k / DT_ROWS : k % DT_COLS;
    const int64_t r = r0 + rl, c = c0 + cl;
    float v = 0.0f;
    if (c < cols) {
      const uint8_t code =
          a.columnwise ? a.src[w.P * cols + c * w.p + r] : a.src[(w.P + r) * cols + c];
      v = fp8_value<DT>(code) * factor(a, w, r, c);
    }
    tile[rl][cl] = v;
  }
  __syncthreads();
  for (int k = threadIdx.x; k < DT_ROWS * DT_COLS; k += DT_THREADS) {
    const int rl = k / DT_COLS, cl = k % DT_COLS;
    const int64_t c = c0 + cl;
    if (c < cols) a.out[(w.P + r0 + rl) * cols + c] = (uint16_t)bf16_bits(tile[rl][cl]);
  }
}

} // namespace

extern "C" cudaError_t lk_grouped_dequantize(const lutra_grouped_fp8 *q, int columnwise,
                                             const int32_t *splits, int64_t rows_each, int num,
                                             int64_t total_rows, int64_t cols, int64_t rows_cap,
                                             void *out, cudaStream_t st) {
  if (q->align <= 0 || q->align % 16) return cudaErrorInvalidValue;
  Deq a;
  a.src = static_cast<const uint8_t *>(columnwise ? q->col_data : q->data);
  a.scales = columnwise ? q->col_scale_inv : q->scale_inv;
  a.splits = splits;
  a.rows_each = rows_each;
  a.total_rows = total_rows;
  a.cols = cols;
  a.num = num;
  a.align = q->align;
  a.scaling = q->scaling;
  a.columnwise = columnwise;
  a.out = static_cast<uint16_t *>(out);
  if (!a.src || !a.scales) return cudaErrorInvalidValue;
  const dim3 grid(grid_for(rows_cap, DT_ROWS, 0x7FFFFFFF), grid_for(cols, DT_COLS, 65535));
  return with_fp8_dtype(q->dtype, [&](auto dt) {
    constexpr int DT = decltype(dt)::value;
    LKC_LAUNCH(k_dequant<DT>, grid, DT_THREADS, 0, st, a);
    return cudaGetLastError();
  });
}
