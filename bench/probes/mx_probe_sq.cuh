/* The 128x128-tile variants of bench/probes/mx_probe.cu (k_sq, k_pipe, k_cl and their
 * launchers): included by that file after Args, the diagnostic flags and k_base's helpers, which
 * they use; no include guard. */

/* ---- 128x128 tiles, 256 threads ------------------------------------------------------------
 * Warp w holds rows 32 (w & 3) .. + 31 and columns 64 (w >> 2) .. + 63 of the tile (lanes as in
 * k_base: k = lane & 7 along a row, h = lane >> 3 down), so both block amaxes stay in a warp.
 * Both code tiles go through shared memory and leave as whole 128-byte lines (8 lanes per row,
 * 16 bytes each); the scales are staged and leave as one 4-byte store per row and per column.
 * k_mx16 of the library is k_sq with F_SC_EVICT_LAST. */
constexpr int SQ_THREADS = 256, SQ = 128;
constexpr int SQ_SMEM = 2 * SQ * SQ + 2 * 4 * SQ; /* row codes, col codes, row and col scales */
enum {
  F_NO_SCALES = 1,      /* diagnostic: no scale stores */
  F_SCALES_LINEAR = 2,  /* diagnostic: the tile's scales stored contiguously (wrong places) */
  F_SC_EVICT_LAST = 4,  /* scale stores with an L2::evict_last policy */
  F_ST_EVICT_FIRST = 8, /* code stores with an L2::evict_first policy */
};

struct SqSmem {
  uint8_t *rb, *cb, *rs, *cs; /* [128][128] codes (chunks swizzled), [4 blocks][128] scales */
};
__device__ __forceinline__ SqSmem sq_smem(uint8_t *base) {
  return {base, base + SQ * SQ, base + 2 * SQ * SQ, base + 2 * SQ * SQ + 4 * SQ};
}

__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ uint64_t l2_policy_evict_last() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}

/* the tile's origin: row-major order */
__device__ __forceinline__ void sq_origin(const Args &a, uint32_t tile, int64_t &r0, int64_t &c0) {
  const uint32_t tr = tile / (uint32_t)a.tiles_c;
  r0 = (int64_t)tr * SQ;
  c0 = (int64_t)(tile - tr * (uint32_t)a.tiles_c) * SQ;
}

/* the thread's 8x8 values (first row tr, first column tc of the tile) into both code tiles and
 * scale arrays of sm */
__device__ __forceinline__ void sq_encode(const Args &a, const uint4 (&x)[8], int tr, int tc,
                                          const SqSmem &sm) {
  const int k = (tc >> 3) & 7, h = (tr >> 3) & 3;
  uint32_t rm[4], cm[4];
  mx_amax(x, rm, cm);
  uint32_t es[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 8; i++) {
    uint32_t e;
    const float s = mx_scale((rm[i >> 1] >> (16 * (i & 1))) & 0xFFFFu, a.max_rcp, e);
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; j++)
      v[j] = value16(word_of(x[i], j >> 1), j & 1);
    const int q = (tc >> 4) ^ (4 * (h & 1));
    *reinterpret_cast<uint2 *>(sm.rb + SQ * (tr + i) + 16 * q + 8 * (k & 1)) = encode8(v, s);
    es[i >> 2] |= e << (8 * (i & 3));
  }
  if ((k & 3) == 0)
    *reinterpret_cast<uint2 *>(sm.rs + SQ * (tc >> 5) + tr) = make_uint2(es[0], es[1]);
  es[0] = es[1] = 0u;
#pragma unroll
  for (int jj = 0; jj < 8; jj++) {
    uint32_t e;
    const float s = mx_scale((cm[jj >> 1] >> (16 * (jj & 1))) & 0xFFFFu, a.max_rcp, e);
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
      v[i] = value16(word_of(x[i], jj >> 1), jj & 1);
    *reinterpret_cast<uint2 *>(sm.cb + SQ * (tc + jj) + 16 * ((tr >> 4) ^ k) + 8 * (h & 1)) =
        encode8(v, s);
    es[jj >> 2] |= e << (8 * (jj & 3));
  }
  if (h == 0) *reinterpret_cast<uint2 *>(sm.cs + SQ * (tr >> 5) + tc) = make_uint2(es[0], es[1]);
}

