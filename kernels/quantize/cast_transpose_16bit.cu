/* 128x128 tiles of bf16 / f16 inputs, a block per tile: MXFP8 (k_mx16) and the per-tensor cast +
 * transpose (k_cast16), which share the tile layout, its shared-memory staging and stores, and one
 * launcher (launch_t128; t128_ok says which quantizations may take it, the entry points in
 * cast_transpose.cu ask it first).
 *
 * k_mx16 holds the tile in registers as loaded: a thread's 8x8 values give both block amaxes
 * through shuffles (1x32 blocks span 4 lanes along a row and 4 lanes down a column), the codes of
 * both outputs are staged in shared memory (1 byte per element) and leave as whole 128-byte lines,
 * and warps whose values hold no NaN or infinity skip the NaN rules. It needs rows and cols that
 * are multiples of 32, 16-byte aligned buffers and no bias gradient; other MXFP8 quantizations
 * (f32 inputs included) take k_tile64. */
#include "tiles16.cuh"

using namespace lkc;
using namespace lkq;

namespace {

/* ---- MXFP8 from bf16 / f16: 128x128 tiles, one per block ------------------------------------ */

/* Warp w holds rows 32 (w & 3) .. + 31 and columns 64 (w >> 2) .. + 63 of the tile; thread t of
 * it rows 8 h .. 8 h + 7 of that band, columns 8 k .. 8 k + 7 (k = lane & 7, h = lane >> 3): one
 * 16-byte load per row, a warp load covers 4 whole 128-byte rows. A rowwise block is lanes
 * k = 4 b .. 4 b + 3 (xor 1, 2); a columnwise block (32 rows of one column) is lanes h = 0..3
 * (xor 8, 16), so both amaxes come from registers and shuffles and the inputs never go through
 * shared memory. Both code tiles do, 1 byte per element, so that they leave as whole 128-byte
 * lines (8 lanes per row of the tile or of its transpose, 16 bytes each), and so do the scales, so
 * that each row (column) gets one 4-byte store per tile. bench/probes/mx_probe.cu chose this layout
 * (docs/lab/ has its figures): 128x64 tiles whose row codes left as 64-byte halves, in a
 * persistent grid, were far slower; storing the row codes as whole lines is what moved it most,
 * and one block per tile in row-major
 * order (the tiles in flight then cover a few whole tile rows) beat persistent blocks, bands, a
 * cp.async pipeline and clusters sharing the scales through distributed shared memory; the scales'
 * stores ask L2 to keep their lines (st_keep_in_l2). */
constexpr int MX_SMEM = 2 * MX_T * MX_T + 2 * 4 * MX_T; /* code tiles, then scales: 33 KiB */
/* k_cast16: the code tiles, then its 4 row bands' column sums (a bias gradient) where the scales
 * sit in k_mx16's */
constexpr int CAST16_SMEM = 2 * MX_T * MX_T + 4 * MX_T * 4;
static_assert(MX_SMEM <= 48 * 1024 && CAST16_SMEM <= 48 * 1024,
              "k_mx16 and k_cast16 launch without raising their shared memory limit");

/* The rowwise (rm) and columnwise (cm) 1x32 block amaxes (tile_amax: rows over 4 lanes) */
template <int XD, bool SAFE>
__device__ __forceinline__ void mx_amax(const uint4 (&x)[8], bool row_out, bool col_out,
                                        uint32_t (&rm)[4], uint32_t (&cm)[4]) {
  tile_amax<XD, SAFE, 4>(x, row_out, col_out, rm, cm);
}

/* E8M0 scale and its reciprocal for a block amax m (16-bit magnitude). Without SAFE every value
 * of the block is finite, so amax * max_rcp < 2^120: then e8m0_bits is the exponent rounded up
 * ((u + 0x7FFFFF) >> 23), except that subnormals up to 2^-127 give 0, and mx_scale_rcp never
 * sees 0xFF. */
template <int XD, bool SAFE>
__device__ __forceinline__ float mx_scale(uint32_t m, float max_rcp, uint32_t &e) {
  const float f = value16<XD>(m, 0) * max_rcp;
  if (SAFE) {
    e = e8m0_bits(f);
    return mx_scale_rcp(e);
  }
  const uint32_t u = f32_bits(f);
  e = u > 0x400000u ? (u + 0x7FFFFFu) >> 23 : 0u;
  return e ? bits_f32((254u - e) << 23) : 1.0f;
}

/* Encodes the thread's 8x8 values (its first row tr, first column tc of the tile) into the
 * tile's shared memory */
template <int XD, int OD, bool SAFE>
__device__ __forceinline__ void
mx_encode(const TileArgs &a, const uint4 (&x)[8], const uint32_t (&rm)[4], const uint32_t (&cm)[4],
          bool row_out, bool col_out, int tr, int tc, const MxSmem &sm) {
  const int k = (tc >> 3) & 7, h = (tr >> 3) & 3;
  if (row_out) {
    uint32_t es[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; i++) {
      uint32_t e;
      const float s = mx_scale<XD, SAFE>((rm[i >> 1] >> (16 * (i & 1))) & 0xFFFFu, a.max_rcp, e);
      float v[8];
#pragma unroll
      for (int j = 0; j < 8; j++)
        v[j] = value16<XD>(word_of(x[i], j >> 1), j & 1);
      *reinterpret_cast<uint2 *>(sm.rb + MX_T * (tr + i) + 16 * mx_rb_chunk(tr + i, tc >> 4) +
                                 8 * (k & 1)) = encode8<OD>(v, s);
      es[i >> 2] |= e << (8 * (i & 3));
    }
    /* lanes k = 0, 4 hold the scales of their 32-column block (tc >> 5) */
    if ((k & 3) == 0)
      *reinterpret_cast<uint2 *>(sm.rs + MX_T * (tc >> 5) + tr) = make_uint2(es[0], es[1]);
  }
  if (col_out) {
    uint32_t es[2] = {0u, 0u};
#pragma unroll
    for (int jj = 0; jj < 8; jj++) {
      uint32_t e;
      const float s = mx_scale<XD, SAFE>((cm[jj >> 1] >> (16 * (jj & 1))) & 0xFFFFu, a.max_rcp, e);
      float v[8];
#pragma unroll
      for (int i = 0; i < 8; i++)
        v[i] = value16<XD>(word_of(x[i], jj >> 1), jj & 1);
      *reinterpret_cast<uint2 *>(sm.cb + MX_T * (tc + jj) + 16 * mx_cb_chunk(tc + jj, tr >> 4) +
                                 8 * (h & 1)) = encode8<OD>(v, s);
      es[jj >> 2] |= e << (8 * (jj & 3));
    }
    /* lanes h = 0 hold the scales of their 32-row block (tr >> 5) */
    if (h == 0)
      *reinterpret_cast<uint2 *>(sm.cs + MX_T * (tr >> 5) + tc) = make_uint2(es[0], es[1]);
  }
}

/* A 4-byte store that asks L2 to keep its line (evict_last). The scales' 4-byte pieces are
 * partial sectors that the neighbouring tiles complete later (8 tiles along a row for a rowwise
 * sector, 8 tile rows for a columnwise one); evicted before then, a partial sector costs HBM a
 * read-modify-write. Kept, they cost a fraction of what they cost evicted (the code stores and
 * input loads keep the default policy; bench/probes/mx_probe.cu, docs/lab/). Later accesses
 * with the default policy (the GEMM's dequantize reading the scales) make the lines ordinary again.
 */
__device__ __forceinline__ void st_keep_in_l2(uint8_t *d, uint32_t v) {
#ifdef __CUDA_ARCH__
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  asm volatile("st.global.L2::cache_hint.b32 [%0], %1, %2;" ::"l"(d), "r"(v), "l"(policy)
               : "memory");
#else
  *reinterpret_cast<uint32_t *>(d) = v;
#endif
}

/* One line's (a row's or a column's) scales of the tile: its 4 bytes at once where they are all
 * inside the matrix and aligned. src: the line's first scale in rs / cs; nb: blocks per line of
 * the output (cols / 32 or rows / 32); b0: the tile's first block along it. */
__device__ __forceinline__ void mx_store_scales(const uint8_t *src, uint8_t *d, int64_t nb,
                                                int64_t b0) {
  if (nb - b0 >= 4 && ((uintptr_t)d & 3u) == 0) {
    st_keep_in_l2(d, (uint32_t)src[0] | (uint32_t)src[MX_T] << 8 | (uint32_t)src[2 * MX_T] << 16 |
                         (uint32_t)src[3 * MX_T] << 24);
  } else {
    for (int b = 0; b < 4 && b0 + b < nb; b++)
      d[b] = src[b * MX_T];
  }
}

/* The bias gradient's partial of the tile (dbias_partial[tile row][column], the f32 column sums
 * of its 128 rows; k_dbias_strips adds them up after the kernel): a thread sums its 8 rows, the
 * 4 lanes of one column band (h) add theirs by shuffles, and lanes h = 0 leave the sums of their
 * 32-row band in band_sums[band][column] for mx_dbias_store. Every lane of the warp takes part. */
template <int XD>
__device__ __forceinline__ void mx_dbias_bands(const uint4 (&x)[8], int tr, int tc,
                                               float *band_sums) {
  float cs[8];
#pragma unroll
  for (int j = 0; j < 8; j++) {
    cs[j] = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++)
      cs[j] += value16<XD>(word_of(x[i], j >> 1), j & 1);
    cs[j] += __shfl_xor_sync(FULL_MASK, cs[j], 8);
    cs[j] += __shfl_xor_sync(FULL_MASK, cs[j], 16);
  }
  if (((tr >> 3) & 3) == 0) {
    float4 *d = reinterpret_cast<float4 *>(band_sums + MX_T * (tr >> 5) + tc);
    d[0] = make_float4(cs[0], cs[1], cs[2], cs[3]);
    d[1] = make_float4(cs[4], cs[5], cs[6], cs[7]);
  }
}

