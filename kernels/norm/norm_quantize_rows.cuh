/* The per-tensor fused norm + FP8 kernels that keep rows resident (kernels/norm/norm_quantize.cu's
 * lk_norm_quantize picks them for rows of up to kResident elements a thread). Included by
 * norm_quantize.cu once its Params and code helpers are defined; no include guard
 * (spec/native/sim_norm.cpp includes the .cu inside a namespace of its own). */
#include "common/codec.cuh"
#include "common/elements.cuh"
#include "common/launch.cuh"
#include "common/reduce.cuh"

namespace {

/* For rows of up to kResident elements a thread (hidden <= 8192 for 16-bit inputs): a block of
 * kRowThreads threads does rows two at a time with norm_fwd_rows' split (kernels/norm/norm.cu;
 * resident_stats2: the same mean and rstd bits), so x is read once and the next rows' loads are
 * in flight during the current ones' reductions. The rowwise codes leave from registers (a
 * warp's stores are whole 128-byte lines); the columnwise codes are staged in shared memory as
 * [kQRows][hidden] bytes a block and leave per column as one run of the cluster's groups
 * (k_norm_quantize_staged: 16-byte stores from adjacent lanes when rows is a multiple of
 * kQRows, byte by byte otherwise). */
constexpr int kQRows = 16;

/* the four codes of columns c .. c + 3 of tile row i, from the staged [kQRows][h] bytes */
__device__ __forceinline__ uint32_t staged_word(const uint8_t *st, int64_t h, int i, int64_t c) {
  return *reinterpret_cast<const uint32_t *>(st + i * h + c);
}

/* the V codes of v (y rounded as stored) under scale s, as V / 4 little-endian words: two codes
 * a conversion */
template <int OD, int V>
__device__ __forceinline__ void code_words(const float (&v)[V], float s, uint32_t (&w)[V / 4]) {
#pragma unroll
  for (int k = 0; k < V / 4; k++)
    w[k] = lkc::fp8x2<OD>(v[4 * k] * s, v[4 * k + 1] * s) |
           lkc::fp8x2<OD>(v[4 * k + 2] * s, v[4 * k + 3] * s) << 16;
}

/* the V codes at dst: one 4- or 8-byte store where aligned (c and hidden are multiples of V),
 * else byte by byte */
template <int V>
__device__ __forceinline__ void store_codes(uint8_t *dst, const uint32_t (&w)[V / 4],
                                            bool aligned) {
  if (aligned) {
    if constexpr (V == 8)
      *reinterpret_cast<uint2 *>(dst) = make_uint2(w[0], w[1]);
    else
      *reinterpret_cast<uint32_t *>(dst) = w[0];
  } else {
#pragma unroll
    for (int k = 0; k < V; k++)
      dst[k] = static_cast<uint8_t>(w[k / 4] >> (8 * (k % 4)));
  }
}

/* the 32-bit words of a chunk of V 16-bit values (one for a scalar chunk) */
template <int V> constexpr int kPackedWords = V > 1 ? V / 2 : 1;

/* y's chunk rounded into the activation dtype as the stored y would be: values v and, for 16-bit
 * dtypes, the packed words (two values a conversion, not one) */
template <int DT, int V>
__device__ __forceinline__ void round_chunk(const float (&y)[V], float (&v)[V],
                                            uint32_t (&w)[kPackedWords<V>]) {
  if constexpr (V > 1 && DT != LUTRA_F32) {
#pragma unroll
    for (int k = 0; k < V / 2; k++) {
      w[k] = pack2<DT>(y[2 * k], y[2 * k + 1]);
      unpack2<DT>(w[k], v[2 * k], v[2 * k + 1]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < V; k++)
      v[k] = round_to<DT>(y[k]);
  }
}

/* y's chunk (columns o .. o + V of the matrix) as stored: into y_out when given (16-byte aligned
 * for V > 1), its max|.| into m, and when codes, its codes into data (when given) and stage
 * (when given: the chunk's own place there). data and y_out are the kernel's, the same for every
 * chunk, so their tests are uniform. */
template <int DT, int OD, int V>
__device__ __forceinline__ void emit_chunk(const float (&y)[V], float s, bool codes, uint8_t *data,
                                           bool row_vec, uint8_t *stage, void *y_out, int64_t o,
                                           float &m) {
  float v[V];
  uint32_t yw[kPackedWords<V>];
  round_chunk<DT, V>(y, v, yw);
#pragma unroll
  for (int k = 0; k < V; k++)
    m = fmaxf(m, fabsf(v[k]));
  if (y_out) {
    if constexpr (V == 8 && DT != LUTRA_F32)
      *reinterpret_cast<uint4 *>(static_cast<uint16_t *>(y_out) + o) =
          make_uint4(yw[0], yw[1], yw[2], yw[3]);
    else
      stv<DT, V>(y_out, o, y);
  }
  if (!codes) return;
  if constexpr (V == 1) {
    const uint8_t q = code<OD>(v[0], s);
    if (data) data[o] = q;
    if (stage) *stage = q;
  } else {
    uint32_t w[V / 4];
    code_words<OD, V>(v, s, w);
    if (data) store_codes<V>(data + o, w, row_vec);
    if (stage) store_codes<V>(stage, w, true);
  }
}

/* the block's max|y| into the amax (delayed: max-accumulated; current's first pass: the arrival
 * protocol), and block 0's scale_inv outputs */
__device__ __forceinline__ void finish_rows(const Params &p, float m, float *fred, float s) {
  if (p.amax) {
    m = lkc::block_max(m, fred);
    if (threadIdx.x == 0) {
      if (!p.amax_pass) {
        /* an atomic that cannot raise the amax is left out */
        if (m >= 0.0f && !(m <= *reinterpret_cast<volatile float *>(p.amax)))
          lkc::atomic_fmax(p.amax, m);
      } else {
        tensor_amax_arrive(p, m);
      }
    }
  }
  if (p.write_tensor_inv && blockIdx.x == 0 && threadIdx.x == 0) write_tensor_inv(p, s);
}

/* max(m, max|y|) over the V values x of columns c .. c + V (normalized in place: y as the forward
 * computes it, rounded into the activation dtype as stored), gamma and beta read here (L1 hits) */
template <int DT, int PDT, int V>
__device__ __forceinline__ float chunk_amax(const lutra_norm_args &a, float (&x)[V], int64_t c,
                                            float mean, float rstd, bool vec, float m) {
  const bool beta = !a.rms;
  float g[V], b[V], v[V];
  uint32_t w[kPackedWords<V>];
  load_param_chunk<PDT, V>(a, beta, vec, c, g, b);
  normalize<V>(x, mean, rstd, g, b, beta);
  round_chunk<DT, V>(x, v, w);
#pragma unroll
  for (int k = 0; k < V; k++)
    m = fmaxf(m, fabsf(v[k]));
  return m;
}

/* Current scaling's first pass on the tile path (launch_tiles): k_row_stats's statistics (kept in
 * a.mean / a.rstd for the tile kernel) and max|y| into the arrival protocol, whose last block
 * writes amax and the scale the tile kernel then reads (the rows kernels' amax pass computes the
 * same maximum). A block per kStatRows rows, one row's loads in flight during the previous row's
 * reductions and max|y|. */
template <int DT, int PDT, int V, int NC>
__global__ void __launch_bounds__(kRowThreads, NC *V <= 16 ? 4 : 2) k_row_stats_amax(Params p) {
  if (p.skip && *p.skip) return; /* uniform: before any barrier */
  __shared__ RowRed red;
  __shared__ float fred[32];
  const lutra_norm_args &a = p.n;
  const int64_t h = a.hidden, r0 = static_cast<int64_t>(blockIdx.x) * kStatRows;
  const int64_t r1 = imin<int64_t>(a.rows, r0 + kStatRows);
  const bool vec = params_vec<V>(a, !a.rms);
  Raw<DT, V> cur[NC] = {}, nxt[NC] = {};
  if (r0 < r1) load_row<DT, V, NC>(a.x, r0 * h, h, cur);
  float m = -INFINITY;
  for (int64_t r = r0; r < r1; r++) {
    float x[NC][V], mean, rstd;
    resident_row<DT, V, NC>(a, r, r1, cur, nxt, x, red, mean, rstd);
#pragma unroll
    for (int j = 0; j < NC; j++) {
      if (col<V>(j) < h) m = chunk_amax<DT, PDT, V>(a, x[j], col<V>(j), mean, rstd, vec, m);
      cur[j] = nxt[j];
    }
  }
  m = lkc::block_max(m, fred);
  if (threadIdx.x == 0) tensor_amax_arrive(p, m);
}

/* The same for rows narrower than one chunk of V a thread (k_row_stats_warps: a warp a row,
 * kRowWarps rows a block); y's amax from the chunks row_stats_resident loaded */
template <int DT, int PDT, int V, int NC>
__global__ void __launch_bounds__(kRowThreads) k_row_stats_amax_warps(Params p) {
  if (p.skip && *p.skip) return; /* uniform: before any barrier */
  __shared__ float fred[32];
  const lutra_norm_args &a = p.n;
  const int lane = threadIdx.x & 31;
  const int64_t h = a.hidden, r = static_cast<int64_t>(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
  const bool vec = params_vec<V>(a, !a.rms);
  float m = -INFINITY;
  if (r < a.rows) {
    float x[NC][V], mean, rstd;
    row_stats_resident<DT, V, NC>(a, r * h, lane, x, mean, rstd);
    if (lane == 0) keep_stats(a, r, mean, rstd);
#pragma unroll
    for (int g = 0; g < NC; g++) {
      const int64_t c = (static_cast<int64_t>(lane) + 32 * g) * V;
      if (c < h) m = chunk_amax<DT, PDT, V>(a, x[g], c, mean, rstd, vec, m);
    }
  }
  m = lkc::block_max(m, fred);
  if (threadIdx.x == 0) tensor_amax_arrive(p, m);
}

/* current scaling's first pass for the tile path's rows of h columns (the two kernels above as
 * row_stats_kernel picks the statistics' kernel), or nullptr where the rows exceed kResident
 * elements a thread */
template <int DT, int PDT, int V> auto row_stats_amax_kernel(int64_t h) -> void (*)(Params) {
  if (row_stats_by_warps<V>(h))
    return with_lane_chunks<V, void (*)(Params)>(
        h, [](auto nc) { return k_row_stats_amax_warps<DT, PDT, V, decltype(nc)::value>; });
  return with_resident_chunks<V, void (*)(Params)>(
      h, [](auto nc) { return k_row_stats_amax<DT, PDT, V, decltype(nc)::value>; });
}

/* The columnwise codes of staged rows g0 .. g0 + n of the tile rows ([kQRows][h] bytes, row i
 * of the group at staged + i h) into col_data ([h][rows]): whole 16-byte column runs where the
 * group is kQRows rows of a matrix whose rows are a multiple of kQRows, else byte by byte. */
__device__ __forceinline__ void write_staged_columns(const Params &p, const uint8_t *staged,
                                                     int64_t h, int64_t g0, int64_t n) {
  const int64_t rows = p.n.rows;
  if (n == kQRows && h % 4 == 0 && rows % kQRows == 0 &&
      (reinterpret_cast<uintptr_t>(p.col_data) & 15) == 0) {
    /* thread: 4 columns x 16 rows, read as 16 words (a warp reads whole staged rows) and
     * transposed into 4 16-byte column runs */
    for (int64_t c = static_cast<int64_t>(threadIdx.x) * 4; c < h; c += kRowThreads * 4) {
      uint32_t w[kQRows];
#pragma unroll
      for (int i = 0; i < kQRows; i++)
        w[i] = staged_word(staged, h, i, c);
#pragma unroll
      for (int k = 0; k < 4; k++) {
        uint32_t o[4];
#pragma unroll
        for (int q4 = 0; q4 < 4; q4++)
          o[q4] = (w[4 * q4] >> (8 * k) & 0xFFu) | (w[4 * q4 + 1] >> (8 * k) & 0xFFu) << 8 |
                  (w[4 * q4 + 2] >> (8 * k) & 0xFFu) << 16 |
                  (w[4 * q4 + 3] >> (8 * k) & 0xFFu) << 24;
        *reinterpret_cast<uint4 *>(p.col_data + (c + k) * rows + g0) =
            make_uint4(o[0], o[1], o[2], o[3]);
      }
    }
  } else {
    for (int64_t e = threadIdx.x; e < n * h; e += kRowThreads) {
      const int64_t c = e / n, i = e % n;
      p.col_data[c * rows + g0 + i] = staged[i * h + c];
    }
  }
}

/* Clusters of CL blocks (sm_90): the cluster's blocks share their staged codes through
 * distributed shared memory, so that a column run leaving is CL groups long (16 CL bytes). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(LKC_SIM)
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
/* every thread of the cluster arrives; its shared memory writes before are seen by the cluster's
 * reads after */
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;" ::
                   : "memory");
}
/* the address of p (this block's shared memory) in the shared memory of the cluster's block q */
__device__ __forceinline__ const uint8_t *cluster_peer(const uint8_t *p, unsigned q) {
  uint64_t out;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(out) : "l"(p), "r"(q));
  return reinterpret_cast<const uint8_t *>(out);
}
#else
__device__ __forceinline__ unsigned cluster_rank() {
  return 0;
}
__device__ __forceinline__ void cluster_sync() {}
__device__ __forceinline__ const uint8_t *cluster_peer(const uint8_t *p, unsigned) {
  return p;
}
#endif

