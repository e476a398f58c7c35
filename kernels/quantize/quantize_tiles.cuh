/* What the tiled quantizers share: their arguments (TileArgs), the 16-value load and store units
 * of a tile's rows and columns, the end of a per-tensor cast and the launchers' argument set-up.
 * The kernels are in cast_transpose.cu (64x64 tiles: per-tensor cast + transpose and MXFP8 of
 * any input; it holds lk_quantize_mxfp8 and lkc::cast_transpose), cast_transpose_16bit.cu (128x128
 * tiles of bf16 / f16 inputs: MXFP8 and the per-tensor cast + transpose) and quantize_block.cu
 * (Float8BlockScaling). Each matches src/backend/cpu/quantize_cpu.c bit for bit (see
 * kernels/common/base.cuh).
 *
 * A block reads a tile of x once, with 16-byte loads (each thread holds 16 consecutive values of
 * a row per unit), and writes the rowwise codes straight from registers with 16-byte stores.
 * The vector path needs cols % 16 == 0, rows % 16 == 0 when a columnwise output is written, and
 * 16-byte aligned x, data and col_data; other shapes take the same kernels with per-element
 * loads and stores.
 *
 * Everything here is in namespace lkq, so that a launcher in one file can hand a TileArgs to a
 * kernel family in another; the kernels themselves stay file-local. */
#ifndef LUTRA_KERNELS_QUANTIZE_TILES_CUH
#define LUTRA_KERNELS_QUANTIZE_TILES_CUH

#include "common/codec.cuh"
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"
#include "common/reduce.cuh"

#include <math.h>

namespace lkq {

using namespace lkc;

/* A norm applied to x as a tile is loaded (lk_norm_quantize, kernels/norm/norm_quantize.cu, with
 * the rows' statistics computed first): y = ((x - mean[r]) * rstd[r]) * g[c] (+ beta[c]),
 * norm_fwd's f32 order of operations with g = gamma (+ 1 for a zero-centered gamma), rounded into
 * x's dtype as the stored y would be. The tile is then quantized as if it had been read from y, so
 * the codes equal the norm's output quantized, bit for bit. Only the kernels instantiated with NORM
 * read it; rstd is never NULL there. */
struct NormIn {
  const float *mean; /* NULL for RMSNorm (mean 0) */
  const float *rstd;
  const void *gamma, *beta; /* [cols], 16-byte aligned; beta NULL for RMSNorm */
  void *y;                  /* the normalized matrix in x's dtype, or NULL */
  int param_f32;            /* gamma and beta are f32 (else bf16) */
  int zero_centered;
};

struct TileArgs {
  const void *x;
  uint8_t *data;     /* rowwise codes, or NULL */
  void *scale_inv;   /* rowwise scales (MXFP8: E8M0 bytes; block: f32) */
  uint8_t *col_data; /* columnwise codes, or NULL */
  void *col_scale_inv;
  int64_t rows, cols;
  int64_t tiles_r, tiles_c, ntiles;
  /* bias gradient of x (tile64 kernels with a columnwise output only): per 64-row tile, f32
   * column sums written to dbias_partial[tile_row][col], reduced into dbias by a second launch
   * (k_dbias_strips) */
  float *dbias_partial;
  void *dbias;
  int dbias_dtype, dbias_accumulate;
  /* per-tensor cast */
  const float *scale;
  float *amax;
  float *cast_scale_inv, *cast_col_scale_inv;
  /* MXFP8 */
  float max_rcp;
  /* block scaling */
  float fp8_max, eps;
  int power_2_scale;
  /* lutra_quant_args.act (MODE_CAST_ACT): the activation's input; act_kind (LUTRA_ACT_*) and
   * act_forward as lutra_quant_args says; act_out receives the matrix in x's dtype */
  const void *act;
  int act_kind, act_forward;
  void *act_out;
  /* lutra_quant_args.skip: when set and nonzero, every block returns at once (the flag is the
   * same for all threads, so no barrier is left waiting) and nothing is written */
  const int32_t *skip;
  NormIn norm;
};

/* gamma (+ 1 when zero-centered) and beta of the N columns from c (c a multiple of 8) */
template <int N>
__device__ __forceinline__ void norm_params(const NormIn &n, int64_t c, float (&g)[N],
                                            float (&b)[N]) {
  static_assert(N % 8 == 0, "whole 16-byte vectors of bf16 parameters");
#pragma unroll
  for (int k = 0; k < N; k++)
    b[k] = 0.0f;
  if (n.param_f32) {
    const float4 *pg = reinterpret_cast<const float4 *>(static_cast<const float *>(n.gamma) + c);
    const float4 *pb = reinterpret_cast<const float4 *>(static_cast<const float *>(n.beta) + c);
#pragma unroll
    for (int k = 0; k < N / 4; k++) {
      const float4 u = __ldg(pg + k);
      g[4 * k] = u.x, g[4 * k + 1] = u.y, g[4 * k + 2] = u.z, g[4 * k + 3] = u.w;
      if (n.beta) {
        const float4 w = __ldg(pb + k);
        b[4 * k] = w.x, b[4 * k + 1] = w.y, b[4 * k + 2] = w.z, b[4 * k + 3] = w.w;
      }
    }
  } else {
    const uint4 *pg = reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(n.gamma) + c);
    const uint4 *pb = reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(n.beta) + c);
#pragma unroll
    for (int k = 0; k < N / 8; k++) {
      const uint4 u = __ldg(pg + k);
      const uint32_t wg[4] = {u.x, u.y, u.z, u.w};
      uint32_t wb[4] = {0u, 0u, 0u, 0u};
      if (n.beta) {
        const uint4 w = __ldg(pb + k);
        wb[0] = w.x, wb[1] = w.y, wb[2] = w.z, wb[3] = w.w;
      }
#pragma unroll
      for (int j = 0; j < 4; j++) {
        g[8 * k + 2 * j] = bf16_value(wg[j] & 0xFFFFu);
        g[8 * k + 2 * j + 1] = bf16_value(wg[j] >> 16);
        if (n.beta) {
          b[8 * k + 2 * j] = bf16_value(wb[j] & 0xFFFFu);
          b[8 * k + 2 * j + 1] = bf16_value(wb[j] >> 16);
        }
      }
    }
  }
  if (n.zero_centered) {
#pragma unroll
    for (int k = 0; k < N; k++)
      g[k] = lkc::fadd(g[k], 1.0f);
  }
}

