/* GroupedLinear's split quantization on the device (the CPU reference is
 * src/backend/cpu/grouped_cpu.c): every expert's rows of one matrix, or every expert's weight,
 * quantized with the expert's own scale in a constant number of launches whatever the number of
 * experts (one; current scaling without ticket words: two), the row counts read from device
 * memory and each expert padded with zero rows to the packed layout of
 * src/backend/grouped_layout.h inside the kernels:
 *   k_amax   current scaling: max|x| of each expert (16-row tiles, one atomic per tile) into the
 *            expert's work words, which are zero between calls
 *   k_amax_cast  current scaling in one launch: k_amax's tiles, then k_cast's, each cast waiting
 *            for its expert's maxima (tile tickets, below)
 *   k_cast   the FP8 codes, rowwise and each expert's transpose, of 16-row tiles (64 for
 *            weights whose padded rows allow it; padding rows encode zero) in chunks of 128
 *            columns: 16-byte loads, 16-byte rowwise stores, and the transpose gathered in
 *            shared memory into 16-byte stores per column (the next chunk's loads issued
 *            before the current chunk is encoded); an
 *            expert's first tile writes its scale_inv (and its scale), its last (current
 *            scaling) publishes the amax and zeroes the work words again
 *   k_dbias  each expert's column sums in double, rows in order (the CPU's bias_grad order)
 * Each block's first thread scans the splits (O(num_gemms)) for its expert's offsets and checks
 * them: bad splits (a split < 0, or a sum other than the rows) set *bad_split from block 0 and
 * every block returns without writing. A 16-row tile never straddles two experts: padded
 * offsets are multiples of 16. Per-tensor scaling only (delayed and current); the block-scaled
 * recipes are kernels/grouped/grouped_quantize_blocks.cu. Codes and scales are bit for bit the
 * CPU's (common/codec.cuh's conversions; spec/native/sim_grouped_quantize.cpp checks the kernels on
 * the CPU). */
#include "activation/act_cast.cuh"
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

constexpr int THREADS = 128;

__device__ __forceinline__ float load1_any(const void *p, int dtype, int64_t i) {
  return dtype == LUTRA_F32    ? ld<LUTRA_F32>(p, i)
         : dtype == LUTRA_BF16 ? ld<LUTRA_BF16>(p, i)
                               : ld<LUTRA_F16>(p, i);
}

__device__ __forceinline__ void store1_any(void *p, int dtype, int64_t i, float v) {
  if (dtype == LUTRA_F32)
    st<LUTRA_F32>(p, i, v);
  else if (dtype == LUTRA_BF16)
    st<LUTRA_BF16>(p, i, v);
  else
    st<LUTRA_F16>(p, i, v);
}
constexpr int TILE_ROWS = 16;

struct GroupedQuant : GroupedRows {
  int current;
  uint8_t *data, *col_data;
  float *scale_inv, *col_scale_inv;
  float *scale, *amax;
  int amax_stride;
  void *const *dbias;
  int dbias_dtype, dbias_accumulate;
  uint32_t *work;    /* current scaling: expert e's accumulator and tile counts at work[4 e] */
  uint32_t *tickets; /* current scaling, one launch (k_amax_cast) */
  /* lutra_grouped_quant_args.act: the values quantized are lkact::act_value's of the rows */
  const void *act;
  int act_kind, act_forward;
  void *act_out;
};

/* Where a block's rows are, from its first thread's scan of the splits. */
struct Where {
  int ok, e;          /* the splits are good; the expert (-1: none) */
  int64_t R, P, s, p; /* its rows before it, padded rows before it, rows, padded rows */
};

/* the expert holding padded row prow (e_fixed < 0), or expert e_fixed. Without splits (the
 * weights: rows_each rows each) that is arithmetic, no walk over the experts. */
__device__ void locate(const GroupedQuant &a, int64_t prow, int e_fixed, Where *w) {
  int64_t P = 0;
  w->e = -1;
  if (!a.splits) {
    const int64_t s = a.rows_each, p = lutra_grouped_roundup(s, a.align);
    w->ok = s >= 0;
    const int64_t e = e_fixed >= 0 ? e_fixed : p > 0 ? prow / p : a.num;
    if (w->ok && e >= 0 && e < a.num) {
      w->e = (int)e;
      w->R = e * s, w->P = e * p, w->s = s, w->p = p;
    }
    return;
  }
  w->ok = walk_splits(a.splits, a.rows_each, a.total_rows, a.num, a.align,
                      [&](int e, int64_t r, int64_t s, int64_t p) {
                        if (w->e < 0 && (e_fixed >= 0 ? e == e_fixed : prow < P + p)) {
                          w->e = e;
                          w->R = r, w->P = P, w->s = s, w->p = p;
                        }
                        P += p;
                      });
}

