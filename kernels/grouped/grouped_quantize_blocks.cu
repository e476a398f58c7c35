/* GroupedLinear's split quantization for the block-scaled recipes on the device (the CPU
 * reference is src/backend/cpu/grouped_cpu.c, which runs the CPU's MXFP8 / block quantizer on
 * each expert's zero-padded rows): every expert's rows in one launch, into the packed layout of
 * src/backend/grouped_layout.h, the row counts read from device memory.
 *
 * A block covers one row group of one expert (32 padded rows for MXFP8, 128 for blocks; the
 * last group of a weight padded to 16 rows may be shorter) by 128 columns, one thread per
 * column, so that every scale block lies inside one block of threads:
 *   MXFP8     thread c holds its column's 32 values: the columnwise 1x32 block is its own, the
 *             rowwise 1x32 blocks are its warp's (a warp maximum per row)
 *   1x128     the columnwise block is the thread's column over the group's rows; the rowwise
 *             block of a row is the block's 128 columns (warp maxima, then the four combined)
 *   128x128   one tile: the block's maximum, one scale for both copies
 * Columnwise codes are stored 16 rows at a time as one 16-byte word (row groups start at
 * multiples of 16 in the expert's transpose). The first thread of each block scans the splits
 * (O(num_gemms)) for its group and checks them: bad splits set *bad_split from block (0, 0) and
 * no block writes. Codes and scales are bit for bit the CPU's (common/codec.cuh's conversions;
 * spec/native/sim_grouped_quantize.cpp checks the kernel on the CPU). */
#include "common/codec.cuh"
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"
#include "common/reduce.cuh"
#include "common/scale.cuh"
#include "grouped_kernels.h"
#include "grouped_rows.cuh"

#include "backend/grouped_layout.h"

