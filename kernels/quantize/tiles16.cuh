/* The 128x128 tiles of 16-bit (bf16 / f16) inputs that k_mx16, k_cast16 (cast_transpose_16bit.cu)
 * and k_block16 (quantize_block.cu) share: a block of 256 threads per tile, warp w holding rows
 * 32 (w & 3) .. + 31 and columns 64 (w >> 2) .. + 63, its thread t rows 8 h .. 8 h + 7 of that band
 * and columns 8 k .. 8 k + 7 (k = lane & 7, h = lane >> 3), loaded as one 16-byte load per row and
 * kept in registers as loaded; both code tiles staged in shared memory, 1 byte per element, and
 * stored as whole 128-byte lines. */
#ifndef LUTRA_KERNELS_QUANTIZE_TILES16_CUH
#define LUTRA_KERNELS_QUANTIZE_TILES16_CUH

#include "quantize_tiles.cuh"

namespace {

using namespace lkc;
using namespace lkq;

constexpr int MX_THREADS = 256;
constexpr int MX_T = 128; /* tile rows and columns */
/* magnitude bit patterns of the two 16-bit values of w; SAFE: NaNs as 0, as fmaxf drops them.
 * For non-negative 16-bit floats the integer order is the value order, infinity included. */
template <int XD, bool SAFE> __device__ __forceinline__ uint32_t mag2(uint32_t w) {
  const uint32_t m = w & 0x7FFF7FFFu;
  if (!SAFE) return m;
  constexpr uint32_t INF = XD == LUTRA_BF16 ? 0x7F80u : 0x7C00u;
  const uint32_t lo = m & 0xFFFFu, hi = m >> 16;
  return (lo > INF ? 0u : lo) | (hi > INF ? 0u : hi) << 16;
}

__device__ __forceinline__ uint32_t word_of(const uint4 &u, int j) {
  return j == 0 ? u.x : j == 1 ? u.y : j == 2 ? u.z : u.w;
}

/* value of half s of w, exact (an f16 NaN widens to 0x7FFFFFFF, as f16_value) */
template <int XD> __device__ __forceinline__ float value16(uint32_t w, int s) {
  if (XD == LUTRA_BF16) return bits_f32(s ? w & 0xFFFF0000u : w << 16);
  return __half2float(__ushort_as_half((unsigned short)(w >> (16 * s))));
}

/* Block amaxes as 16-bit magnitudes from the thread's 8x8 values: rm[p] those of rows 2p, 2p + 1
 * over ROW_LANES lanes along the row (8 ROW_LANES columns), cm[j] those of columns 2j, 2j + 1
 * over the warp's 32 rows (lanes h = 0..3); two lines' values share a shuffle. Every lane of the
 * warp takes part. */
template <int XD, bool SAFE, int ROW_LANES>
__device__ __forceinline__ void tile_amax(const uint4 (&x)[8], bool row_out, bool col_out,
                                          uint32_t (&rm)[4], uint32_t (&cm)[4]) {
  if (row_out) {
#pragma unroll
    for (int p = 0; p < 4; p++) {
      uint32_t m[2];
#pragma unroll
      for (int q = 0; q < 2; q++) {
        const uint4 &u = x[2 * p + q];
        m[q] = __vmaxu2(__vmaxu2(mag2<XD, SAFE>(u.x), mag2<XD, SAFE>(u.y)),
                        __vmaxu2(mag2<XD, SAFE>(u.z), mag2<XD, SAFE>(u.w)));
      }
      uint32_t v = __vmaxu2(__byte_perm(m[0], m[1], 0x5410), __byte_perm(m[0], m[1], 0x7632));
#pragma unroll
      for (int o = 1; o < ROW_LANES; o *= 2)
        v = __vmaxu2(v, __shfl_xor_sync(FULL_MASK, v, o));
      rm[p] = v;
    }
  }
  if (col_out) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
      uint32_t v = mag2<XD, SAFE>(word_of(x[0], j));
#pragma unroll
      for (int i = 1; i < 8; i++)
        v = __vmaxu2(v, mag2<XD, SAFE>(word_of(x[i], j)));
      v = __vmaxu2(v, __shfl_xor_sync(FULL_MASK, v, 8));
      cm[j] = __vmaxu2(v, __shfl_xor_sync(FULL_MASK, v, 16));
    }
  }
}

