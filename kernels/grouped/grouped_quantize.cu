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
 *   k_cast   the FP8 codes, rowwise and each expert's transpose, of 64-row tiles (16 for rows
 *            that are not 16-byte aligned or with an activation; padding rows encode zero) in
 *            chunks of 128 columns: 16-byte loads, 16-byte rowwise stores, and the transpose
 *            gathered in shared memory into 16-byte stores per column (the next chunk's loads
 *            issued before the current chunk is encoded); an
 *            expert's first group writes its scale_inv (and its scale), its last (current
 *            scaling) publishes the amax and zeroes the work words again
 *   k_dbias  each expert's column sums in double, rows in order (the CPU's bias_grad order)
 * Each block's first thread scans the splits (O(num_gemms)) for its expert's offsets and checks
 * them: bad splits (a split < 0, or a sum other than the rows) set *bad_split from block 0 and
 * every block returns without writing. A 16-row group never straddles two experts (padded
 * offsets are multiples of 16): a 64-row tile's four groups each have their expert. Per-tensor
 * scaling only (delayed and current); the block-scaled recipes are
 * kernels/grouped/grouped_quantize_blocks.cu. Codes and scales are bit for bit the CPU's
 * (common/codec.cuh's conversions; spec/native/sim_grouped_quantize.cpp checks the kernels on the
 * CPU). */
#include "activation/act_cast.cuh"
#include "common/codec.cuh"
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"
#include "common/reduce.cuh"
#include "common/scale.cuh"
#include "grouped_cast_tiles.cuh"
#include "grouped_kernels.h"
#include "grouped_rows.cuh"

#include "backend/grouped_layout.h"