/* both code tiles of sm to memory, 8 lanes per 128-byte line */
template <int F>
__device__ __forceinline__ void sq_store_codes(const Args &a, int t, int64_t r0, int64_t c0,
                                               const SqSmem &sm) {
  const uint64_t pol = (F & F_ST_EVICT_FIRST) ? l2_policy_evict_first() : 0;
  auto st = [&](uint8_t *d, const uint8_t *s) {
    const uint4 w = *reinterpret_cast<const uint4 *>(s);
    if (F & F_ST_EVICT_FIRST)
      asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(d), "r"(w.x),
                   "r"(w.y), "r"(w.z), "r"(w.w), "l"(pol));
    else
      *reinterpret_cast<uint4 *>(d) = w;
  };
#pragma unroll
  for (int it = 0; it < SQ * SQ / 16 / SQ_THREADS; it++) {
    const int u = t + SQ_THREADS * it, row = u >> 3, g = u & 7;
    if (r0 + row < a.rows && c0 + 16 * g < a.cols)
      st(a.data + (r0 + row) * a.cols + c0 + 16 * g,
         sm.rb + SQ * row + 16 * (g ^ (4 * ((row >> 3) & 1))));
    if (c0 + row < a.cols && r0 + 16 * g < a.rows)
      st(a.col_data + (c0 + row) * a.rows + r0 + 16 * g,
         sm.cb + SQ * row + 16 * (g ^ ((row >> 3) & 7)));
  }
}

/* the tile's scales: threads 0..127 row t's 4 bytes, 128..255 column t - 128's; `which`: 1 rows,
 * 2 columns, 3 both */
template <int F>
__device__ __forceinline__ void sq_store_scales(const Args &a, int t, uint32_t tile, int64_t r0,
                                                int64_t c0, const SqSmem &sm, int which) {
  if (F & F_NO_SCALES) return;
  const int q = t & (SQ - 1);
  const bool col = t >= SQ;
  if (!(which & (col ? 2 : 1))) return;
  const uint8_t *src = (col ? sm.cs : sm.rs) + q;
  const int64_t lim = col ? a.rows : a.cols, o0 = col ? r0 : c0;
  const int64_t line = col ? c0 + q : r0 + q;
  if (line >= (col ? a.cols : a.rows)) return;
  uint8_t *d = (col ? a.col_scale_inv : a.scale_inv) + line * (lim / 32) + o0 / 32;
  if (F & F_SCALES_LINEAR) d = (col ? a.col_scale_inv : a.scale_inv) + ((int64_t)tile * SQ + q) * 4;
  const uint32_t w = (uint32_t)src[0] | (uint32_t)src[SQ] << 8 | (uint32_t)src[2 * SQ] << 16 |
                     (uint32_t)src[3 * SQ] << 24;
  if (lim - o0 >= SQ && ((uintptr_t)d & 3u) == 0) {
    if (F & F_SC_EVICT_LAST)
      asm volatile("st.global.L2::cache_hint.b32 [%0], %1, %2;" ::"l"(d), "r"(w),
                   "l"(l2_policy_evict_last()));
    else
      *reinterpret_cast<uint32_t *>(d) = w;
  } else {
    for (int b = 0; b < 4 && o0 + 32 * b < lim; b++)
      d[b] = src[b * SQ];
  }
}

/* the thread's 8 rows of 16 bytes from global memory (zeros outside the matrix) */
__device__ __forceinline__ void sq_load(const Args &a, int64_t r, int64_t c, uint4 (&x)[8]) {
  const bool in = r < a.rows && c < a.cols;
  const uint4 *p = reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(a.x) +
                                                   (in ? r * a.cols + c : 0));
#pragma unroll
  for (int i = 0; i < 8; i++)
    x[i] = in ? __ldg(p + i * (a.cols / 8)) : make_uint4(0u, 0u, 0u, 0u);
}