/* after the barrier that follows mx_dbias_bands: threads 0..127 add the 4 bands of their column */
__device__ __forceinline__ void mx_dbias_store(const TileArgs &a, int t, int64_t r0, int64_t c0,
                                               const float *band_sums) {
  if (t >= MX_T || c0 + t >= a.cols) return;
  const float sum =
      (band_sums[t] + band_sums[MX_T + t]) + (band_sums[2 * MX_T + t] + band_sums[3 * MX_T + t]);
  a.dbias_partial[(r0 / MX_T) * a.cols + c0 + t] = sum;
}

template <int XD, int OD, bool NORM>
__global__ void __launch_bounds__(MX_THREADS, 2) k_mx16(TileArgs a) {
  if (a.skip && *a.skip) return;
  const MxSmem sm = mx_smem();
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int tr = 32 * (warp & 3) + 8 * (lane >> 3), tc = 64 * (warp >> 2) + 8 * (lane & 7);
  const bool row_out = a.data != nullptr, col_out = a.col_data != nullptr;

  for (uint32_t tile = blockIdx.x; tile < (uint32_t)a.ntiles; tile += gridDim.x) {
    int64_t r0, c0;
    mx_tile_origin(a, tile, r0, c0);
    uint4 x[8];
    const bool in = mx_load<XD>(a, r0 + tr, c0 + tc, x);
    if (NORM && in) mx_norm<XD>(a, r0 + tr, c0 + tc, x);

    uint32_t rm[4] = {0u, 0u, 0u, 0u}, cm[4] = {0u, 0u, 0u, 0u};
    mx_amax<XD, false>(x, row_out, col_out, rm, cm);
    /* a block with a NaN or an infinity (magnitude >= INF) needs the full rules: the warp
     * recomputes its amaxes without the NaNs and encodes with NaN products patched */
    constexpr uint32_t INF = XD == LUTRA_BF16 ? 0x7F80u : 0x7C00u;
    uint32_t top = 0u;
#pragma unroll
    for (int p = 0; p < 4; p++)
      top = __vmaxu2(top, __vmaxu2(rm[p], cm[p]));
    const bool special = (top & 0xFFFFu) >= INF || (top >> 16) >= INF;
    if (__any_sync(FULL_MASK, special)) {
      mx_amax<XD, true>(x, row_out, col_out, rm, cm);
      mx_encode<XD, OD, true>(a, x, rm, cm, row_out, col_out, tr, tc, sm);
    } else {
      mx_encode<XD, OD, false>(a, x, rm, cm, row_out, col_out, tr, tc, sm);
    }
    __syncthreads();

    mx_store_codes(a, t, r0, c0, sm, row_out, col_out);
    /* scales: threads 0..127 a row's, 128..255 a column's (rowwise [rows][cols / 32],
     * columnwise [cols][rows / 32]) */
    const int line = t & (MX_T - 1);
    if (t < MX_T) {
      if (row_out && r0 + line < a.rows)
        mx_store_scales(sm.rs + line,
                        static_cast<uint8_t *>(a.scale_inv) + (r0 + line) * (a.cols >> 5) +
                            (c0 >> 5),
                        a.cols >> 5, c0 >> 5);
    } else if (col_out && c0 + line < a.cols) {
      mx_store_scales(sm.cs + line,
                      static_cast<uint8_t *>(a.col_scale_inv) + (c0 + line) * (a.rows >> 5) +
                          (r0 >> 5),
                      a.rows >> 5, r0 >> 5);
    }
    __syncthreads(); /* the shared tiles are free for the next tile */
  }
}