/* y of one value, unrounded (common/f32.cuh's operations: never contracted into an FMA) */
__device__ __forceinline__ float norm_value(const NormIn &n, float x, float mean, float rstd,
                                            float g, float b) {
  const float y = lkc::fmul(lkc::fmul(lkc::fsub(x, mean), rstd), g);
  return n.beta ? lkc::fadd(y, b) : y;
}

/* the 16 values of row r from column c (zeros outside the matrix) */
template <int XD, bool VEC>
__device__ __forceinline__ void load_unit(const TileArgs &a, int64_t r, int64_t c, float (&v)[16]) {
  if (VEC) {
    if (r < a.rows && c < a.cols) {
      ldv<XD, 16>(a.x, r * a.cols + c, v);
    } else {
#pragma unroll
      for (int k = 0; k < 16; k++)
        v[k] = 0.0f;
    }
  } else {
#pragma unroll
    for (int k = 0; k < 16; k++)
      v[k] = (r < a.rows && c + k < a.cols) ? ld<XD>(a.x, r * a.cols + c + k) : 0.0f;
  }
}

/* The 16 values of a unit as loaded (raw bits), so that the loads of the next tile can be in
 * flight while the current one is encoded: converting them to f32 at once would wait for them. */
template <int XD> struct RawUnit {
  static constexpr int N = XD == LUTRA_F32 ? 4 : 2; /* 16-byte words */
  uint4 w[N];
};

template <int XD, bool VEC>
__device__ __forceinline__ void load_raw(const TileArgs &a, const void *src, int64_t r, int64_t c,
                                         RawUnit<XD> &u) {
  constexpr int N = RawUnit<XD>::N;
  if (VEC) {
    if (r < a.rows && c < a.cols) {
      const uint4 *q = reinterpret_cast<const uint4 *>(static_cast<const unsigned char *>(src) +
                                                       (r * a.cols + c) * lkc::elem_size<XD>());
#pragma unroll
      for (int k = 0; k < N; k++)
        u.w[k] = __ldg(q + k);
    } else {
#pragma unroll
      for (int k = 0; k < N; k++)
        u.w[k] = make_uint4(0u, 0u, 0u, 0u);
    }
  } else {
    uint32_t wd[4 * N];
#pragma unroll
    for (int k = 0; k < 4 * N; k++)
      wd[k] = 0u;
#pragma unroll
    for (int k = 0; k < 16; k++) {
      if (r < a.rows && c + k < a.cols) {
        const int64_t i = r * a.cols + c + k;
        if (XD == LUTRA_F32)
          wd[k] = static_cast<const uint32_t *>(src)[i];
        else
          wd[k >> 1] |= (uint32_t) static_cast<const uint16_t *>(src)[i] << (16 * (k & 1));
      }
    }
#pragma unroll
    for (int k = 0; k < N; k++)
      u.w[k] = make_uint4(wd[4 * k], wd[4 * k + 1], wd[4 * k + 2], wd[4 * k + 3]);
  }
}