/* 16 consecutive elements of row r of the block's expert from column c, zero past its s rows
 * and past the last column; VEC: the row starts are 16-byte aligned and cols % 16 == 0. With a
 * fused activation the elements are act(x) (kernels/activation/act_cast.cuh), one by one: a gated
 * kind reads two columns of x per element, which no 16-byte load covers. */
template <int XD, bool VEC>
__device__ __forceinline__ void load_seg(const GroupedQuant &a, const Where &w, int64_t r,
                                         int64_t c, float (&v)[16]) {
  if (r >= w.s || c >= a.cols) {
    LKC_UNROLL
    for (int k = 0; k < 16; k++)
      v[k] = 0.0f;
    return;
  }
  if (a.act) { /* token rows only */
    LKC_UNROLL
    for (int k = 0; k < 16; k++)
      v[k] = c + k < a.cols ? lkact::act_value<XD>(a, w.R + r, c + k) : 0.0f;
    return;
  }
  const void *base = a.xs ? a.xs[w.e] : a.x;
  const int64_t i = (a.xs ? r : w.R + r) * a.cols + c;
  if (VEC) {
    ldv<XD, 16>(base, i, v);
  } else {
    LKC_UNROLL
    for (int k = 0; k < 16; k++)
      v[k] = c + k < a.cols ? ld<XD>(base, i + k) : 0.0f;
  }
}

/* 16 elements as loaded, undecoded: the fast paths (VEC, no activation) issue the next chunk's
 * loads before the current chunk is encoded, so a thread keeps two 16-byte (f32: four) loads in
 * flight instead of waiting on each. */
template <int XD> struct Raw16 {
  static constexpr int N = XD == LUTRA_F32 ? 4 : 2; /* 16-byte words */
  uint4 w[N];
};

/* row r of the block's expert from column c (VEC), or zeros past its s rows and its columns */
template <int XD>
__device__ __forceinline__ void load_raw(const GroupedQuant &a, const Where &w, int64_t r,
                                         int64_t c, Raw16<XD> &q) {
  if (r >= w.s || c >= a.cols) {
    LKC_UNROLL
    for (int k = 0; k < Raw16<XD>::N; k++)
      q.w[k] = make_uint4(0u, 0u, 0u, 0u);
    return;
  }
  const void *base = a.xs ? a.xs[w.e] : a.x;
  const int64_t i = (a.xs ? r : w.R + r) * a.cols + c;
  const uint4 *p =
      reinterpret_cast<const uint4 *>(static_cast<const char *>(base) + i * elem_size<XD>());
  LKC_UNROLL
  for (int k = 0; k < Raw16<XD>::N; k++)
    q.w[k] = p[k];
}

template <int XD> __device__ __forceinline__ void decode_raw(const Raw16<XD> &q, float (&v)[16]) {
  LKC_UNROLL
  for (int k = 0; k < Raw16<XD>::N; k++) {
    const uint32_t u[4] = {q.w[k].x, q.w[k].y, q.w[k].z, q.w[k].w};
    LKC_UNROLL
    for (int j = 0; j < 4; j++) {
      if constexpr (XD == LUTRA_F32)
        v[4 * k + j] = bits_f32(u[j]);
      else
        unpack2<XD>(u[j], v[8 * k + 2 * j], v[8 * k + 2 * j + 1]);
    }
  }
}

/* A block covers one 16-row tile in chunks of 128 columns: thread t loads 16 consecutive
 * elements of row t / 8 (16-byte loads), so no thread divides an index and every warp reads
 * whole rows. */
constexpr int CHUNK = 128;
static_assert(THREADS == TILE_ROWS * CHUNK / 16, "one 16-element segment per thread and chunk");

/* max|x| of the 16-row tile at padded row prow0 of expert w.e, max-accumulated into the
 * expert's work word (a tile of padding rows only adds nothing) */