/* ---- per-tensor cast + transpose of bf16 / f16: k_mx16's tiles ---------------------------------
 * The same 128x128 tiles and thread layout as k_mx16, one scale for all: a thread encodes its
 * 8x8 values once, and its columnwise codes are its rowwise codes transposed in registers (an 8x8
 * byte transpose), both staged in shared memory and stored as whole 128-byte lines. The 64x64
 * kernel (k_tile64, MODE_CAST_CODES) stores 64-byte half lines, which costs it bandwidth
 * (docs/lab/). The per-tensor amax (delayed scaling) is the maximum magnitude
 * over the matrix's values, NaNs left out as fmaxf leaves them out. Inputs with a bias gradient or
 * a fused GELU gradient stay on k_tile64. */

/* the largest magnitude of the thread's values, NaNs left out, as a float; -inf when all of them
 * are NaN. Magnitudes are shifted up by 1 so that 0 means "none". */
template <int XD> __device__ __forceinline__ float cast_amax(const uint4 (&x)[8], bool special) {
  if (!special) return value16<XD>(mx_top<XD>(x), 0);
  constexpr uint32_t INF = XD == LUTRA_BF16 ? 0x7F80u : 0x7C00u;
  uint32_t top = 0u;
#pragma unroll
  for (int i = 0; i < 8; i++) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const uint32_t m = word_of(x[i], j) & 0x7FFF7FFFu, lo = m & 0xFFFFu, hi = m >> 16;
      const uint32_t l1 = lo > INF ? 0u : lo + 1u, h1 = hi > INF ? 0u : hi + 1u;
      top = l1 > top ? l1 : top;
      top = h1 > top ? h1 : top;
    }
  }
  return top ? value16<XD>(top - 1u, 0) : -INFINITY;
}

