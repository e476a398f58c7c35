/* Tiled quantizers: MXFP8 (1x32 blocks, E8M0 scales), Float8BlockScaling (1x128 blocks or
 * 128x128 tiles, f32 scales) and the per-tensor cast with a columnwise output. Each matches
 * src/backend/cpu/quantize_cpu.c bit for bit (see common.cuh).
 *
 * A block reads a tile of x once, with 16-byte loads (each thread holds 16 consecutive values of
 * a row per unit), and writes the rowwise codes straight from registers with 16-byte stores.
 * For the columnwise output (the transpose, quantized along its own rows) the tile goes through
 * shared memory as f32; a thread then takes 32 consecutive rows of one column, reduces its
 * block amax where one is needed, and encodes 32 codes of the transposed row. The 128x128 kernel
 * stores them with two 16-byte stores; the 64x64 kernel stages the transposed codes in shared
 * memory (4 KiB, XOR-swizzled) and writes them back as whole 64-byte row segments (4 lanes per
 * row, 8 rows per warp store), so every 32-byte sector is written full. Shared-memory rows are
 * padded to 68 (64-tiles) or 132 (128-tiles) floats: a multiple of 4 keeps the 16-byte stores
 * aligned, and the 4-word skew puts the 8 rows written by each quarter-warp (tile64) or 4 rows x 2
 * units (tile128) in distinct banks; the column reads are 32 consecutive words.
 *
 * The per-tensor cast (without a bias gradient) skips the f32 staging: its columnwise codes are
 * its rowwise codes transposed (same scale), so it transposes the code bytes themselves
 * (MODE_CAST_CODES; for bf16 / f16 inputs k_cast16 below does this on k_mx16's tiles). The 64x64
 * kernels issue the next tile's loads before encoding the current one and visit tiles in bands of
 * LUTRA_TILE_BAND tile rows (tile_coords).
 *
 * MXFP8 of bf16 / f16 inputs takes its own kernel (k_mx16), a block per 128x128 tile held in
 * registers as loaded: a thread's 8x8 values give both block amaxes through shuffles (1x32 blocks
 * span 4 lanes along a row and 4 lanes down a column), the codes of both outputs are staged in
 * shared memory (1 byte per element) and leave as whole 128-byte lines, and warps whose values
 * hold no NaN or infinity skip the NaN rules. It needs rows and cols that are multiples of 32,
 * 16-byte aligned buffers and no bias gradient; other MXFP8 quantizations (f32 inputs included)
 * take k_tile64.
 *
 * The vector path needs cols % 16 == 0, rows % 16 == 0 when a columnwise output is written, and
 * 16-byte aligned x, data and col_data; other shapes take the same kernels with per-element
 * loads and stores. */
#include "common.cuh"
#include "ops_common.cuh"

#include <math.h>

using namespace lkc;