template <int XD, bool VEC>
__device__ void amax_tile(const GroupedQuant &a, const Where &w, int64_t prow0) {
  const int64_t r0 = prow0 - w.P, r = r0 + threadIdx.x / 8, cs = (threadIdx.x % 8) * 16;
  float m = 0.0f;
  if constexpr (VEC) {
    if (!a.act) { /* four chunks' loads in flight before their maxima */
      constexpr int U = 4;
      for (int64_t c0 = 0; c0 < a.cols; c0 += U * CHUNK) {
        Raw16<XD> q[U];
        LKC_UNROLL
        for (int u = 0; u < U; u++)
          load_raw<XD>(a, w, r, c0 + u * CHUNK + cs, q[u]);
        LKC_UNROLL
        for (int u = 0; u < U; u++) {
          float v[16];
          decode_raw<XD>(q[u], v);
          LKC_UNROLL
          for (int k = 0; k < 16; k++)
            m = fmaxf(m, fabsf(v[k]));
        }
      }
    }
  }
  if (!VEC || a.act) {
    for (int64_t c0 = 0; c0 < a.cols; c0 += CHUNK) {
      float v[16];
      load_seg<XD, VEC>(a, w, r, c0 + cs, v);
      LKC_UNROLL
      for (int k = 0; k < 16; k++)
        m = fmaxf(m, fabsf(v[k]));
    }
  }
  __shared__ float red[32];
  m = block_max(m, red);
  if (threadIdx.x == 0 && r0 < w.s) atomic_fmax(reinterpret_cast<float *>(a.work + 4 * w.e), m);
}

template <int XD, bool VEC> __global__ void __launch_bounds__(THREADS) k_amax(GroupedQuant a) {
  if (a.skip && *a.skip) return;
  __shared__ Where w;
  const int64_t prow0 = (int64_t)blockIdx.x * TILE_ROWS;
  if (threadIdx.x == 0) locate(a, prow0, -1, &w);
  __syncthreads();
  if (w.ok && w.e >= 0) amax_tile<XD, VEC>(a, w, prow0); /* uniform per block */
}

/* an expert without rows has no tile: one block gives it the CPU's zero amax */
__device__ void zero_empty_amaxes(const GroupedQuant &a) {
  if (a.current && a.amax)
    for (int e = 0; e < a.num; e++)
      if ((a.splits ? (int64_t)a.splits[e] : a.rows_each) == 0)
        a.amax[(int64_t)e * a.amax_stride] = 0.0f;
}

/* The transpose of a shared 16-row tile's chunk (16 consecutive rows of the expert's transpose
 * per column): thread j gathers column j's 16 codes into one 16-byte store. One byte per thread
 * strided by the expert's padded rows, as a plain transposed store would write, would cost a
 * memory transaction per byte; a 16-byte store still writes half of a 32-byte sector, whose other
 * half comes from the next tile's block, often too late to merge in L2. */
__device__ __forceinline__ void store_transpose16(const uint8_t (&tile)[TILE_ROWS][CHUNK],
                                                  uint8_t *dst, int64_t col0, int64_t cols,
                                                  int64_t p) {
  const int64_t cc = col0 + threadIdx.x;
  if (cc >= cols) return;
  uint32_t wd[4];
  LKC_UNROLL
  for (int j = 0; j < 4; j++)
    wd[j] = (uint32_t)tile[4 * j][threadIdx.x] | ((uint32_t)tile[4 * j + 1][threadIdx.x] << 8) |
            ((uint32_t)tile[4 * j + 2][threadIdx.x] << 16) |
            ((uint32_t)tile[4 * j + 3][threadIdx.x] << 24);
  *reinterpret_cast<uint4 *>(dst + cc * p) = make_uint4(wd[0], wd[1], wd[2], wd[3]);
}

/* Where 16-byte word s of row r of a 64-row shared tile lies: rows of group g = r / 16 have
 * their words rotated by 2 g (word q of 4 bytes at q ^ 8 g), so that store_transpose64's warp
 * loads, four row groups at once, hit 32 different banks. */
__device__ __forceinline__ int swizzled16(int r, int s) {
  return s ^ (2 * (r / TILE_ROWS));
}