template <int XD, int OD, bool NORM>
__global__ void __launch_bounds__(MX_THREADS, 2) k_cast16(TileArgs a) {
  if (a.skip && *a.skip) return;
  const MxSmem sm = mx_smem();
  float *band_sums = reinterpret_cast<float *>(sm.rs); /* [4][128]: bias gradient */
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, k = lane & 7, h = lane >> 3;
  const int tr = 32 * (warp & 3) + 8 * h, tc = 64 * (warp >> 2) + 8 * k;
  const bool row_out = a.data != nullptr, col_out = a.col_data != nullptr;
  const bool dbias = a.dbias_partial != nullptr;
  const float s = *a.scale;
  /* a product is NaN only for a NaN or an infinite factor */
  const bool s_special = !(fabsf(s) <= FLT_MAX_F);
  float m_loc = -INFINITY;

  for (uint32_t tile = blockIdx.x; tile < (uint32_t)a.ntiles; tile += gridDim.x) {
    int64_t r0, c0;
    mx_tile_origin(a, tile, r0, c0);
    uint4 x[8];
    const bool in = mx_load<XD>(a, r0 + tr, c0 + tc, x);
    if (NORM && in) mx_norm<XD>(a, r0 + tr, c0 + tc, x);
    if (dbias) mx_dbias_bands<XD>(x, tr, tc, band_sums);
    constexpr uint32_t INF = XD == LUTRA_BF16 ? 0x7F80u : 0x7C00u;
    const bool special = s_special || mx_top<XD>(x) >= INF;
    if (a.amax && in) m_loc = fmaxf(m_loc, cast_amax<XD>(x, special));
    uint2 w[8];
    encode_rows<XD, OD>(x, s, w);
    stage_codes(sm, w, row_out, col_out, tr, tc);
    __syncthreads();
    mx_store_codes(a, t, r0, c0, sm, row_out, col_out);
    if (dbias) mx_dbias_store(a, t, r0, c0, band_sums);
    __syncthreads(); /* the shared tiles are free for the next tile */
  }

  cast_finish(a, m_loc, s);
}

} // namespace