namespace {

struct TileArgs {
  const void *x;
  uint8_t *data;     /* rowwise codes, or NULL */
  void *scale_inv;   /* rowwise scales (MXFP8: E8M0 bytes; block: f32) */
  uint8_t *col_data; /* columnwise codes, or NULL */
  void *col_scale_inv;
  int64_t rows, cols;
  int64_t tiles_r, tiles_c, ntiles;
  /* bias gradient of x (tile64 kernels with a columnwise output only): per 64-row tile, f32
   * column sums written to dbias_partial[tile_row][col]; dbias_count[tile_col] counts the tiles
   * of a tile column done, and the block that completes one reduces its 64 columns into dbias
   * (dbias_reduce_strip) and zeroes the count again for the next launch */
  float *dbias_partial;
  uint32_t *dbias_count;
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
  /* lutra_quant_args.act (MODE_CAST_ACT): the GELU's input; x is then multiplied by gelu'(act) */
  const void *act;
  /* lutra_quant_args.skip: when set and nonzero, every block returns at once (the flag is the
   * same for all threads, so no barrier is left waiting) and nothing is written */
  const int32_t *skip;
};

/* the 16 values of row r from column c (zeros outside the matrix) */
template <int XD, bool VEC>
__device__ __forceinline__ void load_unit(const TileArgs &a, int64_t r, int64_t c, float (&v)[16]) {
  if (VEC) {
    if (r < a.rows && c < a.cols) {
      load16<XD>(a.x, r * a.cols + c, v);
    } else {
#pragma unroll
      for (int k = 0; k < 16; k++)
        v[k] = 0.0f;
    }
  } else {
#pragma unroll
    for (int k = 0; k < 16; k++)
      v[k] = (r < a.rows && c + k < a.cols) ? load1<XD>(a.x, r * a.cols + c + k) : 0.0f;
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
                                                       (r * a.cols + c) * elem_size<XD>::value);
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

/* ---- 64x64 tiles: per-tensor cast with transpose, MXFP8 -------------------------------------- */

/* Tile order: bands of 16 tile rows, column by column inside a band. The tiles in flight at
 * once (a few hundred) then cover whole 32-byte sectors of both scale arrays (16 tiles x 2
 * E8M0 bytes along a row and along a column) and 1 KiB runs of each transposed row, so L2 writes
 * back full sectors instead of partial ones it would have to read from HBM first. */
/* 8 tile rows: 81.3% of copy for the delayed cast + transpose at 16384^2 and 87.2% at 8192^2,
 * against 80.0% / 86.8% with 16 and 76.1% / 83.3% with 32 (tools/tile_band_sweep.sh, H200,
 * 2026-11-29). The macros are for tuning builds only. */
#ifndef LUTRA_TILE_BAND
#define LUTRA_TILE_BAND 8
#endif
constexpr int64_t BAND = LUTRA_TILE_BAND;
__device__ __forceinline__ void tile_coords(const TileArgs &a, int64_t tile, int64_t &tr,
                                            int64_t &tc) {
  const int64_t band = tile / (BAND * a.tiles_c), rem = tile - band * BAND * a.tiles_c;
  const int64_t h = min(BAND, a.tiles_r - band * BAND);
  tc = rem / h;
  tr = band * BAND + (rem - tc * h);
}

constexpr int T64_THREADS = 128;
constexpr int T64_LD = 68;                          /* shared-memory row stride (floats) */
constexpr int T64_SMEM = 64 * T64_LD * 4 + 64 * 64; /* f32 tile + the transposed codes */
/* MODE_CAST_CODES: a per-tensor cast transposes the codes themselves (the columnwise copy has
 * the same scale, so its codes are the rowwise codes transposed): 1 byte per element through
 * shared memory instead of 4, and no second encoding. Used unless a bias gradient is wanted
 * (that needs the f32 column sums of the f32 path). */
/* MODE_CAST_ACT: MODE_CAST of x * gelu'(act) (lutra_quant_args.act), the f32 path. */
enum { MODE_CAST = 0, MODE_MX = 1, MODE_CAST_CODES = 2, MODE_CAST_ACT = 3 };
constexpr int CODE_LDW = 17;                     /* words per row of a code tile */
constexpr int CODE_SMEM = 2 * 64 * CODE_LDW * 4; /* two code tiles (double buffered) */

/* 4x4 byte transpose: w[i] holds bytes (row i, columns 0..3); out[e] gets (rows 0..3, column e) */
__device__ __forceinline__ void transpose4x4(const uint32_t (&w)[4], uint32_t (&out)[4]) {
  const uint32_t t0 = __byte_perm(w[0], w[1], 0x5140), t1 = __byte_perm(w[0], w[1], 0x7362);
  const uint32_t t2 = __byte_perm(w[2], w[3], 0x5140), t3 = __byte_perm(w[2], w[3], 0x7362);
  out[0] = __byte_perm(t0, t2, 0x5410);
  out[1] = __byte_perm(t0, t2, 0x7632);
  out[2] = __byte_perm(t1, t3, 0x5410);
  out[3] = __byte_perm(t1, t3, 0x7632);
}

/* The block that completed tile column tc (its tiles' partials are all written): dbias[c] (+)=
 * the sum over tile rows of dbias_partial[y][c] for its 64 columns, in double, in an order
 * fixed by the shape alone (thread (cc, half) takes rows half, half + 2, ... into 4 running
 * sums, added in order, then the two halves), so results repeat bit for bit whichever block
 * comes last. Called by all T64_THREADS threads of that block. */
__device__ void dbias_reduce_strip(const TileArgs &a, int64_t tc, int t) {
  __shared__ double half_sum[64];
  const int cc = t & 63, half = t >> 6;
  const int64_t col = tc * 64 + cc;
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  if (col < a.cols) {
    /* __ldcg: other blocks' partials, read from L2 */
    for (int64_t y = half; y < a.tiles_r; y += 2)
      acc[(y >> 1) & 3] += static_cast<double>(__ldcg(a.dbias_partial + y * a.cols + col));
  }
  const double part = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  if (half == 1) half_sum[cc] = part;
  __syncthreads();
  if (half == 0 && col < a.cols) {
    double total =
        a.dbias_accumulate ? static_cast<double>(lkops::ld_rt(a.dbias, a.dbias_dtype, col)) : 0.0;
    total += part;
    total += half_sum[cc];
    lkops::st_rt(a.dbias, a.dbias_dtype, col, static_cast<float>(total));
  }
  if (t == 0) a.dbias_count[tc] = 0;
  __syncthreads(); /* half_sum is free again */
}

/* The end of a per-tensor cast kernel, called by every thread of the block: the block's maximum
 * of m_loc (its threads' amaxes, -inf for none) into *a.amax, and 1 / s into the scale_inv
 * outputs (block 0). A block whose atomic_fmax would change nothing (the amax's bits already at
 * least m's as integers, and not a NaN) leaves it out: k_cast16 runs a block per tile, thousands
 * of them, and their atomics queued on one address (measured on the H200, delayed scaling at
 * 8192^2: 81.3% of copy bandwidth with them all, 83.5% without). */
__device__ __forceinline__ void cast_finish(const TileArgs &a, float m_loc, float s) {
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

/* Thread t of the block holds rows lr and lr + 32 of the tile, columns 16 cq .. 16 cq + 15
 * (lr = (lane & 7) + 8 warp, cq = lane >> 3: a warp loads 8 rows x 64 columns, and the two
 * halves of an MXFP8 block sit in lanes l and l ^ 8). In the column phase it takes column
 * t & 63, rows 32 (t >> 6) .. + 31. */
template <int XD, int OD, int MODE, bool VEC>
__global__ void __launch_bounds__(T64_THREADS, XD == LUTRA_F32 ? 4 : 5) k_tile64(TileArgs a) {
  if (a.skip && *a.skip) return;
  float *sm = reinterpret_cast<float *>(dyn_smem());
  uint8_t *tb = dyn_smem() + 64 * T64_LD * 4; /* [64][64] transposed codes, swizzled */
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int lr = (lane & 7) + 8 * warp, cq = lane >> 3;
  const int cc = t & 63, rb = t >> 6;
  const bool row_out = a.data != nullptr, col_out = a.col_data != nullptr;
  constexpr bool ACT = MODE == MODE_CAST_ACT;
  constexpr bool CAST = MODE == MODE_CAST || MODE == MODE_CAST_CODES || ACT;
  constexpr bool CODES = MODE == MODE_CAST_CODES;
  const float s = CAST ? *a.scale : 1.0f;
  uint32_t *codes = reinterpret_cast<uint32_t *>(dyn_smem()); /* CODES: [2][64][CODE_LDW] */
  int parity = 0;
  float m_loc = -INFINITY;   /* per-tensor amax of this thread's elements */
  __shared__ float dsum[64]; /* bias gradient: column sums of the tile's lower 32 rows */

  /* software pipeline: the loads of tile i + gridDim.x are issued before tile i is encoded */
  RawUnit<XD> next[2], next_act[2];
  auto load_tile = [&](int64_t tile) {
    int64_t tr, tc;
    tile_coords(a, tile, tr, tc);
#pragma unroll
    for (int q = 0; q < 2; q++) {
      load_raw<XD, VEC>(a, a.x, tr * 64 + lr + 32 * q, tc * 64 + 16 * cq, next[q]);
      if (ACT) load_raw<XD, VEC>(a, a.act, tr * 64 + lr + 32 * q, tc * 64 + 16 * cq, next_act[q]);
    }
  };
  if (blockIdx.x < a.ntiles) load_tile(blockIdx.x);

  for (int64_t tile = blockIdx.x; tile < a.ntiles; tile += gridDim.x) {
    int64_t tr, tc;
    tile_coords(a, tile, tr, tc);
    const int64_t r0 = tr * 64, c0 = tc * 64, c = c0 + 16 * cq;
    float v[2][16];
#pragma unroll
    for (int q = 0; q < 2; q++)
      unpack<XD>(next[q], v[q]);
    if (ACT) {
      float g[16];
#pragma unroll
      for (int q = 0; q < 2; q++) {
        unpack<XD>(next_act[q], g);
#pragma unroll
        for (int k = 0; k < 16; k++)
          v[q][k] = lkops::gelu_backward(g[k], v[q][k]);
      }
    }
    if (tile + gridDim.x < a.ntiles) load_tile(tile + gridDim.x);

      /* rowwise */
#pragma unroll
    for (int q = 0; q < 2; q++) {
      const int64_t r = r0 + lr + 32 * q;
      if (CAST) {
        if (a.amax) { /* over the elements of x only */
          if (VEC) {
            if (r < a.rows && c < a.cols) {
#pragma unroll
              for (int k = 0; k < 16; k++)
                m_loc = fmaxf(m_loc, fabsf(v[q][k]));
            }
          } else {
#pragma unroll
            for (int k = 0; k < 16; k++)
              if (r < a.rows && c + k < a.cols) m_loc = fmaxf(m_loc, fabsf(v[q][k]));
          }
        }
        const uint4 w = encode16<OD>(v[q], s);
        if (row_out) store_row<VEC>(a, r, c, w);
        if (CODES && col_out) {
          uint32_t *d = codes + (parity * 64 + lr + 32 * q) * CODE_LDW + 4 * cq;
          d[0] = w.x;
          d[1] = w.y;
          d[2] = w.z;
          d[3] = w.w;
        }
      } else if (row_out) {
        float m = 0.0f;
#pragma unroll
        for (int k = 0; k < 16; k++)
          m = fmaxf(m, fabsf(v[q][k]));
        m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, 8));
        const uint32_t e = e8m0_bits(m * a.max_rcp);
        store_row<VEC>(a, r, c, encode16<OD>(v[q], mx_scale_rcp(e)));
        if ((cq & 1) == 0 && r < a.rows && c < a.cols)
          static_cast<uint8_t *>(a.scale_inv)[r * (a.cols / 32) + c / 32] = (uint8_t)e;
      }
    }

    /* columnwise, CODES: thread (quad qq, group g) reads columns 4 qq .. + 3 of rows 8 g .. + 7
     * (8 words, 2-way bank conflicts at most), transposes the bytes in registers and writes 8
     * bytes to each of the 4 transposed rows; the 8 lanes of one qq write 64 contiguous bytes
     * of each. The code tiles alternate, so a tile's writes never meet the previous tile's
     * reads: one barrier per tile. */
    if (CODES && col_out) {
      __syncthreads();
      const int g = lane & 7, qq = (lane >> 3) + 4 * warp;
      const uint32_t *src = codes + (parity * 64 + 8 * g) * CODE_LDW + qq;
      uint32_t lo[4], hi[4], w[4];
#pragma unroll
      for (int i = 0; i < 4; i++)
        w[i] = src[i * CODE_LDW];
      transpose4x4(w, lo);
#pragma unroll
      for (int i = 0; i < 4; i++)
        w[i] = src[(4 + i) * CODE_LDW];
      transpose4x4(w, hi);
      const int64_t rr = r0 + 8 * g;
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int64_t col = c0 + 4 * qq + e;
        if (col >= a.cols || rr >= a.rows) continue;
        uint8_t *d = a.col_data + col * a.rows + rr;
        if (VEC) { /* rows % 16 == 0: all 8 rows are in, and d is 8-byte aligned */
          *reinterpret_cast<uint2 *>(d) = make_uint2(lo[e], hi[e]);
        } else {
#pragma unroll
          for (int k = 0; k < 8; k++)
            if (rr + k < a.rows) d[k] = (uint8_t)((k < 4 ? lo[e] : hi[e]) >> (8 * (k & 3)));
        }
      }
      parity ^= 1;
    }

    /* columnwise */
    if (!CODES && col_out) {
      /* no barrier needed before these stores: the previous tile's reads of sm came before its
       * second barrier, which every thread has passed */
#pragma unroll
      for (int q = 0; q < 2; q++) {
        float4 *d = reinterpret_cast<float4 *>(sm + (lr + 32 * q) * T64_LD + 16 * cq);
#pragma unroll
        for (int k = 0; k < 4; k++)
          d[k] = make_float4(v[q][4 * k], v[q][4 * k + 1], v[q][4 * k + 2], v[q][4 * k + 3]);
      }
      __syncthreads();
      float u[2][16];
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int k = 0; k < 16; k++)
          u[h][k] = sm[(32 * rb + 16 * h + k) * T64_LD + cc];
      const int64_t col = c0 + cc, rbase = r0 + 32 * rb;
      float colsum = 0.0f; /* rows in order; the two halves are added in order below */
      if (a.dbias_partial) {
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
          for (int k = 0; k < 16; k++)
            colsum += u[h][k];
        if (rb == 1) dsum[cc] = colsum;
      }
      float sc = s;
      if (MODE == MODE_MX) {
        float m = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
          for (int k = 0; k < 16; k++)
            m = fmaxf(m, fabsf(u[h][k]));
        const uint32_t e = e8m0_bits(m * a.max_rcp);
        sc = mx_scale_rcp(e);
        if (col < a.cols && rbase < a.rows)
          static_cast<uint8_t *>(a.col_scale_inv)[col * (a.rows / 32) + rbase / 32] = (uint8_t)e;
      }
      /* the transposed codes: 16-byte chunk g of row j (g = 16-row group) sits at
       * tb + 64 j + 16 (g ^ ((j >> 1) & 3)), so that 8 consecutive lanes hit distinct bank
       * quads both here (8 rows j, one g) and in the reads below (2 rows j, 4 g) */
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int g = 2 * rb + h;
        *reinterpret_cast<uint4 *>(tb + 64 * cc + 16 * (g ^ ((cc >> 1) & 3))) =
            encode16<OD>(u[h], sc);
      }
      __syncthreads();
      /* dsum is rewritten only after the next tile's first barrier, which this thread passes
       * after reading it here */
      if (a.dbias_partial) {
        if (rb == 0 && col < a.cols) a.dbias_partial[tr * a.cols + col] = colsum + dsum[cc];
        /* the last tile of a column to finish reduces it (the pattern of CUDA's
         * threadFenceReduction sample): every partial write is made visible before the count */
        __shared__ bool strip_done;
        __threadfence();
        __syncthreads();
        if (t == 0) strip_done = atomicAdd(a.dbias_count + tc, 1u) == a.tiles_r - 1;
        __syncthreads();
        if (strip_done) {
          __threadfence();
          dbias_reduce_strip(a, tc, t);
        }
      }
      /* each thread writes 16 contiguous bytes: 4 lanes cover the 64 bytes of one transposed
       * row of the tile, a warp 8 rows per store */
#pragma unroll
      for (int i = 0; i < 2; i++) {
        const int unit = t + T64_THREADS * i, j = unit >> 2, g = unit & 3;
        const uint4 w = *reinterpret_cast<const uint4 *>(tb + 64 * j + 16 * (g ^ ((j >> 1) & 3)));
        store_col16<VEC>(a, c0 + j, r0 + 16 * g, w);
      }
    }
  }

  if (CAST) cast_finish(a, m_loc, s);
}