/* The transpose of a shared 64-row tile's chunk: thread (q, g) takes columns 4q..4q+3 of row
 * group g, 16 four-byte loads and four 4x4 byte transposes (byte_perm), and the four threads of
 * a quad write those columns' 64 bytes (two whole sectors each) together. */
__device__ __forceinline__ void store_transpose64(const uint8_t (&tile)[64][CHUNK], uint8_t *dst,
                                                  int64_t col0, int64_t cols, int64_t p) {
  const int q = threadIdx.x / 4, g = threadIdx.x % 4;
  const int64_t cq = col0 + 4 * q;
  if (cq >= cols) return; /* cols % 16 == 0: a quad is whole or past the end */
  const uint32_t *tw = reinterpret_cast<const uint32_t *>(&tile[0][0]);
  const int wi = q ^ (8 * g); /* swizzled16's rotation, in four-byte words */
  uint32_t col[4][4];         /* [column][four rows] */
  LKC_UNROLL
  for (int k = 0; k < 4; k++) {
    const uint32_t *x = tw + (g * TILE_ROWS + 4 * k) * (CHUNK / 4) + wi;
    const uint32_t x0 = x[0], x1 = x[CHUNK / 4], x2 = x[CHUNK / 2], x3 = x[3 * CHUNK / 4];
    const uint32_t t0 = __byte_perm(x0, x1, 0x5140), t1 = __byte_perm(x0, x1, 0x7362);
    const uint32_t t2 = __byte_perm(x2, x3, 0x5140), t3 = __byte_perm(x2, x3, 0x7362);
    col[0][k] = __byte_perm(t0, t2, 0x5410);
    col[1][k] = __byte_perm(t0, t2, 0x7632);
    col[2][k] = __byte_perm(t1, t3, 0x5410);
    col[3][k] = __byte_perm(t1, t3, 0x7632);
  }
  LKC_UNROLL
  for (int j = 0; j < 4; j++)
    *reinterpret_cast<uint4 *>(dst + (cq + j) * p + 16 * g) =
        make_uint4(col[j][0], col[j][1], col[j][2], col[j][3]);
}

/* The codes of a TR-row tile (TR = 16, or 64 where every expert's padded rows are a multiple of
 * 64: the weights, as a rule), chunk by chunk: each thread encodes 16 elements of each of its
 * TR / 16 rows and stores them rowwise as 16-byte words and into a shared tile, from which the
 * transpose is written (store_transpose16 / 64). */