/* ---- launch helpers -------------------------------------------------------------------------- */

bool lkq::t128_ok(const lutra_quant_args *q, const TileArgs &a, int64_t multiple) {
  const int64_t tiles_r = (q->rows + MX_T - 1) / MX_T, tiles_c = (q->cols + MX_T - 1) / MX_T;
  return (q->x_dtype == LUTRA_BF16 || q->x_dtype == LUTRA_F16) && q->rows % multiple == 0 &&
         q->cols % multiple == 0 && aligned(a.x, 16) && aligned(a.data, 16) &&
         aligned(a.col_data, 16) && tiles_r * tiles_c < UINT32_MAX;
}

/* k_mx16 (mx) or k_cast16 over a bf16 / f16 x, a block per 128x128 tile; the NORM kernels where
 * a.norm.rstd is set */
cudaError_t lkq::launch_t128(TileArgs &a, int x_dtype, int out_dtype, bool mx, cudaStream_t s) {
  a.tiles_r = (a.rows + MX_T - 1) / MX_T;
  a.tiles_c = (a.cols + MX_T - 1) / MX_T;
  a.ntiles = a.tiles_r * a.tiles_c;
  if (a.act || (mx && a.dbias_partial)) return cudaErrorInvalidValue;
  const unsigned grid = grid_for(a.ntiles, 1, INT32_MAX);
  const bool bf16 = x_dtype == LUTRA_BF16;
  return with_fp8_dtype(out_dtype, [&](auto od) {
    return with_bool(a.norm.rstd != nullptr, [&](auto norm) {
      constexpr int OD = decltype(od)::value;
      constexpr bool N = decltype(norm)::value;
      const auto K = mx ? (bf16 ? k_mx16<LUTRA_BF16, OD, N> : k_mx16<LUTRA_F16, OD, N>)
                        : (bf16 ? k_cast16<LUTRA_BF16, OD, N> : k_cast16<LUTRA_F16, OD, N>);
      LKC_LAUNCH(K, grid, MX_THREADS, mx ? MX_SMEM : CAST16_SMEM, s, a);
      return cudaGetLastError();
    });
  });
}