template <int XD> __device__ __forceinline__ void unpack(const RawUnit<XD> &u, float (&v)[16]) {
#pragma unroll
  for (int k = 0; k < RawUnit<XD>::N; k++) {
    const uint32_t wd[4] = {u.w[k].x, u.w[k].y, u.w[k].z, u.w[k].w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
      if (XD == LUTRA_F32) {
        v[4 * k + j] = bits_f32(wd[j]);
      } else {
        v[8 * k + 2 * j] = half_value<XD>(wd[j] & 0xFFFFu);
        v[8 * k + 2 * j + 1] = half_value<XD>(wd[j] >> 16);
      }
    }
  }
}

/* 16 codes of row r from column c */
template <bool VEC>
__device__ __forceinline__ void store_row(const TileArgs &a, int64_t r, int64_t c, const uint4 &w) {
  if (r >= a.rows) return;
  if (VEC) {
    if (c < a.cols) *reinterpret_cast<uint4 *>(a.data + r * a.cols + c) = w;
  } else {
#pragma unroll
    for (int k = 0; k < 16; k++)
      if (c + k < a.cols) a.data[r * a.cols + c + k] = (uint8_t)byte_of(w, k);
  }
}

/* 32 codes of column col from row r (row `col` of the transpose) */
template <bool VEC>
__device__ __forceinline__ void store_col(const TileArgs &a, int64_t col, int64_t r,
                                          const uint4 &lo, const uint4 &hi) {
  if (col >= a.cols) return;
  uint8_t *d = a.col_data + col * a.rows + r;
  if (VEC) {
    if (r < a.rows) *reinterpret_cast<uint4 *>(d) = lo;
    if (r + 16 < a.rows) *reinterpret_cast<uint4 *>(d + 16) = hi;
  } else {
#pragma unroll
    for (int k = 0; k < 16; k++)
      if (r + k < a.rows) d[k] = (uint8_t)byte_of(lo, k);
#pragma unroll
    for (int k = 0; k < 16; k++)
      if (r + 16 + k < a.rows) d[16 + k] = (uint8_t)byte_of(hi, k);
  }
}

/* 16 codes of the transpose's row col from its column r (column col of x, rows r .. r + 15) */
template <bool VEC>
__device__ __forceinline__ void store_col16(const TileArgs &a, int64_t col, int64_t r,
                                            const uint4 &w) {
  if (col >= a.cols || r >= a.rows) return;
  uint8_t *d = a.col_data + col * a.rows + r;
  if (VEC) {
    *reinterpret_cast<uint4 *>(d) = w; /* rows % 16 == 0: the 16 rows are all in */
  } else {
#pragma unroll
    for (int k = 0; k < 16; k++)
      if (r + k < a.rows) d[k] = (uint8_t)byte_of(w, k);
  }
}

/* 4x4 byte transpose: w[i] holds bytes (row i, columns 0..3); out[e] gets (rows 0..3, column e) */
__device__ __forceinline__ void transpose4x4(const uint32_t (&w)[4], uint32_t (&out)[4]) {
  const uint32_t t0 = __byte_perm(w[0], w[1], 0x5140), t1 = __byte_perm(w[0], w[1], 0x7362);
  const uint32_t t2 = __byte_perm(w[2], w[3], 0x5140), t3 = __byte_perm(w[2], w[3], 0x7362);
  out[0] = __byte_perm(t0, t2, 0x5410);
  out[1] = __byte_perm(t0, t2, 0x7632);
  out[2] = __byte_perm(t1, t3, 0x5410);
  out[3] = __byte_perm(t1, t3, 0x7632);
}