template <int XD, int OD, bool VEC, int TR>
__device__ void cast_tile(const GroupedQuant &a, const Where &w, int64_t prow0) {
  constexpr int G = TR / TILE_ROWS; /* 16-row groups: thread t holds row t / 8 of each */
  /* wide tiles are for 16-byte rows without an activation (the launcher's choice): the other
   * paths are not compiled for them */
  constexpr bool NARROW = TR == TILE_ROWS;
  static_assert(TR == TILE_ROWS || (TR == 64 && VEC), "16-row tiles, or 64 of 16-byte rows");
  /* two tiles, alternating by chunk: a chunk's codes go into one while the previous chunk's
   * are still gathered from the other, so one barrier per chunk orders both */
  __shared__ __align__(16) uint8_t tiles[2][TR][CHUNK];
  int buf = 0;
  const int e = w.e;
  const int64_t P0 = w.P, p = w.p, r0 = prow0 - P0;
  /* volatile: in the one-launch kernel other blocks wrote the word during this launch */
  const float acc =
      a.current ? bits_f32(*static_cast<const volatile uint32_t *>(a.work + 4 * e)) : 0.0f;
  const float sc = a.current ? scale_rule(acc, a.fp8_max, a.power_2_scale, a.eps) : a.scale[4 * e];
  const int64_t cols = a.cols;
  const int tr = threadIdx.x / 8, seg = threadIdx.x % 8;
  float m = 0.0f;
  /* one chunk: 16 elements of each of the thread's rows, loaded into v[g] */
  auto cast_chunk = [&](int64_t c0, const float(&v)[G][16]) {
    const int64_t c = c0 + seg * 16;
    uint8_t(&tile)[TR][CHUNK] = tiles[buf];
    buf ^= 1;
    LKC_UNROLL
    for (int g = 0; g < G; g++) {
      const int64_t r = r0 + g * TILE_ROWS + tr;
      LKC_UNROLL
      for (int k = 0; k < 16; k++)
        m = fmaxf(m, fabsf(v[g][k]));
      if (NARROW && a.act_out && r < w.s) { /* the activation's output, kept for the backward */
        LKC_UNROLL
        for (int k = 0; k < 16; k++)
          if (c + k < cols) st<XD>(a.act_out, (w.R + r) * cols + c + k, v[g][k]);
      }
      const uint4 q = encode16<OD>(v[g], sc);
      if (c < cols) {
        uint8_t *row = a.data ? a.data + (P0 + r) * cols + c : nullptr;
        if (row && VEC) {
          *reinterpret_cast<uint4 *>(row) = q;
        } else if (row) {
          for (int k = 0; k < 16 && c + k < cols; k++)
            row[k] = (uint8_t)byte_of(q, k);
        }
        const int tr_g = g * TILE_ROWS + tr;
        reinterpret_cast<uint4 *>(&tile[tr_g][0])[NARROW ? seg : swizzled16(tr_g, seg)] = q;
      }
    }
    __syncthreads();
    if (a.col_data) { /* 16-byte aligned: P0, p and r0 are multiples of 16 */
      uint8_t *dst = a.col_data + P0 * cols + r0;
      if constexpr (NARROW)
        store_transpose16(tile, dst, c0, cols, p);
      else
        store_transpose64(tile, dst, c0, cols, p);
    }
  };
  bool fast = false; /* the next chunk's loads issued before this one's codes (Raw16) */
  if constexpr (VEC) {
    fast = !NARROW || !a.act;
    if (fast) {
      Raw16<XD> next[G];
      LKC_UNROLL
      for (int g = 0; g < G; g++)
        load_raw<XD>(a, w, r0 + g * TILE_ROWS + tr, seg * 16, next[g]);
      for (int64_t c0 = 0; c0 < cols; c0 += CHUNK) {
        float v[G][16];
        LKC_UNROLL
        for (int g = 0; g < G; g++) {
          const Raw16<XD> cur = next[g];
          load_raw<XD>(a, w, r0 + g * TILE_ROWS + tr, c0 + CHUNK + seg * 16, next[g]);
          decode_raw<XD>(cur, v[g]);
        }
        cast_chunk(c0, v);
      }
    }
  }
  if constexpr (NARROW)
    if (!fast)
      for (int64_t c0 = 0; c0 < cols; c0 += CHUNK) {
        float v[G][16];
        load_seg<XD, VEC>(a, w, r0 + tr, c0 + seg * 16, v[0]);
        cast_chunk(c0, v);
      }
  if (!a.current && a.amax) { /* delayed scaling: this step's amax slot, max-accumulated */
    __shared__ float red[32];
    m = block_max(m, red);
    if (threadIdx.x == 0) atomic_fmax(a.amax + (int64_t)e * a.amax_stride, m);
  }
  __syncthreads(); /* every thread has read the work words before they are cleared below */
  if (threadIdx.x != 0) return;
  if (r0 == 0) {
    const float inv = div_x86(1.0f, sc);
    if (a.scale_inv) a.scale_inv[16 * e] = inv;
    if (a.col_scale_inv) a.col_scale_inv[16 * e] = inv;
    if (a.current) a.scale[4 * e] = sc;
  }
  if (a.current) { /* the expert's last tile to finish publishes the amax, clears the words */
    __threadfence();
    if (atomicAdd(a.work + 4 * e + 1, 1u) == (unsigned)(p / TR) - 1) {
      if (a.amax) a.amax[(int64_t)e * a.amax_stride] = acc;
      a.work[4 * e] = 0u;
      a.work[4 * e + 1] = 0u;
      a.work[4 * e + 2] = 0u;
    }
  }
}

template <int XD, int OD, bool VEC, int TR>
__global__ void __launch_bounds__(THREADS) k_cast(GroupedQuant a) {
  if (a.skip && *a.skip) return;
  __shared__ Where w;
  const int64_t prow0 = (int64_t)blockIdx.x * TR;
  if (threadIdx.x == 0) {
    locate(a, prow0, -1, &w);
    if (blockIdx.x == 0 && !w.ok && a.bad_split) *a.bad_split = 1;
    if (blockIdx.x == 0 && w.ok) zero_empty_amaxes(a);
  }
  __syncthreads();
  if (w.ok && w.e >= 0) cast_tile<XD, OD, VEC, TR>(a, w, prow0);
}