/* a block per tile (a grid-stride loop past the grid) */
template <int F> __global__ void __launch_bounds__(SQ_THREADS, 2) k_sq(Args a) {
  extern __shared__ __align__(16) uint8_t smem[];
  const SqSmem sm = sq_smem(smem);
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int tr = 32 * (warp & 3) + 8 * (lane >> 3), tc = 64 * (warp >> 2) + 8 * (lane & 7);
  for (uint32_t tile = blockIdx.x; tile < (uint32_t)a.ntiles; tile += gridDim.x) {
    int64_t r0, c0;
    sq_origin(a, tile, r0, c0);
    uint4 x[8];
    sq_load(a, r0 + tr, c0 + tc, x);
    sq_encode(a, x, tr, tc, sm);
    __syncthreads();
    sq_store_codes<F>(a, t, r0, c0, sm);
    sq_store_scales<F>(a, t, tile, r0, c0, sm, 3);
    __syncthreads();
  }
}

static void sq_tiles(Args &a) {
  a.tiles_r = (a.rows + SQ - 1) / SQ;
  a.tiles_c = (a.cols + SQ - 1) / SQ;
  a.ntiles = a.tiles_r * a.tiles_c;
}

template <int F> static void launch_sq(const Args &a0, int, cudaStream_t s) {
  Args a = a0;
  sq_tiles(a);
  k_sq<F><<<(unsigned)a.ntiles, SQ_THREADS, SQ_SMEM, s>>>(a);
}

/* ---- k_pipe: persistent blocks, the next tile's inputs in flight by cp.async ------------------
 */
constexpr int PIPE_IN = SQ * SQ * 2; /* a bf16 tile */
constexpr int PIPE_SMEM = 2 * PIPE_IN + SQ_SMEM;

/* cp.async of a tile into stage buffer st: 16 chunks of 16 bytes per row, 8 per thread */
__device__ __forceinline__ void pipe_load(const Args &a, uint32_t tile, uint8_t *st, int t) {
  int64_t r0, c0;
  sq_origin(a, tile, r0, c0);
#pragma unroll
  for (int it = 0; it < PIPE_IN / 16 / SQ_THREADS; it++) {
    const int u = t + SQ_THREADS * it, row = u >> 4, ch = u & 15;
    const int64_t r = r0 + row, c = c0 + 8 * ch;
    const bool in = r < a.rows && c < a.cols;
    const uint16_t *src = static_cast<const uint16_t *>(a.x) + (in ? r * a.cols + c : 0);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(st + 256 * row + 16 * ch)),
                 "l"(src), "r"(in ? 16 : 0));
  }
  asm volatile("cp.async.commit_group;\n" ::);
}

__global__ void __launch_bounds__(SQ_THREADS, 2) k_pipe(Args a) {
  extern __shared__ __align__(16) uint8_t smem[];
  const SqSmem sm = sq_smem(smem + 2 * PIPE_IN);
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int tr = 32 * (warp & 3) + 8 * (lane >> 3), tc = 64 * (warp >> 2) + 8 * (lane & 7);
  const uint32_t ntiles = (uint32_t)a.ntiles;
  int stage = 0;
  if (blockIdx.x < ntiles) pipe_load(a, blockIdx.x, smem, t);
  for (uint32_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
    int64_t r0, c0;
    sq_origin(a, tile, r0, c0);
    if (tile + gridDim.x < ntiles) {
      pipe_load(a, tile + gridDim.x, smem + (stage ^ 1) * PIPE_IN, t);
      asm volatile("cp.async.wait_group 1;\n" ::);
    } else {
      asm volatile("cp.async.wait_group 0;\n" ::);
    }
    __syncthreads();
    uint4 x[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
      x[i] = *reinterpret_cast<const uint4 *>(smem + stage * PIPE_IN + 256 * (tr + i) + 2 * tc);
    sq_encode(a, x, tr, tc, sm);
    __syncthreads();
    sq_store_codes<0>(a, t, r0, c0, sm);
    sq_store_scales<0>(a, t, tile, r0, c0, sm, 3);
    stage ^= 1;
  }
}

static void launch_pipe(const Args &a0, int, cudaStream_t s) {
  static bool set = false;
  if (!set) {
    CK(cudaFuncSetAttribute(k_pipe, cudaFuncAttributeMaxDynamicSharedMemorySize, PIPE_SMEM));
    set = true;
  }
  Args a = a0;
  sq_tiles(a);
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_pipe, SQ_THREADS, PIPE_SMEM));
  const int64_t g = std::min<int64_t>((int64_t)g_sms * per_sm, a.ntiles);
  k_pipe<<<(unsigned)g, SQ_THREADS, PIPE_SMEM, s>>>(a);
}