/* ---- MXFP8 from bf16 / f16: 128x128 tiles, one per block ------------------------------------ */

/* Warp w holds rows 32 (w & 3) .. + 31 and columns 64 (w >> 2) .. + 63 of the tile; thread t of
 * it rows 8 h .. 8 h + 7 of that band, columns 8 k .. 8 k + 7 (k = lane & 7, h = lane >> 3): one
 * 16-byte load per row, a warp load covers 4 whole 128-byte rows. A rowwise block is lanes
 * k = 4 b .. 4 b + 3 (xor 1, 2); a columnwise block (32 rows of one column) is lanes h = 0..3
 * (xor 8, 16), so both amaxes come from registers and shuffles and the inputs never go through
 * shared memory. Both code tiles do, 1 byte per element, so that they leave as whole 128-byte
 * lines (8 lanes per row of the tile or of its transpose, 16 bytes each), and so do the scales, so
 * that each row (column) gets one 4-byte store per tile. Measured on the H200 (tools/mx_probe.cu,
 * 2026-11-29): 128x64 tiles whose row codes left as 64-byte halves, in a persistent grid, ran at
 * 55-66% of copy; storing the row codes as whole lines is what moved it most, and one block per
 * tile in row-major order (the tiles in flight then cover a few whole tile rows) beat persistent
 * blocks, bands, a cp.async pipeline and clusters sharing the scales through distributed shared
 * memory; the scales' stores ask L2 to keep their lines (st_keep_in_l2). */