/* Current scaling in one launch: tickets, taken in the order blocks start, 0..n-1 are the amax
 * tiles of the n padded 16-row tiles and n..n+n*16/TR-1 the casts of TR-row tiles; a cast waits
 * until every amax tile of its expert has counted itself in work[4 e + 2]. Those tiles hold smaller
 * tickets, so they have started, and none of them waits: the kernel cannot deadlock however few
 * blocks are resident. Casts start while the last experts' maxima are still read. The last block to
 * finish sets the tickets back to zero. */
template <int XD, int OD, bool VEC, int TR>
__global__ void __launch_bounds__(THREADS) k_amax_cast(GroupedQuant a) {
  if (a.skip && *a.skip) return;
  __shared__ Where w;
  __shared__ int64_t prow0;
  __shared__ int role; /* 0 amax, 1 cast, -1 none */
  if (threadIdx.x == 0) {
    const int64_t t = atomicAdd(a.tickets, 1u);
    int64_t n = 0; /* the padded tiles */
    if (!a.splits)
      n = a.rows_each >= 0 ? a.num * lutra_grouped_roundup(a.rows_each, a.align) / TILE_ROWS : 0;
    else
      walk_splits(a.splits, a.rows_each, a.total_rows, a.num, a.align,
                  [&](int, int64_t, int64_t, int64_t p) { n += p / TILE_ROWS; });
    const int64_t casts = n * TILE_ROWS / TR; /* TR > 16: every expert's p is a multiple */
    role = t < n ? 0 : t < n + casts ? 1 : -1;
    prow0 = role == 1 ? (t - n) * TR : t * TILE_ROWS;
    locate(a, role < 0 ? 0 : prow0, -1, &w);
    if (blockIdx.x == 0 && !w.ok && a.bad_split) *a.bad_split = 1;
    if (blockIdx.x == 0 && w.ok) zero_empty_amaxes(a);
    if (role == 1 && w.ok && w.e >= 0) {
      const volatile uint32_t *done = a.work + 4 * w.e + 2;
      while (*done < (uint32_t)(w.p / TILE_ROWS))
        __nanosleep(256);
      __threadfence();
    }
  }
  __syncthreads();
  if (role >= 0 && w.ok && w.e >= 0) {
    if (role == 0) {
      amax_tile<XD, VEC>(a, w, prow0);
      if (threadIdx.x == 0) {
        __threadfence(); /* the maximum lands before the count */
        atomicAdd(a.work + 4 * w.e + 2, 1u);
      }
    } else {
      cast_tile<XD, OD, VEC, TR>(a, w, prow0);
    }
  }
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(a.tickets + 1, 1u) == gridDim.x - 1) a.tickets[0] = a.tickets[1] = 0u;
  }
}

template <int XD> __global__ void __launch_bounds__(128) k_dbias(GroupedQuant a) {
  if (a.skip && *a.skip) return;
  __shared__ Where w;
  if (threadIdx.x == 0) locate(a, 0, (int)blockIdx.y, &w);
  __syncthreads();
  const int64_t c = (int64_t)blockIdx.x * 128 + threadIdx.x;
  if (c >= a.cols || !w.ok) return;
  void *db = a.dbias[w.e];
  double acc = a.dbias_accumulate ? (double)load1_any(db, a.dbias_dtype, c) : 0.0;
#pragma unroll 8 /* the loads run ahead; the sums stay in row order */
  for (int64_t r = w.R; r < w.R + w.s; r++)
    acc += (double)(a.act ? lkact::act_value<XD>(a, r, c) : ld<XD>(a.x, r * a.cols + c));
  store1_any(db, a.dbias_dtype, c, (float)acc);
}

} // namespace