/* ---- k_cl: clusters of 8 tiles along a tile row gather their row scales in distributed shared
 * memory and store them as 32-byte runs (one sector per row and cluster) ------------------------
 */
__global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(SQ_THREADS, 2) k_cl(Args a) {
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  extern __shared__ __align__(16) uint8_t smem[];
  const SqSmem sm = sq_smem(smem);
  uint32_t *xs = reinterpret_cast<uint32_t *>(smem + SQ_SMEM); /* [16 rows][8 ranks] */
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int tr = 32 * (warp & 3) + 8 * (lane >> 3), tc = 64 * (warp >> 2) + 8 * (lane & 7);
  /* the grid's tile rows are padded to a multiple of 8 tiles; padding blocks only take part in
   * the cluster barrier */
  const uint32_t tiles_c8 = ((uint32_t)a.tiles_c + 7u) & ~7u;
  const uint32_t ty = blockIdx.x / tiles_c8, tx = blockIdx.x - ty * tiles_c8;
  const int rank = (int)cl.block_rank();
  const int64_t r0 = (int64_t)ty * SQ, c0 = (int64_t)tx * SQ;
  if (tx < (uint32_t)a.tiles_c) {
    uint4 x[8];
    sq_load(a, r0 + tr, c0 + tc, x);
    sq_encode(a, x, tr, tc, sm);
    __syncthreads();
    sq_store_codes<0>(a, t, r0, c0, sm);
    sq_store_scales<0>(a, t, 0, r0, c0, sm, 2);
    if (t < SQ) { /* row t's 4 scale bytes go to rank t / 16 */
      const uint32_t w = (uint32_t)sm.rs[t] | (uint32_t)sm.rs[SQ + t] << 8 |
                         (uint32_t)sm.rs[2 * SQ + t] << 16 | (uint32_t)sm.rs[3 * SQ + t] << 24;
      cl.map_shared_rank(xs, t >> 4)[(t & 15) * 8 + rank] = w;
    }
  }
  cl.sync();
  /* this rank's 16 rows of the cluster's row scales, 16 bytes (4 tiles) per thread */
  if (t < 32) {
    const int i = t >> 1, half = t & 1;
    const int64_t row = r0 + 16 * rank + i;
    const uint32_t tx0 = tx - rank + 4 * half;
    if (row < a.rows && tx0 < (uint32_t)a.tiles_c) {
      uint8_t *d = a.scale_inv + row * (a.cols / 32) + 4 * (int64_t)tx0;
      const uint32_t *src = xs + i * 8 + 4 * half;
      if (tx0 + 4 <= (uint32_t)a.tiles_c && ((uintptr_t)d & 15u) == 0)
        *reinterpret_cast<uint4 *>(d) = make_uint4(src[0], src[1], src[2], src[3]);
      else
        for (int b = 0; b < 16 && 32 * (4 * (int64_t)tx0 + b) < a.cols; b++)
          d[b] = (uint8_t)(src[b >> 2] >> (8 * (b & 3)));
    }
  }
}

static void launch_cl(const Args &a0, int, cudaStream_t s) {
  Args a = a0;
  sq_tiles(a);
  const int64_t g = a.tiles_r * ((a.tiles_c + 7) / 8 * 8);
  k_cl<<<(unsigned)g, SQ_THREADS, SQ_SMEM + 16 * 8 * 4, s>>>(a);
}