constexpr int MX_THREADS = 256;
constexpr int MX_T = 128;                               /* tile rows and columns */
constexpr int MX_SMEM = 2 * MX_T * MX_T + 2 * 4 * MX_T; /* code tiles, then scales: 33 KiB */
static_assert(MX_SMEM <= 48 * 1024, "k_mx16 launches without raising its shared memory limit");

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

/* value of half s of w. Exact either way; the fast form only for finite values (f16 NaN
 * payloads follow src/core/codec.h in the SAFE form) */
template <int XD, bool SAFE> __device__ __forceinline__ float value16(uint32_t w, int s) {
  if (XD == LUTRA_BF16) return bits_f32(s ? w & 0xFFFF0000u : w << 16);
  if (SAFE) return f16_value((w >> (16 * s)) & 0xFFFFu);
  return __half2float(__ushort_as_half((unsigned short)(w >> (16 * s))));
}

/* The rowwise (rm) and columnwise (cm) block amaxes as 16-bit magnitudes: rm[p] those of rows
 * 2p, 2p + 1, cm[j] those of columns 2j, 2j + 1 of the thread's 8 (two rows' values share a
 * shuffle). Every lane of the warp takes part. */
template <int XD, bool SAFE>
__device__ __forceinline__ void mx_amax(const uint4 (&x)[8], bool row_out, bool col_out,
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
      v = __vmaxu2(v, __shfl_xor_sync(FULL_MASK, v, 1));
      rm[p] = __vmaxu2(v, __shfl_xor_sync(FULL_MASK, v, 2));
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

/* E8M0 scale and its reciprocal for a block amax m (16-bit magnitude). Without SAFE every value
 * of the block is finite, so amax * max_rcp < 2^120: then e8m0_bits is the exponent rounded up
 * ((u + 0x7FFFFF) >> 23), except that subnormals up to 2^-127 give 0, and mx_scale_rcp never
 * sees 0xFF. */
template <int XD, bool SAFE>
__device__ __forceinline__ float mx_scale(uint32_t m, float max_rcp, uint32_t &e) {
  const float f = value16<XD, SAFE>(m, 0) * max_rcp;
  if (SAFE) {
    e = e8m0_bits(f);
    return mx_scale_rcp(e);
  }
  const uint32_t u = f32_bits(f);
  e = u > 0x400000u ? (u + 0x7FFFFFu) >> 23 : 0u;
  return e ? bits_f32((254u - e) << 23) : 1.0f;
}

/* codes of v[k] * s as encode16. Without SAFE no product is NaN (finite values, finite
 * non-zero scale), so the NaN patch is left out. */
template <int OD, bool SAFE>
__device__ __forceinline__ uint2 encode8(const float (&v)[8], float s) {
  float p[8];
#pragma unroll
  for (int k = 0; k < 8; k++)
    p[k] = v[k] * s;
  uint32_t w[2];
#pragma unroll
  for (int j = 0; j < 2; j++)
    w[j] = fp8x2<OD>(p[4 * j], p[4 * j + 1]) | (fp8x2<OD>(p[4 * j + 2], p[4 * j + 3]) << 16);
  if (SAFE) {
#pragma unroll
    for (int k = 0; k < 8; k++) {
      if (is_nan(p[k])) {
        const uint32_t sh = 8u * (k & 3);
        w[k >> 2] = (w[k >> 2] & ~(0xFFu << sh)) | (fp8_nan_code<OD>(mul_x86(v[k], s)) << sh);
      }
    }
  }
  return make_uint2(w[0], w[1]);
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
        v[j] = value16<XD, SAFE>(word_of(x[i], j >> 1), j & 1);
      *reinterpret_cast<uint2 *>(sm.rb + MX_T * (tr + i) + 16 * mx_rb_chunk(tr + i, tc >> 4) +
                                 8 * (k & 1)) = encode8<OD, SAFE>(v, s);
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
        v[i] = value16<XD, SAFE>(word_of(x[i], jj >> 1), jj & 1);
      *reinterpret_cast<uint2 *>(sm.cb + MX_T * (tc + jj) + 16 * mx_cb_chunk(tc + jj, tr >> 4) +
                                 8 * (h & 1)) = encode8<OD, SAFE>(v, s);
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
 * read-modify-write. Kept, they cost about 1 point of copy bandwidth instead of 7-12 (the code
 * stores and input loads with the default policy; tools/mx_probe.cu, H200, 2026-11-29: 84-87%
 * of copy against 80-81%). Later accesses with the default policy (the GEMM's dequantize reading
 * the scales) make the lines ordinary again. */
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

/* the largest 16-bit magnitude of x (both halves of each word; a NaN counts above infinity) */
template <int XD> __device__ __forceinline__ uint32_t mx_top(const uint4 (&x)[8]) {
  uint32_t top = 0u;
#pragma unroll
  for (int i = 0; i < 8; i++)
    top = __vmaxu2(top, __vmaxu2(__vmaxu2(mag2<XD, false>(x[i].x), mag2<XD, false>(x[i].y)),
                                 __vmaxu2(mag2<XD, false>(x[i].z), mag2<XD, false>(x[i].w))));
  return __vmaxu2(top, top >> 16) & 0xFFFFu;
}

template <int XD, int OD> __global__ void __launch_bounds__(MX_THREADS, 2) k_mx16(TileArgs a) {
  if (a.skip && *a.skip) return;
  const MxSmem sm = mx_smem();
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int tr = 32 * (warp & 3) + 8 * (lane >> 3), tc = 64 * (warp >> 2) + 8 * (lane & 7);
  const bool row_out = a.data != nullptr, col_out = a.col_data != nullptr;

  for (uint32_t tile = blockIdx.x; tile < (uint32_t)a.ntiles; tile += gridDim.x) {
    int64_t r0, c0;
    mx_tile_origin(a, tile, r0, c0);
    uint4 x[8];
    mx_load<XD>(a, r0 + tr, c0 + tc, x);

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
 * kernel (k_tile64, MODE_CAST_CODES) stores 64-byte half lines and measured 79.8-81.4% of copy at
 * 16384^2 with delayed scaling. The per-tensor amax (delayed scaling) is the maximum magnitude
 * over the matrix's values, NaNs left out as fmaxf leaves them out. Inputs with a bias gradient or
 * a fused GELU gradient stay on k_tile64. */

/* the largest magnitude of the thread's values, NaNs left out, as a float; -inf when all of them
 * are NaN. Magnitudes are shifted up by 1 so that 0 means "none". */
template <int XD> __device__ __forceinline__ float cast_amax(const uint4 (&x)[8], bool special) {
  if (!special) return value16<XD, false>(mx_top<XD>(x), 0);
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
  return top ? value16<XD, false>(top - 1u, 0) : -INFINITY;
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

template <int XD, int OD, bool SAFE>
__device__ __forceinline__ void cast_encode(const uint4 (&x)[8], float s, uint2 (&w)[8]) {
#pragma unroll
  for (int i = 0; i < 8; i++) {
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; j++)
      v[j] = value16<XD, SAFE>(word_of(x[i], j >> 1), j & 1);
    w[i] = encode8<OD, SAFE>(v, s);
  }
}

template <int XD, int OD> __global__ void __launch_bounds__(MX_THREADS, 2) k_cast16(TileArgs a) {
  if (a.skip && *a.skip) return;
  const MxSmem sm = mx_smem();
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, k = lane & 7, h = lane >> 3;
  const int tr = 32 * (warp & 3) + 8 * h, tc = 64 * (warp >> 2) + 8 * k;
  const bool row_out = a.data != nullptr, col_out = a.col_data != nullptr;
  const float s = *a.scale;
  /* a product is NaN only for a NaN or an infinite factor */
  const bool s_special = !(fabsf(s) <= FLT_MAX_F);
  float m_loc = -INFINITY;

  for (uint32_t tile = blockIdx.x; tile < (uint32_t)a.ntiles; tile += gridDim.x) {
    int64_t r0, c0;
    mx_tile_origin(a, tile, r0, c0);
    uint4 x[8];
    const bool in = mx_load<XD>(a, r0 + tr, c0 + tc, x);
    constexpr uint32_t INF = XD == LUTRA_BF16 ? 0x7F80u : 0x7C00u;
    const bool special = s_special || mx_top<XD>(x) >= INF;
    if (a.amax && in) m_loc = fmaxf(m_loc, cast_amax<XD>(x, special));
    uint2 w[8];
    if (__any_sync(FULL_MASK, special))
      cast_encode<XD, OD, true>(x, s, w);
    else
      cast_encode<XD, OD, false>(x, s, w);
    if (row_out) {
#pragma unroll
      for (int i = 0; i < 8; i++)
        *reinterpret_cast<uint2 *>(sm.rb + MX_T * (tr + i) + 16 * mx_rb_chunk(tr + i, tc >> 4) +
                                   8 * (k & 1)) = w[i];
    }
    if (col_out) {
      uint2 wt[8];
      transpose8x8(w, wt);
#pragma unroll
      for (int j = 0; j < 8; j++)
        *reinterpret_cast<uint2 *>(sm.cb + MX_T * (tc + j) + 16 * mx_cb_chunk(tc + j, tr >> 4) +
                                   8 * (h & 1)) = wt[j];
    }
    __syncthreads();
    mx_store_codes(a, t, r0, c0, sm, row_out, col_out);
    __syncthreads(); /* the shared tiles are free for the next tile */
  }

  cast_finish(a, m_loc, s);
}

/* ---- 128x128 tiles: Float8BlockScaling ------------------------------------------------------- */

constexpr int T128_THREADS = 256;
constexpr int T128_LD = 132; /* shared-memory row stride (floats) */
constexpr int T128_SMEM = (128 * T128_LD + 2 * 4 * 128) * 4;

/* Thread t holds rows lr + 32 q (q = 0..3) of the tile, columns 16 cq .. + 15 (lr = (lane & 3)
 * + 4 warp, cq = lane >> 2: the 8 units of a 128-column row are 8 lanes of one warp). In the
 * column phase warp w takes rows 32 (w & 3) .. + 31 of columns 32 (w >> 2) + lane and that + 64;
 * a 1x128 block of the transpose spans 4 warps, which combine their amaxes in shared memory. */
template <int XD, int OD, int DIM, bool VEC>
__global__ void __launch_bounds__(T128_THREADS, 2) k_block(TileArgs a) {
  if (a.skip && *a.skip) return;
  float *sm = reinterpret_cast<float *>(dyn_smem());
  float *col_red = sm + 128 * T128_LD; /* [2][4][128]: partial column amaxes */
  __shared__ float red[32];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int lr = (lane & 3) + 4 * warp, cq = lane >> 2;
  const int quarter = warp & 3;
  const bool row_out = a.data != nullptr, col_out = a.col_data != nullptr;
  float *sc = static_cast<float *>(a.scale_inv), *csc = static_cast<float *>(a.col_scale_inv);
  /* scale row strides (lutra.h's layout). 1D: sc [tiles_c][roundup(rows, 4)], csc
   * [tiles_r][roundup(cols, 4)]; 2D: sc [tiles_r][roundup(tiles_c, 4)], csc
   * [tiles_c][roundup(tiles_r, 4)]. Padding entries stay as allocated (zero). */
  const int64_t sc_ld = DIM == 1 ? (a.rows + 3) / 4 * 4 : (a.tiles_c + 3) / 4 * 4;
  const int64_t csc_ld = DIM == 1 ? (a.cols + 3) / 4 * 4 : (a.tiles_r + 3) / 4 * 4;

  for (int64_t tile = blockIdx.x; tile < a.ntiles; tile += gridDim.x) {
    const int64_t tr = tile / a.tiles_c, tc = tile - tr * a.tiles_c;
    const int64_t r0 = tr * 128, c0 = tc * 128, c = c0 + 16 * cq;
    float v[4][16];
#pragma unroll
    for (int q = 0; q < 4; q++)
      load_unit<XD, VEC>(a, r0 + lr + 32 * q, c, v[q]);

    /* 128x128: one scale for the tile (zeros outside the matrix do not change the amax) */
    float s2 = 1.0f;
    if (DIM == 2) {
      float m = 0.0f;
#pragma unroll
      for (int q = 0; q < 4; q++)
#pragma unroll
        for (int k = 0; k < 16; k++)
          m = fmaxf(m, fabsf(v[q][k]));
      m = block_max(m, red);
      s2 = scale_rule(m, a.fp8_max, a.power_2_scale, a.eps);
      if (t == 0) {
        const float inv = div_x86(1.0f, s2);
        if (row_out) sc[tr * sc_ld + tc] = inv;
        if (col_out) csc[tc * csc_ld + tr] = inv;
      }
    }

    /* rowwise */
    if (row_out) {
#pragma unroll
      for (int q = 0; q < 4; q++) {
        const int64_t r = r0 + lr + 32 * q;
        float sq = s2;
        if (DIM == 1) {
          float m = 0.0f;
#pragma unroll
          for (int k = 0; k < 16; k++)
            m = fmaxf(m, fabsf(v[q][k]));
          m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, 4));
          m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, 8));
          m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, 16));
          sq = scale_rule(m, a.fp8_max, a.power_2_scale, a.eps);
          if (cq == 0 && r < a.rows) sc[tc * sc_ld + r] = div_x86(1.0f, sq);
        }
        store_row<VEC>(a, r, c, encode16<OD>(v[q], sq));
      }
    }

    /* columnwise */
    if (col_out) {
      __syncthreads(); /* the previous tile's column phase is done with sm and col_red */
#pragma unroll
      for (int q = 0; q < 4; q++) {
        float4 *d = reinterpret_cast<float4 *>(sm + (lr + 32 * q) * T128_LD + 16 * cq);
#pragma unroll
        for (int k = 0; k < 4; k++)
          d[k] = make_float4(v[q][4 * k], v[q][4 * k + 1], v[q][4 * k + 2], v[q][4 * k + 3]);
      }
      __syncthreads();
      if (DIM == 1) {
#pragma unroll
        for (int p = 0; p < 2; p++) {
          const int cc = 64 * p + 32 * (warp >> 2) + lane;
          float m = 0.0f;
#pragma unroll
          for (int i = 0; i < 32; i++)
            m = fmaxf(m, fabsf(sm[(32 * quarter + i) * T128_LD + cc]));
          col_red[(4 * p + quarter) * 128 + cc] = m;
        }
        __syncthreads();
      }
#pragma unroll
      for (int p = 0; p < 2; p++) {
        const int cc = 64 * p + 32 * (warp >> 2) + lane;
        const int64_t col = c0 + cc, rbase = r0 + 32 * quarter;
        float sq = s2;
        if (DIM == 1) {
          float m = col_red[(4 * p) * 128 + cc];
#pragma unroll
          for (int k = 1; k < 4; k++)
            m = fmaxf(m, col_red[(4 * p + k) * 128 + cc]);
          sq = scale_rule(m, a.fp8_max, a.power_2_scale, a.eps);
          if (quarter == 0 && col < a.cols) csc[tr * csc_ld + col] = div_x86(1.0f, sq);
        }
        float u[2][16];
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
          for (int k = 0; k < 16; k++)
            u[h][k] = sm[(32 * quarter + 16 * h + k) * T128_LD + cc];
        store_col<VEC>(a, col, rbase, encode16<OD>(u[0], sq), encode16<OD>(u[1], sq));
      }
    }
  }
}