/* The columnwise codes of a whole super group (CL groups of kQRows rows from row sg0, group q
 * staged by the cluster's block q) for this block's share of the columns (the rank-th h / CL):
 * per column CL 16-byte runs one after the other. Thread t reads group t % CL, so that the CL
 * threads storing a column's runs are adjacent lanes of one store instruction, which the
 * memory system takes as one 16 CL-byte run; the same runs stored by one thread, one
 * instruction each, made the kernel much slower (docs/lab/). */
template <int CL>
__device__ __forceinline__ void write_cluster_columns(const Params &p, const uint8_t *staged,
                                                      int64_t h, int64_t sg0) {
  const int64_t rows = p.n.rows, share = h / CL, c0 = cluster_rank() * share;
  const int q = static_cast<int>(threadIdx.x) % CL, u = static_cast<int>(threadIdx.x) / CL;
  const uint8_t *src = CL == 1 ? staged : cluster_peer(staged, static_cast<unsigned>(q));
  for (int64_t c = c0 + static_cast<int64_t>(u) * 4; c < c0 + share; c += kRowThreads / CL * 4) {
    uint32_t w[kQRows];
#pragma unroll
    for (int i = 0; i < kQRows; i++)
      w[i] = staged_word(src, h, i, c);
#pragma unroll
    for (int k = 0; k < 4; k++) {
      uint32_t o[4];
#pragma unroll
      for (int q4 = 0; q4 < 4; q4++)
        o[q4] = (w[4 * q4] >> (8 * k) & 0xFFu) | (w[4 * q4 + 1] >> (8 * k) & 0xFFu) << 8 |
                (w[4 * q4 + 2] >> (8 * k) & 0xFFu) << 16 | (w[4 * q4 + 3] >> (8 * k) & 0xFFu) << 24;
      *reinterpret_cast<uint4 *>(p.col_data + (c + k) * rows + sg0 + q * kQRows) =
          make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
}

/* Both copies' codes (the columnwise one staged): the forward's loop two rows at a time
 * (normalized_pairs_of) over groups of kQRows rows. A cluster of CL blocks (CL = 1: a block)
 * takes super groups of CL groups, cluster k of K taking super groups k, k + K, ... (one wave:
 * staged_grid), its block q the super group's q-th group. Each group's columnwise codes wait in
 * shared memory ([kQRows][hidden] bytes) until the super group is complete; then the cluster's
 * blocks write them out, each a share of the columns with every group's rows (16 CL-byte column
 * runs), while the next pair's loads are in flight. The rowwise codes leave from registers.
 * Why (each measured side by side, docs/lab/): 16-byte column runs stored one instruction
 * each were slow whoever wrote them; the cluster's blocks write a column's runs from adjacent
 * lanes of one instruction instead (write_cluster_columns). Clusters of two did best; four and
 * eight were slower. Strided, because adjacent clusters run side by side, so the runs that share
 * a line reach L2 close together; with each block's groups consecutive they came a group's time
 * apart, and the kernel was slower still. */
template <int DT, int PDT, int OD, int V, int NC, int CL, bool FULL>
__global__ void __launch_bounds__(kRowThreads, NC *V <= 16 ? 3 : 1)
    k_norm_quantize_staged(Params p) {
  if (p.skip && *p.skip) return; /* uniform over the grid: before any barrier */
  __shared__ RowRed red;
  __shared__ float fred[32];
  uint8_t *staged = lkc::dyn_smem();
  const lutra_norm_args &a = p.n;
  const int64_t h = a.hidden, rows = a.rows, groups = cdiv<int64_t>(rows, kQRows);
  const int64_t supers = cdiv<int64_t>(groups, CL);
  const int64_t k = blockIdx.x / CL, stride = gridDim.x / CL, q = cluster_rank();
  /* this cluster's super groups k, k + stride, ...; this block's rows in them (its group in the
   * last one may be partial or empty) */
  const int64_t mine = k < supers ? (supers - 1 - k) / stride + 1 : 0;
  const int64_t last = ((k + (mine - 1) * stride) * CL + q) * kQRows;
  const int64_t n =
      mine > 0 ? (mine - 1) * kQRows + imax<int64_t>(0, imin<int64_t>(kQRows, rows - last)) : 0;
  auto row_of = [&](int64_t i) {
    return ((k + i / kQRows * stride) * CL + q) * kQRows + i % kQRows;
  };
  const bool runs = rows % kQRows == 0 && h % (4 * CL) == 0 &&
                    (reinterpret_cast<uintptr_t>(p.col_data) & 15) == 0;
  const float s = *p.scale;
  const bool row_vec = (reinterpret_cast<uintptr_t>(p.data) & (V == 8 ? 7 : 3)) == 0;
  float m = -INFINITY;
  int64_t flushed = 0; /* super groups written */
  auto flush = [&](int64_t staged_rows) {
    const int64_t sg0 = (k + flushed * stride) * CL * kQRows;
    if (CL > 1)
      cluster_sync(); /* every block's codes of the super group staged */
    else
      __syncthreads();
    if (runs && sg0 + CL * kQRows <= rows) {
      write_cluster_columns<CL>(p, staged, h, sg0);
    } else if (staged_rows > 0) {
      write_staged_columns(p, staged, h, sg0 + q * kQRows, staged_rows);
    }
    /* the cluster's blocks read each other's stages: none is refilled before all are done; a
     * block alone needs no barrier here (its next statistics come first) */
    if (CL > 1) cluster_sync();
    flushed++;
  };
  normalized_pairs_of<DT, PDT, V, NC, FULL>(
      a, n, row_of, red,
      [&](int64_t r, int64_t c, const float(&y)[V]) {
        emit_chunk<DT, OD, V>(y, s, true, p.data, row_vec, staged + r % kQRows * h + c, a.y,
                              r * h + c, m);
      },
      [&](int64_t i) {
        const int64_t done = imin<int64_t>(i + 2, n); /* the block's rows 0 .. done complete */
        if (done % kQRows != 0 && done != n) return;
        flush(done - (done - 1) / kQRows * kQRows);
      });
  while (flushed < mine) /* an empty group in the last super group: the cluster's barriers */
    flush(0);
  finish_rows(p, m, fred, s);
}

/* Rowwise codes only (or current scaling's amax pass): two rows at a time (normalized_pairs),
 * gamma and beta read per chunk (L1 hits), p.pair_rows rows a block: as the forward, the rows
 * spread over one wave of blocks (pair_rows_per_block), so no partial last wave and each
 * block's first, unoverlapped loads are paid once per many rows. */
template <int DT, int PDT, int OD, int V, int NC, bool FULL>
__global__ void __launch_bounds__(kRowThreads, NC *V <= 16 ? 3 : 1) k_norm_quantize_rows(Params p) {
  if (p.skip && *p.skip) return; /* uniform: before any barrier */
  __shared__ RowRed red;
  __shared__ float fred[32];
  const lutra_norm_args &a = p.n;
  const int64_t h = a.hidden, r0 = static_cast<int64_t>(blockIdx.x) * p.pair_rows;
  const bool codes = !p.amax_pass && p.data;
  const float s = !p.amax_pass ? *p.scale : 1.0f;
  const bool row_vec = (reinterpret_cast<uintptr_t>(p.data) & (V == 8 ? 7 : 3)) == 0;
  float m = -INFINITY;
  normalized_pairs<DT, PDT, V, NC, FULL>(a, r0, imin<int64_t>(a.rows, r0 + p.pair_rows), red,
                                         [&](int64_t r, int64_t c, const float(&y)[V]) {
                                           emit_chunk<DT, OD, V>(y, s, codes, p.data, row_vec,
                                                                 nullptr, a.y, r * h + c, m);
                                         });
  finish_rows(p, m, fred, s);
}

} // namespace