/* The end of a per-tensor cast kernel, called by every thread of the block: the block's maximum
 * of m_loc (its threads' amaxes, -inf for none) into *a.amax, and 1 / s into the scale_inv
 * outputs (block 0). A block whose atomic_fmax would change nothing (the amax's bits already at
 * least m's as integers, and not a NaN) leaves it out: k_cast16 runs a block per tile, thousands
 * of them, and their atomics queued on one address cost measurable bandwidth (docs/lab/).
 * A template so that it is instantiated after the including file's own functions: ptxas lays out
 * static shared memory in definition order, and k_tile64 keeps the layout (and so the code) it
 * was measured with. */
template <typename Args>
__device__ __forceinline__ void cast_finish(const Args &a, float m_loc, float s) {
  const int t = threadIdx.x;
  if (a.amax) {
    __shared__ float red[32];
    const float m = block_max(m_loc, red);
    if (t == 0 && m >= 0.0f) {
      const int cur = (int)f32_bits(__ldcg(a.amax));
      if (!(cur >= (int)f32_bits(m) && cur <= 0x7F800000)) atomic_fmax(a.amax, m);
    }
  }
  if (blockIdx.x == 0 && t == 0) {
    const float inv = div_x86(1.0f, s);
    if (a.cast_scale_inv) *a.cast_scale_inv = inv;
    if (a.cast_col_scale_inv) *a.cast_col_scale_inv = inv;
  }
}

/* ---- launch helpers -------------------------------------------------------------------------- */

inline bool vec_ok(const TileArgs &a) {
  return a.cols % 16 == 0 && (!a.col_data || a.rows % 16 == 0) && aligned(a.x, 16) &&
         aligned(a.data, 16) && aligned(a.col_data, 16) && aligned(a.act, 16) &&
         aligned(a.act_out, 16);
}

inline TileArgs tile_args(const lutra_quant_args *q, int64_t tile) {
  TileArgs a;
  memset(&a, 0, sizeof a);
  a.x = q->x;
  a.rows = q->rows;
  a.cols = q->cols;
  a.tiles_r = (q->rows + tile - 1) / tile;
  a.tiles_c = (q->cols + tile - 1) / tile;
  a.ntiles = a.tiles_r * a.tiles_c;
  a.skip = q->skip;
  return a;
}

/* the outputs of a block-scaled quantization (MXFP8 or Float8 blocks) that are written */
inline void block_outputs(TileArgs &a, const lutra_quant_args *q, bool row_out, bool col_out) {
  if (row_out) {
    a.data = static_cast<uint8_t *>(q->data);
    a.scale_inv = q->scale_inv;
  }
  if (col_out) {
    a.col_data = static_cast<uint8_t *>(q->col_data);
    a.col_scale_inv = q->col_scale_inv;
  }
}

/* ---- the 128x128 kernels' eligibility and launcher (cast_transpose_16bit.cu)
 * ------------------------ */

/* k_mx16 (MXFP8) and k_cast16 (the per-tensor cast + transpose) take 16-bit inputs whose dims are
 * multiples of `multiple` (32 for MXFP8 blocks; 16 for the cast: a thread's 8x8 values all in or
 * all out, whole 16-byte chunks stored) and 16-byte aligned buffers; the rest go through
 * k_tile64. Neither takes an activation (k_tile64's MODE_CAST_ACT does); k_cast16 takes a bias
 * gradient (its partials in a.dbias_partial, one row of them per 128 rows), k_mx16 none. */
bool t128_ok(const lutra_quant_args *q, const TileArgs &a, int64_t multiple);
/* k_mx16 (mx) or k_cast16 over a bf16 / f16 x, a block per 128x128 tile (a's tile fields set) */
cudaError_t launch_t128(TileArgs &a, int x_dtype, int out_dtype, bool mx, cudaStream_t s);

/* ---- the norm-fused tile kernels (lk_norm_quantize) ------------------------------------------ */

/* 1x128 blocks over a.norm's output of a bf16 / f16 x (quantize_block.cu: k_block16 where its
 * conditions hold, else k_block); the vector path's conditions (vec_ok) and 16-byte aligned
 * gamma and beta, else cudaErrorInvalidValue.
 * launch_t128 takes a.norm the same way (its NORM kernels where a.norm.rstd is set). */
cudaError_t launch_block_norm(TileArgs a, int x_dtype, int out_dtype, cudaStream_t s);

} // namespace lkq

#endif