namespace {

using namespace lkc;

constexpr int BT = 128; /* threads per block = columns per block */
enum { MODE_MX = 0, MODE_1D = 1, MODE_2D = 2 };

struct BlockQuant : GroupedRows {
  int scaling;
  float max_rcp;
  uint8_t *data, *col_data;
  void *scale_inv, *col_scale_inv;
};

/* the row group gi (counted over all experts) and where its expert's slices start */
struct Group {
  int ok, e;
  int64_t R, P, s, p, r0, n, srow, scol;
};

__device__ void locate_group(const BlockQuant &a, int64_t gi, int G, Group *g) {
  int64_t P = 0, groups = 0, srow = 0, scol = 0;
  g->e = -1;
  g->ok = walk_splits(a.splits, a.rows_each, a.total_rows, a.num, a.align,
                      [&](int e, int64_t r, int64_t s, int64_t p) {
                        const int64_t ng = (p + G - 1) / G;
                        if (g->e < 0 && gi < groups + ng) {
                          g->e = e;
                          g->R = r, g->P = P, g->s = s, g->p = p, g->srow = srow, g->scol = scol;
                          g->r0 = (gi - groups) * G;
                          g->n = p - g->r0 < G ? p - g->r0 : G;
                        }
                        P += p;
                        groups += ng;
                        srow += lutra_grouped_scale_region(a.scaling, p, a.cols, false);
                        scol += lutra_grouped_scale_region(a.scaling, p, a.cols, true);
                      });
}

/* element (r, c) of the group's expert: zero in the padding rows and past the last column */
template <int XD>
__device__ __forceinline__ float value_at(const BlockQuant &a, const Group &g, int64_t r,
                                          int64_t c) {
  if (r >= g.s || c >= a.cols) return 0.0f;
  if (a.xs) return ld<XD>(a.xs[g.e], r * a.cols + c);
  return ld<XD>(a.x, (g.R + r) * a.cols + c);
}

/* columnwise codes: byte k of 16 collected in w, stored as one word when the 16th arrives */
__device__ __forceinline__ void put_col(uint32_t (&w)[4], int k, uint32_t code, uint8_t *dst) {
  if ((k & 3) == 0) w[(k >> 2) & 3] = 0;
  w[(k >> 2) & 3] |= code << (8 * (k & 3));
  if ((k & 15) == 15)
    *reinterpret_cast<uint4 *>(dst + (k - 15)) = make_uint4(w[0], w[1], w[2], w[3]);
}

template <int XD, int OD> __device__ void mx_group(const BlockQuant &a, const Group &g) {
  const int t = threadIdx.x, lane = t & 31;
  const int64_t c0 = (int64_t)blockIdx.y * BT, c = c0 + t, cols = a.cols;
  const bool active = c < cols; /* cols % 32 == 0: whole warps are active or not */
  float v[32];
  LKC_UNROLL
  for (int i = 0; i < 32; i++)
    v[i] = i < g.n ? value_at<XD>(a, g, g.r0 + i, c) : 0.0f;
  if (a.col_data && active) {
    float m = 0.0f;
    LKC_UNROLL
    for (int i = 0; i < 32; i++)
      m = fmaxf(m, fabsf(v[i]));
    const uint32_t e = e8m0_bits(m * a.max_rcp);
    const float rcp = mx_scale_rcp(e);
    uint8_t *dst = a.col_data + g.P * cols + c * g.p + g.r0;
    uint32_t w[4];
    /* unrolled: constant indices keep v and w in registers */
    LKC_UNROLL
    for (int i = 0; i < 32; i++)
      if (i < g.n) put_col(w, i, encode1<OD>(v[i], rcp), dst);
    static_cast<uint8_t *>(a.col_scale_inv)[g.scol + c * (g.p / 32) + g.r0 / 32] = (uint8_t)e;
  }
  if (a.data) {
    LKC_UNROLL
    for (int i = 0; i < 32; i++) {
      if (i >= g.n) break; /* g.n is the block's: the warp stays together */
      const float m = warp_max(fabsf(v[i]));
      const uint32_t e = e8m0_bits(m * a.max_rcp);
      if (!active) continue;
      a.data[(g.P + g.r0 + i) * cols + c] = (uint8_t)encode1<OD>(v[i], mx_scale_rcp(e));
      if (lane == 0)
        static_cast<uint8_t *>(a.scale_inv)[g.srow + (g.r0 + i) * (cols / 32) + c / 32] =
            (uint8_t)e;
    }
  }
}

template <int XD, int OD> __device__ void b1d_group(const BlockQuant &a, const Group &g) {
  __shared__ float rmax[128][BT / 32];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int64_t c0 = (int64_t)blockIdx.y * BT, c = c0 + t, cols = a.cols;
  const bool active = c < cols;
  float cm = 0.0f;
  for (int i = 0; i < g.n; i++) {
    const float v = fabsf(value_at<XD>(a, g, g.r0 + i, c));
    cm = fmaxf(cm, v);
    const float wm = warp_max(v);
    if (lane == 0) rmax[i][warp] = wm;
  }
  __syncthreads();
  const float cs = scale_rule(cm, a.fp8_max, a.power_2_scale, a.eps);
  uint8_t *dst = a.col_data + g.P * cols + c * g.p + g.r0;
  uint32_t w[4];
  for (int i = 0; i < g.n; i++) {
    if (!active) break;
    const float v = value_at<XD>(a, g, g.r0 + i, c);
    if (a.data) {
      float m = rmax[i][0];
      LKC_UNROLL
      for (int k = 1; k < BT / 32; k++)
        m = fmaxf(m, rmax[i][k]);
      const float rs = scale_rule(m, a.fp8_max, a.power_2_scale, a.eps);
      a.data[(g.P + g.r0 + i) * cols + c] = (uint8_t)encode1<OD>(v, rs);
      if (t == 0) /* [cb][roundup(p, 4)] */
        static_cast<float *>(
            a.scale_inv)[g.srow + (c0 / 128) * lutra_grouped_roundup(g.p, 4) + g.r0 + i] =
            div_x86(1.0f, rs);
    }
    if (a.col_data) put_col(w, i, encode1<OD>(v, cs), dst);
  }
  if (a.col_data && active) /* the transpose [cols][p]: [rb][roundup(cols, 4)] */
    static_cast<float *>(
        a.col_scale_inv)[g.scol + (g.r0 / 128) * lutra_grouped_roundup(cols, 4) + c] =
        div_x86(1.0f, cs);
}

template <int XD, int OD> __device__ void b2d_group(const BlockQuant &a, const Group &g) {
  __shared__ float red[32];
  const int t = threadIdx.x;
  const int64_t c0 = (int64_t)blockIdx.y * BT, c = c0 + t, cols = a.cols;
  const bool active = c < cols;
  float m = 0.0f;
  for (int i = 0; i < g.n; i++)
    m = fmaxf(m, fabsf(value_at<XD>(a, g, g.r0 + i, c)));
  m = block_max(m, red);
  const float s = scale_rule(m, a.fp8_max, a.power_2_scale, a.eps);
  uint8_t *dst = a.col_data + g.P * cols + c * g.p + g.r0;
  uint32_t w[4];
  for (int i = 0; i < g.n && active; i++) {
    const uint32_t q = encode1<OD>(value_at<XD>(a, g, g.r0 + i, c), s);
    if (a.data) a.data[(g.P + g.r0 + i) * cols + c] = (uint8_t)q;
    if (a.col_data) put_col(w, i, q, dst);
  }
  if (t != 0) return;
  const float inv = div_x86(1.0f, s);
  const int64_t cb = (cols + 127) / 128, rb = (g.p + 127) / 128;
  if (a.data) /* [rb][roundup(cb, 4)] */
    static_cast<float *>(
        a.scale_inv)[g.srow + (g.r0 / 128) * lutra_grouped_roundup(cb, 4) + c0 / 128] = inv;
  if (a.col_data) /* [cb][roundup(rb, 4)] */
    static_cast<float *>(
        a.col_scale_inv)[g.scol + (c0 / 128) * lutra_grouped_roundup(rb, 4) + g.r0 / 128] = inv;
}

template <int XD, int OD, int MODE> __global__ void __launch_bounds__(BT) k_qblocks(BlockQuant a) {
  if (a.skip && *a.skip) return;
  __shared__ Group g;
  if (threadIdx.x == 0) {
    locate_group(a, blockIdx.x, MODE == MODE_MX ? 32 : 128, &g);
    if (blockIdx.x == 0 && blockIdx.y == 0 && !g.ok && a.bad_split) *a.bad_split = 1;
  }
  __syncthreads();
  if (!g.ok || g.e < 0) return; /* uniform per block */
  if (MODE == MODE_MX)
    mx_group<XD, OD>(a, g);
  else if (MODE == MODE_1D)
    b1d_group<XD, OD>(a, g);
  else
    b2d_group<XD, OD>(a, g);
}

} // namespace