/* codes of v[k] * s as encode16 */
template <int OD> __device__ __forceinline__ uint2 encode8(const float (&v)[8], float s) {
  float p[8];
#pragma unroll
  for (int k = 0; k < 8; k++)
    p[k] = v[k] * s;
  uint32_t w[2];
#pragma unroll
  for (int j = 0; j < 2; j++)
    w[j] = fp8x2<OD>(p[4 * j], p[4 * j + 1]) | (fp8x2<OD>(p[4 * j + 2], p[4 * j + 3]) << 16);
  return make_uint2(w[0], w[1]);
}

/* codes of a thread's 8x8 part of the tile, every value times one scale s: row i of x as w[i] */
template <int XD, int OD>
__device__ __forceinline__ void encode_rows(const uint4 (&x)[8], float s, uint2 (&w)[8]) {
#pragma unroll
  for (int i = 0; i < 8; i++) {
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; j++)
      v[j] = value16<XD>(word_of(x[i], j >> 1), j & 1);
    w[i] = encode8<OD>(v, s);
  }
}

/* The tile's shared memory: rb[128][128] rowwise codes, cb[128][128] the transposed tile's codes
 * (row cc = column cc of the tile), rs[4][128] rowwise scales (block b of row r at rs[128 b + r]),
 * cs[4][128] columnwise scales (block b of column c at cs[128 b + c]). The 16-byte chunks of a
 * code row are XOR-swizzled so that both the 8-byte writes here and the 16-byte reads of the
 * store phase are free of bank conflicts: chunk q of rb's row r sits at q ^ (4 (r >> 3 & 1)) (the
 * two rows of a half-warp's write land in different halves of the banks), chunk g of cb's row cc
 * at g ^ (cc >> 3 & 7). */
struct MxSmem {
  uint8_t *rb, *cb, *rs, *cs;
};

__device__ __forceinline__ int mx_rb_chunk(int row, int q) {
  return q ^ (4 * ((row >> 3) & 1));
}
__device__ __forceinline__ int mx_cb_chunk(int row, int g) {
  return g ^ ((row >> 3) & 7);
}

__device__ __forceinline__ MxSmem mx_smem() {
  uint8_t *p = dyn_smem();
  return {p, p + MX_T * MX_T, p + 2 * MX_T * MX_T, p + 2 * MX_T * MX_T + 4 * MX_T};
}

/* The thread's 8 rows of 8 values from (r, c) on, as loaded; zeros outside the matrix. rows and
 * cols are multiples of 16 (32 for MXFP8), so its 8 rows and 8 columns are all inside or all
 * outside, and so are the lanes of each MXFP8 block: the zeros never meet values of the matrix,
 * and nothing of them is stored. Returns whether they are inside. */
template <int XD>
__device__ __forceinline__ bool mx_load(const TileArgs &a, int64_t r, int64_t c, uint4 (&x)[8]) {
  const bool in = r < a.rows && c < a.cols;
  if (in) {
    const uint4 *p =
        reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(a.x) + r * a.cols + c);
#pragma unroll
    for (int i = 0; i < 8; i++)
      x[i] = __ldg(p + i * (a.cols / 8));
  } else {
#pragma unroll
    for (int i = 0; i < 8; i++)
      x[i] = make_uint4(0u, 0u, 0u, 0u);
  }
  return in;
}

/* NormIn's norm of the thread's 8 rows of 8 values from (r, c) on, in place, each rounded into
 * x's dtype; stored into the norm's y where it is wanted. Called only for values inside. */
template <int XD>
__device__ __forceinline__ void mx_norm(const TileArgs &a, int64_t r, int64_t c, uint4 (&x)[8]) {
  const NormIn &n = a.norm;
  float g[8], b[8];
  norm_params<8>(n, c, g, b);
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const float mean = n.mean ? __ldg(n.mean + r + i) : 0.0f, rstd = __ldg(n.rstd + r + i);
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const uint32_t u = word_of(x[i], j);
      const float lo = norm_value(n, value16<XD>(u, 0), mean, rstd, g[2 * j], b[2 * j]);
      const float hi = norm_value(n, value16<XD>(u, 1), mean, rstd, g[2 * j + 1], b[2 * j + 1]);
      w[j] = half_bits<XD>(lo) | half_bits<XD>(hi) << 16;
    }
    x[i] = make_uint4(w[0], w[1], w[2], w[3]);
    if (n.y) *reinterpret_cast<uint4 *>(static_cast<uint16_t *>(n.y) + (r + i) * a.cols + c) = x[i];
  }
}