namespace {

using namespace lkc;
using namespace lk_grouped_tiles;

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

/* Where the G 16-row groups from padded row prow0 lie: each group's expert (e = -1, no rows:
 * past the last expert), found in one walk over the splits, or by arithmetic without them (the
 * weights: rows_each rows each); with e_fixed >= 0 (G = 1), expert e_fixed itself. */
template <int G>
__device__ void locate(const GroupedQuant &a, int64_t prow0, Where *w, int e_fixed = -1) {
  auto take = [&](int g, int e, int64_t R, int64_t P, int64_t s, int64_t p) {
    w[g].e = e;
    w[g].R = R, w[g].P = P, w[g].s = s, w[g].p = p;
  };
  for (int g = 0; g < G; g++)
    take(g, -1, 0, 0, 0, 0);
  bool ok;
  if (!a.splits) {
    const int64_t s = a.rows_each, p = lutra_grouped_roundup(s, a.align);
    ok = s >= 0;
    for (int g = 0; g < G; g++) {
      const int64_t e = e_fixed >= 0 ? e_fixed : p > 0 ? (prow0 + g * TILE_ROWS) / p : a.num;
      if (ok && e < a.num) take(g, (int)e, e * s, e * p, s, p);
    }
  } else {
    int64_t P = 0;
    ok = walk_splits(a.splits, a.rows_each, a.total_rows, a.num, a.align,
                     [&](int e, int64_t r, int64_t s, int64_t p) {
                       for (int g = 0; g < G; g++)
                         if (w[g].e < 0 &&
                             (e_fixed >= 0 ? e == e_fixed : prow0 + g * TILE_ROWS < P + p))
                           take(g, e, r, P, s, p);
                       P += p;
                     });
  }
  for (int g = 0; g < G; g++)
    w[g].ok = ok;
}

/* 16 consecutive elements of row r of the block's expert from column c, zero past its s rows
 * and past the last column; VEC: the row starts are 16-byte aligned and cols % 16 == 0. With a
 * fused activation the elements are act(x) (kernels/activation/act_cast.cuh): 16 at once for a
 * kind without a gate (VEC), else one by one (a gated kind reads two columns of x per element,
 * which no 16-byte load covers). */
template <int XD, bool VEC>
__device__ __forceinline__ void load_seg(const GroupedQuant &a, const Where &w, int64_t r,
                                         int64_t c, float (&v)[16]) {
  if (r >= w.s || c >= a.cols) {
    LKC_UNROLL
    for (int k = 0; k < 16; k++)
      v[k] = 0.0f;
    return;
  }
  if (a.act) { /* token rows only; VEC: cols % 16 == 0, so all 16 are in */
    if (VEC && !lkact::act_gated(a.act_kind)) {
      lkact::act_values16<XD>(a, w.R + r, c, v);
      return;
    }
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
  if (threadIdx.x == 0) locate<1>(a, prow0, &w);
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

/* The codes of a TR-row tile (TR = 16, or 64 for 16-byte rows without an activation), chunk by
 * chunk: each thread encodes 16 elements of each of its TR / 16 rows and stores them rowwise as
 * 16-byte words and into a shared tile, from which the transpose is written
 * (store_transpose16 / 64). Each 16-row group g has its own expert w[g] (the padded layout's
 * unit), its scale, and its rows in that expert's transpose. */
template <int XD, int OD, bool VEC, int TR>
__device__ void cast_tile(const GroupedQuant &a, const Where *w, int64_t prow0) {
  constexpr int G = TR / TILE_ROWS; /* 16-row groups: thread t holds row t / 8 of each */
  /* wide tiles: 16-byte rows without an activation (the launcher's choice); the other paths are
   * not compiled for them */
  constexpr bool NARROW = TR == TILE_ROWS;
  static_assert(TR == TILE_ROWS || (TR == 64 && VEC), "16-row tiles, or 64 of 16-byte rows");
  /* two tiles, alternating by chunk: a chunk's codes go into one while the previous chunk's
   * are still gathered from the other, so one barrier per chunk orders both */
  __shared__ __align__(16) uint8_t tiles[2][TR][CHUNK];
  int buf = 0;
  const int64_t cols = a.cols;
  const int tr = threadIdx.x / 8, seg = threadIdx.x % 8;
  float sc[G], m[G];
  LKC_UNROLL
  for (int g = 0; g < G; g++) {
    const int e = w[g].e;
    m[g] = 0.0f;
    sc[g] = 0.0f;
    if (e < 0) continue;
    /* volatile: in the one-launch kernel other blocks wrote the word during this launch */
    const float acc =
        a.current ? bits_f32(*static_cast<const volatile uint32_t *>(a.work + 4 * e)) : 0.0f;
    sc[g] = a.current ? scale_rule(acc, a.fp8_max, a.power_2_scale, a.eps) : a.scale[4 * e];
  }
  /* row r of group g in its expert (rows past its s rows, and groups without one, read zeros) */
  auto row_of = [&](int g) { return prow0 + g * TILE_ROWS + tr - w[g].P; };
  /* one chunk: 16 elements of each of the thread's rows, loaded into v[g] */
  auto cast_chunk = [&](int64_t c0, const float(&v)[G][16]) {
    const int64_t c = c0 + seg * 16;
    uint8_t(&tile)[TR][CHUNK] = tiles[buf];
    buf ^= 1;
    LKC_UNROLL
    for (int g = 0; g < G; g++) {
      if (w[g].e < 0) continue; /* uniform per block */
      const int64_t r = row_of(g);
      LKC_UNROLL
      for (int k = 0; k < 16; k++)
        m[g] = fmaxf(m[g], fabsf(v[g][k]));
      if (NARROW && a.act_out && r < w[g].s) { /* the activation's output, kept for backward */
        LKC_UNROLL
        for (int k = 0; k < 16; k++)
          if (c + k < cols) st<XD>(a.act_out, (w[g].R + r) * cols + c + k, v[g][k]);
      }
      const uint4 q = encode16<OD>(v[g], sc[g]);
      if (c < cols) {
        const int tr_g = g * TILE_ROWS + tr;
        uint8_t *row = a.data ? a.data + (prow0 + tr_g) * cols + c : nullptr;
        if (row && VEC) {
          *reinterpret_cast<uint4 *>(row) = q;
        } else if (row) {
          for (int k = 0; k < 16 && c + k < cols; k++)
            row[k] = (uint8_t)byte_of(q, k);
        }
        reinterpret_cast<uint4 *>(&tile[tr_g][0])[NARROW ? seg : swizzled16(tr_g, seg)] = q;
      }
    }
    __syncthreads();
    /* 16-byte aligned: the padded offsets and rows are multiples of 16 */
    const int g = NARROW ? 0 : threadIdx.x % 4; /* store_transpose64's group of this thread */
    if (a.col_data && w[g].e >= 0) {
      uint8_t *dst = a.col_data + w[g].P * cols + (prow0 + g * TILE_ROWS - w[g].P);
      if constexpr (NARROW)
        store_transpose16(tile, dst, c0, cols, w[0].p);
      else
        store_transpose64(tile, dst, c0, cols, w[g].p);
    }
  };
  bool fast = false; /* the next chunk's loads issued before this one's codes (Raw16) */
  if constexpr (VEC) {
    fast = !NARROW || !a.act;
    if (fast) {
      Raw16<XD> next[G];
      LKC_UNROLL
      for (int g = 0; g < G; g++)
        load_raw<XD>(a, w[g], row_of(g), seg * 16, next[g]);
      for (int64_t c0 = 0; c0 < cols; c0 += CHUNK) {
        float v[G][16];
        LKC_UNROLL
        for (int g = 0; g < G; g++) {
          const Raw16<XD> cur = next[g];
          load_raw<XD>(a, w[g], row_of(g), c0 + CHUNK + seg * 16, next[g]);
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
        load_seg<XD, VEC>(a, w[0], row_of(0), c0 + seg * 16, v[0]);
        cast_chunk(c0, v);
      }
  if (!a.current && a.amax) { /* delayed scaling: this step's amax slots, max-accumulated */
    __shared__ float red[32];
    for (int g = 0; g < G; g++) { /* one reduction per expert: its groups are consecutive */
      if (w[g].e < 0 || (g > 0 && w[g].e == w[g - 1].e)) continue;
      float mg = m[g];
      for (int h = g + 1; h < G && w[h].e == w[g].e; h++)
        mg = fmaxf(mg, m[h]);
      mg = block_max(mg, red);
      if (threadIdx.x == 0) atomic_fmax(a.amax + (int64_t)w[g].e * a.amax_stride, mg);
    }
  }
  __syncthreads(); /* every thread has read the work words before they are cleared below */
  if (threadIdx.x != 0) return;
  for (int g = 0; g < G; g++) {
    const int e = w[g].e;
    if (e < 0) continue;
    if (prow0 + g * TILE_ROWS == w[g].P) { /* the expert's first group */
      const float inv = div_x86(1.0f, sc[g]);
      if (a.scale_inv) a.scale_inv[16 * e] = inv;
      if (a.col_scale_inv) a.col_scale_inv[16 * e] = inv;
      if (a.current) a.scale[4 * e] = sc[g];
    }
    if (a.current) { /* the expert's last group to finish publishes the amax, clears the words */
      const float acc = bits_f32(*static_cast<const volatile uint32_t *>(a.work + 4 * e));
      __threadfence();
      if (atomicAdd(a.work + 4 * e + 1, 1u) == (unsigned)(w[g].p / TILE_ROWS) - 1) {
        if (a.amax) a.amax[(int64_t)e * a.amax_stride] = acc;
        a.work[4 * e] = 0u;
        a.work[4 * e + 1] = 0u;
        a.work[4 * e + 2] = 0u;
      }
    }
  }
}

template <int XD, int OD, bool VEC, int TR>
__global__ void __launch_bounds__(THREADS) k_cast(GroupedQuant a) {
  if (a.skip && *a.skip) return;
  __shared__ Where w[TR / TILE_ROWS];
  const int64_t prow0 = (int64_t)blockIdx.x * TR;
  if (threadIdx.x == 0) {
    locate<TR / TILE_ROWS>(a, prow0, w);
    if (blockIdx.x == 0 && !w[0].ok && a.bad_split) *a.bad_split = 1;
    if (blockIdx.x == 0 && w[0].ok) zero_empty_amaxes(a);
  }
  __syncthreads();
  /* the groups are in row order: without an expert for the first, none has one */
  if (w[0].ok && w[0].e >= 0) cast_tile<XD, OD, VEC, TR>(a, w, prow0);
}

/* Current scaling in one launch: tickets, taken in the order blocks start, 0..n-1 are the amax
 * tiles of the n padded 16-row tiles and the next n * 16 / TR (rounded up) the casts of TR-row
 * tiles; a cast waits until every amax tile of each of its groups' experts has counted itself
 * in work[4 e + 2]. Those tiles hold smaller
 * tickets, so they have started, and none of them waits: the kernel cannot deadlock however few
 * blocks are resident. Casts start while the last experts' maxima are still read. The last block to
 * finish sets the tickets back to zero. */
template <int XD, int OD, bool VEC, int TR>
__global__ void __launch_bounds__(THREADS) k_amax_cast(GroupedQuant a) {
  if (a.skip && *a.skip) return;
  constexpr int G = TR / TILE_ROWS;
  __shared__ Where w[G]; /* an amax tile's expert in w[0]; a cast's groups' */
  __shared__ int64_t prow0;
  __shared__ int role; /* 0 amax, 1 cast, -1 none */
  if (threadIdx.x == 0) {
    const int64_t t = atomicAdd(a.tickets, 1u);
    int64_t n = 0; /* the padded 16-row tiles */
    if (!a.splits)
      n = a.rows_each >= 0 ? a.num * lutra_grouped_roundup(a.rows_each, a.align) / TILE_ROWS : 0;
    else
      walk_splits(a.splits, a.rows_each, a.total_rows, a.num, a.align,
                  [&](int, int64_t, int64_t, int64_t p) { n += p / TILE_ROWS; });
    const int64_t casts = (n + G - 1) / G;
    role = t < n ? 0 : t < n + casts ? 1 : -1;
    prow0 = role == 1 ? (t - n) * TR : t * TILE_ROWS;
    if (role == 1)
      locate<G>(a, prow0, w);
    else
      locate<1>(a, role < 0 ? 0 : prow0, w);
    if (blockIdx.x == 0 && !w[0].ok && a.bad_split) *a.bad_split = 1;
    if (blockIdx.x == 0 && w[0].ok) zero_empty_amaxes(a);
    if (role == 1 && w[0].ok)
      for (int g = 0; g < G; g++) { /* each expert of the tile's groups, once */
        if (w[g].e < 0 || (g > 0 && w[g].e == w[g - 1].e)) continue;
        const volatile uint32_t *done = a.work + 4 * w[g].e + 2;
        while (*done < (uint32_t)(w[g].p / TILE_ROWS))
          __nanosleep(256);
      }
    __threadfence();
  }
  __syncthreads();
  if (role >= 0 && w[0].ok && w[0].e >= 0) {
    if (role == 0) {
      amax_tile<XD, VEC>(a, w[0], prow0);
      if (threadIdx.x == 0) {
        __threadfence(); /* the maximum lands before the count */
        atomicAdd(a.work + 4 * w[0].e + 2, 1u);
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
  if (threadIdx.x == 0) locate<1>(a, 0, &w, (int)blockIdx.y);
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
  /* 64-row cast tiles (store_transpose64) for 16-byte rows without an activation */
  const bool wide = !a.act;
  return with_float_dtype(q->x_dtype, [&](auto xd) {
    constexpr int XD = decltype(xd)::value;
    /* the weights (xs) are the module's own allocations; a token matrix may be a view */
    const bool vec =
        a.cols % 16 == 0 && (a.xs || aligned(a.x, 16)) && aligned(a.data, 16) && aligned(a.act, 16);
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