extern "C" cudaError_t lk_grouped_quantize(const lutra_grouped_quant_args *q, int64_t rows_cap,
                                           cudaStream_t st) {
  if (q->kind != LUTRA_QUANT_DELAYED && q->kind != LUTRA_QUANT_CURRENT)
    return cudaErrorNotSupported;
  if (q->act && (q->xs || q->act_kind <= LUTRA_ACT_NONE || q->act_kind >= LUTRA_ACT_COUNT ||
                 (!q->act_forward && !q->x)))
    return cudaErrorInvalidValue;
  GroupedQuant a;
  take_rows(a, q);
  a.current = q->kind == LUTRA_QUANT_CURRENT;
  a.data = static_cast<uint8_t *>(q->out.data);
  a.col_data = static_cast<uint8_t *>(q->out.col_data);
  a.scale_inv = static_cast<float *>(q->out.scale_inv);
  a.col_scale_inv = static_cast<float *>(q->out.col_scale_inv);
  a.scale = q->scale;
  a.amax = q->amax;
  a.amax_stride = q->amax_stride;
  a.dbias = q->dbias;
  a.dbias_dtype = q->dbias_dtype;
  a.dbias_accumulate = q->dbias_accumulate;
  a.work = q->work;
  a.tickets = q->tickets;
  a.act = q->act;
  a.act_kind = q->act_kind;
  a.act_forward = q->act_forward;
  a.act_out = q->act_out;
  const unsigned tiles = grid_for(rows_cap, TILE_ROWS, 0x7FFFFFFF);
  /* 64-row cast tiles where no tile can straddle two experts: the weights (no splits) whose
   * padded rows are a multiple of 64, read with 16-byte loads */
  const bool wide = !a.splits && a.rows_each > 0 &&
                    lutra_grouped_roundup(a.rows_each, a.align) % 64 == 0 && !a.act;
  return with_float_dtype(q->x_dtype, [&](auto xd) {
    constexpr int XD = decltype(xd)::value;
    /* the weights (xs) are the module's own allocations; a token matrix may be a view */
    const bool vec = a.cols % 16 == 0 && (a.xs || aligned(a.x, 16)) && aligned(a.data, 16);
    const bool one = a.current && a.tickets && (a.data || a.col_data || a.amax);
    const bool cast = a.data || a.col_data || a.amax;
    cudaError_t e = with_bool(vec, [&](auto v) {
      constexpr bool VEC = decltype(v)::value;
      if (a.current && !one) LKC_LAUNCH((k_amax<XD, VEC>), tiles, THREADS, 0, st, a);
      return with_fp8_dtype(q->out.dtype, [&](auto od) {
        constexpr int OD = decltype(od)::value;
        if constexpr (VEC) {
          if (wide) {
            const unsigned casts = grid_for(rows_cap, 64, 0x7FFFFFFF);
            if (one)
              LKC_LAUNCH((k_amax_cast<XD, OD, VEC, 64>), tiles + casts, THREADS, 0, st, a);
            else if (cast)
              LKC_LAUNCH((k_cast<XD, OD, VEC, 64>), casts, THREADS, 0, st, a);
            return cudaGetLastError();
          }
        }
        if (one) {
          LKC_LAUNCH((k_amax_cast<XD, OD, VEC, TILE_ROWS>), 2 * tiles, THREADS, 0, st, a);
        } else if (cast) {
          LKC_LAUNCH((k_cast<XD, OD, VEC, TILE_ROWS>), tiles, THREADS, 0, st, a);
        }
        return cudaGetLastError();
      });
    });
    if (e != cudaSuccess || !a.dbias || a.xs) return e;
    dim3 grid((unsigned)((a.cols + 127) / 128), (unsigned)a.num);
    LKC_LAUNCH(k_dbias<XD>, grid, 128, 0, st, a);
    return cudaGetLastError();
  });
}

/* the bias gradient of a high-precision backward: each expert's column sums of dy */
extern "C" cudaError_t lk_grouped_dbias(const void *dy, int dtype, int64_t rows, int64_t cols,
                                        int num, const int32_t *splits, void *const *db,
                                        int db_dtype, int accumulate, cudaStream_t st) {
  GroupedQuant a{};
  a.x = dy;
  a.splits = splits;
  a.total_rows = rows;
  a.cols = cols;
  a.num = num;
  a.align = 1;
  a.dbias = db;
  a.dbias_dtype = db_dtype;
  a.dbias_accumulate = accumulate;
  return with_float_dtype(dtype, [&](auto xd) {
    constexpr int XD = decltype(xd)::value;
    dim3 grid((unsigned)((cols + 127) / 128), (unsigned)num);
    LKC_LAUNCH(k_dbias<XD>, grid, 128, 0, st, a);
    return cudaGetLastError();
  });
}