/* ---- launch helpers -------------------------------------------------------------------------- */

bool vec_ok(const TileArgs &a) {
  return a.cols % 16 == 0 && (!a.col_data || a.rows % 16 == 0) && aligned16(a.x) &&
         aligned16(a.data) && aligned16(a.col_data) && aligned16(a.act);
}

TileArgs tile_args(const lutra_quant_args *q, int64_t tile) {
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

cudaError_t launch_tile64(const TileArgs &a, int x_dtype, int out_dtype, int mode, cudaStream_t s) {
  const bool vec = vec_ok(a);
  if (a.act) mode = MODE_CAST_ACT;
  if (mode == MODE_CAST && !a.dbias_partial) mode = MODE_CAST_CODES;
  const int smem = !a.col_data ? 0 : mode == MODE_CAST_CODES ? CODE_SMEM : T64_SMEM;
  return with_float_dtype(x_dtype, [&](auto xd) {
    return with_fp8_dtype(out_dtype, [&](auto od) {
      return with_bool(vec, [&](auto v) {
        constexpr int XD = decltype(xd)::value, OD = decltype(od)::value;
        constexpr bool V = decltype(v)::value;
        constexpr auto KC = k_tile64<XD, OD, MODE_CAST, V>;
        constexpr auto KB = k_tile64<XD, OD, MODE_CAST_CODES, V>;
        constexpr auto KM = k_tile64<XD, OD, MODE_MX, V>;
        constexpr auto KA = k_tile64<XD, OD, MODE_CAST_ACT, V>;
        if (mode == MODE_CAST_ACT)
          LKC_LAUNCH(KA, persistent_grid<KA>(a.ntiles, T64_THREADS, smem), T64_THREADS, smem, s, a);
        else if (mode == MODE_CAST_CODES)
          LKC_LAUNCH(KB, persistent_grid<KB>(a.ntiles, T64_THREADS, smem), T64_THREADS, smem, s, a);
        else if (mode == MODE_CAST)
          LKC_LAUNCH(KC, persistent_grid<KC>(a.ntiles, T64_THREADS, smem), T64_THREADS, smem, s, a);
        else
          LKC_LAUNCH(KM, persistent_grid<KM>(a.ntiles, T64_THREADS, smem), T64_THREADS, smem, s, a);
        return cudaGetLastError();
      });
    });
  });
}

template <int XD, int OD, int DIM, bool V>
cudaError_t launch_block(const TileArgs &a, cudaStream_t s) {
  constexpr auto K = k_block<XD, OD, DIM, V>;
  static std::atomic<uint64_t> smem_set{0};
  int smem = 0;
  if (a.col_data) {
    smem = T128_SMEM;
    const cudaError_t e = allow_smem(K, smem, smem_set);
    if (e != cudaSuccess) return e;
  }
  LKC_LAUNCH(K, persistent_grid<K>(a.ntiles, T128_THREADS, smem), T128_THREADS, smem, s, a);
  return cudaGetLastError();
}

/* k_mx16 (MXFP8) and k_cast16 (the per-tensor cast + transpose) take 16-bit inputs whose dims are
 * multiples of `multiple` (32 for MXFP8 blocks; 16 for the cast: a thread's 8x8 values all in or
 * all out, whole 16-byte chunks stored), 16-byte aligned buffers and no bias gradient; the rest
 * go through k_tile64 */
bool t128_ok(const lutra_quant_args *q, const TileArgs &a, int64_t multiple) {
  const int64_t tiles_r = (q->rows + MX_T - 1) / MX_T, tiles_c = (q->cols + MX_T - 1) / MX_T;
  return (q->x_dtype == LUTRA_BF16 || q->x_dtype == LUTRA_F16) && !q->dbias &&
         q->rows % multiple == 0 && q->cols % multiple == 0 && aligned16(a.x) &&
         aligned16(a.data) && aligned16(a.col_data) && tiles_r * tiles_c < UINT32_MAX;
}

/* k_mx16 (mx) or k_cast16 over a bf16 / f16 x, a block per 128x128 tile */
cudaError_t launch_t128(TileArgs a, int x_dtype, int out_dtype, bool mx, cudaStream_t s) {
  a.tiles_r = (a.rows + MX_T - 1) / MX_T;
  a.tiles_c = (a.cols + MX_T - 1) / MX_T;
  a.ntiles = a.tiles_r * a.tiles_c;
  const unsigned grid = grid_for(a.ntiles, 1, INT32_MAX);
  const bool bf16 = x_dtype == LUTRA_BF16;
  return with_fp8_dtype(out_dtype, [&](auto od) {
    constexpr int OD = decltype(od)::value;
    const auto K = mx ? (bf16 ? k_mx16<LUTRA_BF16, OD> : k_mx16<LUTRA_F16, OD>)
                      : (bf16 ? k_cast16<LUTRA_BF16, OD> : k_cast16<LUTRA_F16, OD>);
    LKC_LAUNCH(K, grid, MX_THREADS, MX_SMEM, s, a);
    return cudaGetLastError();
  });
}

/* a tile64 quantization, with its bias gradient reduced inside the kernel when one is asked */
cudaError_t launch_tile64_dbias(const lutra_quant_args *q, TileArgs &a, int mode, cudaStream_t s) {
  if (q->dbias) {
    if (!a.col_data || !q->dbias_scratch || !q->dbias_count) return cudaErrorInvalidValue;
    a.dbias_partial = q->dbias_scratch;
    a.dbias_count = q->dbias_count;
    a.dbias = q->dbias;
    a.dbias_dtype = q->dbias_dtype;
    a.dbias_accumulate = q->dbias_accumulate;
  }
  return launch_tile64(a, q->x_dtype, q->out_dtype, mode, s);
}

} // namespace