extern "C" cudaError_t lk_grouped_quantize_blocks(const lutra_grouped_quant_args *q,
                                                  int64_t rows_cap, cudaStream_t st) {
  int mode;
  if (q->kind == LUTRA_QUANT_MXFP8)
    mode = MODE_MX;
  else if (q->kind == LUTRA_QUANT_BLOCK_1D)
    mode = MODE_1D;
  else if (q->kind == LUTRA_QUANT_BLOCK_2D)
    mode = MODE_2D;
  else
    return cudaErrorNotSupported;
  /* the CPU quantizers' own conditions: MXFP8 blocks of 32 along both copies */
  if (mode == MODE_MX && (q->cols % 32 || q->out.align % 32)) return cudaErrorInvalidValue;
  if (q->out.align % 16) return cudaErrorInvalidValue;
  BlockQuant a;
  take_rows(a, q);
  a.scaling = q->out.scaling;
  a.max_rcp = 1.0f / q->fp8_max; /* the CPU's 1 / lutra_dtype_max, in f32 */
  a.data = q->out.scale_inv ? static_cast<uint8_t *>(q->out.data) : nullptr;
  a.col_data = q->out.col_scale_inv ? static_cast<uint8_t *>(q->out.col_data) : nullptr;
  a.scale_inv = q->out.scale_inv;
  a.col_scale_inv = q->out.col_scale_inv;
  const int G = mode == MODE_MX ? 32 : 128;
  cudaError_t err = cudaSuccess;
  if (a.data || a.col_data) {
    const dim3 grid(grid_for(rows_cap / G + q->num + 1, 1, 0x7FFFFFFF),
                    grid_for(q->cols, BT, 65535));
    err = with_float_dtype(q->x_dtype, [&](auto xd) {
      constexpr int XD = decltype(xd)::value;
      return with_fp8_dtype(q->out.dtype, [&](auto od) {
        constexpr int OD = decltype(od)::value;
        if (mode == MODE_MX)
          LKC_LAUNCH((k_qblocks<XD, OD, MODE_MX>), grid, BT, 0, st, a);
        else if (mode == MODE_1D)
          LKC_LAUNCH((k_qblocks<XD, OD, MODE_1D>), grid, BT, 0, st, a);
        else
          LKC_LAUNCH((k_qblocks<XD, OD, MODE_2D>), grid, BT, 0, st, a);
        return cudaGetLastError();
      });
    });
  }
  if (err != cudaSuccess || !q->dbias || q->xs) return err;
  return lk_grouped_dbias(q->x, q->x_dtype, q->total_rows, q->cols, q->num, q->splits, q->dbias,
                          q->dbias_dtype, q->dbias_accumulate, st);
}