/* Both code tiles of sm to memory: 8 lanes per 128-byte line, a warp stores 4 whole lines per
 * instruction */
__device__ __forceinline__ void mx_store_codes(const TileArgs &a, int t, int64_t r0, int64_t c0,
                                               const MxSmem &sm, bool row_out, bool col_out) {
#pragma unroll
  for (int it = 0; it < MX_T * MX_T / 16 / MX_THREADS; it++) {
    const int u = t + MX_THREADS * it, line = u >> 3, g = u & 7;
    if (row_out && r0 + line < a.rows && c0 + 16 * g < a.cols)
      *reinterpret_cast<uint4 *>(a.data + (r0 + line) * a.cols + c0 + 16 * g) =
          *reinterpret_cast<const uint4 *>(sm.rb + MX_T * line + 16 * mx_rb_chunk(line, g));
    if (col_out && c0 + line < a.cols && r0 + 16 * g < a.rows)
      *reinterpret_cast<uint4 *>(a.col_data + (c0 + line) * a.rows + r0 + 16 * g) =
          *reinterpret_cast<const uint4 *>(sm.cb + MX_T * line + 16 * mx_cb_chunk(line, g));
  }
}

/* the tile's origin, tiles in row-major order: the tiles in flight then cover a few whole tile
 * rows */
__device__ __forceinline__ void mx_tile_origin(const TileArgs &a, uint32_t tile, int64_t &r0,
                                               int64_t &c0) {
  const uint32_t ty = tile / (uint32_t)a.tiles_c;
  r0 = (int64_t)ty * MX_T;
  c0 = (int64_t)(tile - ty * (uint32_t)a.tiles_c) * MX_T;
}

/* the largest 16-bit magnitude of x (both halves of each word): a NaN counts above infinity, or
 * with SAFE not at all (as fmaxf leaves NaNs out) */
template <int XD, bool SAFE = false>
__device__ __forceinline__ uint32_t mx_top(const uint4 (&x)[8]) {
  uint32_t top = 0u;
#pragma unroll
  for (int i = 0; i < 8; i++)
    top = __vmaxu2(top, __vmaxu2(__vmaxu2(mag2<XD, SAFE>(x[i].x), mag2<XD, SAFE>(x[i].y)),
                                 __vmaxu2(mag2<XD, SAFE>(x[i].z), mag2<XD, SAFE>(x[i].w))));
  return __vmaxu2(top, top >> 16) & 0xFFFFu;
}

/* bytes (row i, columns 0..7) in w[i] -> bytes (rows 0..7, column j) in out[j] */
__device__ __forceinline__ void transpose8x8(const uint2 (&w)[8], uint2 (&out)[8]) {
  uint32_t q[4], lo[4], hi[4];
#pragma unroll
  for (int half = 0; half < 2; half++) { /* columns 4 half .. + 3 */
#pragma unroll
    for (int i = 0; i < 4; i++)
      q[i] = half ? w[i].y : w[i].x;
    transpose4x4(q, lo);
#pragma unroll
    for (int i = 0; i < 4; i++)
      q[i] = half ? w[4 + i].y : w[4 + i].x;
    transpose4x4(q, hi);
#pragma unroll
    for (int e = 0; e < 4; e++)
      out[4 * half + e] = make_uint2(lo[e], hi[e]);
  }
}

/* One scale's codes of the thread's 8x8 values (w[i]: row tr + i's 8, from column tc) into sm:
 * the rowwise tile as they are, the columnwise tile transposed in registers */
__device__ __forceinline__ void stage_codes(const MxSmem &sm, const uint2 (&w)[8], bool row_out,
                                            bool col_out, int tr, int tc) {
  if (row_out) {
#pragma unroll
    for (int i = 0; i < 8; i++)
      *reinterpret_cast<uint2 *>(sm.rb + MX_T * (tr + i) + 16 * mx_rb_chunk(tr + i, tc >> 4) +
                                 8 * ((tc >> 3) & 1)) = w[i];
  }
  if (col_out) {
    uint2 wt[8];
    transpose8x8(w, wt);
#pragma unroll
    for (int j = 0; j < 8; j++)
      *reinterpret_cast<uint2 *>(sm.cb + MX_T * (tc + j) + 16 * mx_cb_chunk(tc + j, tr >> 4) +
                                 8 * ((tr >> 3) & 1)) = wt[j];
  }
}

} // namespace

#endif