/* ---- launchers ------------------------------------------------------------------------------- */

cudaError_t lkc::cast_transpose(const lutra_quant_args *q, cudaStream_t s) {
  TileArgs a = tile_args(q, 64);
  a.data = static_cast<uint8_t *>(q->data);
  a.col_data = static_cast<uint8_t *>(q->col_data);
  a.scale = q->scale;
  a.amax = q->amax;
  a.cast_scale_inv = static_cast<float *>(q->scale_inv);
  a.cast_col_scale_inv = static_cast<float *>(q->col_scale_inv);
  a.act = q->act;
  if (!q->act && t128_ok(q, a, 16)) return launch_t128(a, q->x_dtype, q->out_dtype, false, s);
  return launch_tile64_dbias(q, a, MODE_CAST, s);
}

/* the outputs of a block-scaled quantization (MXFP8 or Float8 blocks) that are written */
static void block_outputs(TileArgs &a, const lutra_quant_args *q, bool row_out, bool col_out) {
  if (row_out) {
    a.data = static_cast<uint8_t *>(q->data);
    a.scale_inv = q->scale_inv;
  }
  if (col_out) {
    a.col_data = static_cast<uint8_t *>(q->col_data);
    a.col_scale_inv = q->col_scale_inv;
  }
}

extern "C" cudaError_t lk_quantize_mxfp8(const lutra_quant_args *q, cudaStream_t s) {
  if (!q || !is_float_dtype(q->x_dtype) || !is_fp8_dtype(q->out_dtype) || q->rows < 0 ||
      q->cols < 0)
    return cudaErrorInvalidValue;
  if ((q->data && !q->scale_inv) || (q->col_data && !q->col_scale_inv))
    return cudaErrorInvalidValue;
  const bool row_out = q->data && q->scale_inv, col_out = q->col_data && q->col_scale_inv;
  if ((row_out && q->cols % 32 != 0) || (col_out && q->rows % 32 != 0))
    return cudaErrorInvalidValue;
  if ((!row_out && !col_out) || q->rows == 0 || q->cols == 0) return cudaSuccess;
  if (!q->x) return cudaErrorInvalidValue;
  TileArgs a = tile_args(q, 64);
  block_outputs(a, q, row_out, col_out);
  a.max_rcp = 1.0f / (q->out_dtype == LUTRA_E4M3 ? 448.0f : 57344.0f);
  if (t128_ok(q, a, 32)) return launch_t128(a, q->x_dtype, q->out_dtype, true, s);
  return launch_tile64_dbias(q, a, MODE_MX, s);
}

extern "C" cudaError_t lk_quantize_block(const lutra_quant_args *q, cudaStream_t s) {
  if (!q || !is_float_dtype(q->x_dtype) || !is_fp8_dtype(q->out_dtype) || q->rows < 0 ||
      q->cols < 0 || (q->block_dim != 1 && q->block_dim != 2))
    return cudaErrorInvalidValue;
  if ((q->data && !q->scale_inv) || (q->col_data && !q->col_scale_inv))
    return cudaErrorInvalidValue;
  const bool row_out = q->data && q->scale_inv, col_out = q->col_data && q->col_scale_inv;
  if ((!row_out && !col_out) || q->rows == 0 || q->cols == 0) return cudaSuccess;
  if (!q->x) return cudaErrorInvalidValue;
  TileArgs a = tile_args(q, 128);
  block_outputs(a, q, row_out, col_out);
  a.fp8_max = q->out_dtype == LUTRA_E4M3 ? 448.0f : 57344.0f;
  a.eps = q->amax_epsilon;
  a.power_2_scale = q->power_2_scale;
  const bool vec = vec_ok(a);
  const int dim = q->block_dim;
  return with_float_dtype(q->x_dtype, [&](auto xd) {
    return with_fp8_dtype(q->out_dtype, [&](auto od) {
      return with_bool(vec, [&](auto v) {
        constexpr int XD = decltype(xd)::value, OD = decltype(od)::value;
        constexpr bool V = decltype(v)::value;
        return dim == 1 ? launch_block<XD, OD, 1, V>(a, s) : launch_block<XD, OD, 2, V>(a, s);
      });
    });
  });
}
