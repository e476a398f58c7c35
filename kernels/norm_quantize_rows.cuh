/* The per-tensor fused norm + FP8 kernels that keep rows resident (kernels/norm_quantize.cu's
 * lk_norm_quantize picks them for rows of up to kResident elements a thread). Included by
 * norm_quantize.cu once its Params and code helpers are defined; no include guard
 * (tools/sim_norm.cpp includes the .cu inside a namespace of its own). */

namespace {

/* For rows of up to kResident elements a thread (hidden <= 8192 for 16-bit inputs): a block of
 * kRowThreads threads does kQRows consecutive rows with norm_fwd_rows' split (kernels/norm.cu;
 * resident_stats: the same mean and rstd bits), so x is read once and the next rows' loads are
 * in flight during the current ones' reductions. The rowwise codes
 * leave from registers (a warp's stores are whole 128-byte lines); the columnwise codes are
 * staged in shared memory as [kQRows][hidden] bytes and leave as one kQRows-byte run per column
 * (whole 16-byte stores when rows is a multiple of kQRows). */
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

/* y's chunk as stored (rounded into the activation dtype) into v, its max|.| into m, and its
 * codes to row (and stage), when codes are asked for */
template <int DT, int OD, int V>
__device__ __forceinline__ void emit_chunk(const float (&y)[V], float s, bool codes, uint8_t *row,
                                           bool row_vec, uint8_t *stage, float &m) {
  float v[V];
#pragma unroll
  for (int k = 0; k < V; k++) {
    v[k] = round_to<DT>(y[k]);
    m = fmaxf(m, fabsf(v[k]));
  }
  if (!codes) return;
  if constexpr (V == 1) {
    const uint8_t q = code<OD>(v[0], s);
    if (row) *row = q;
    if (stage) *stage = q;
  } else {
    uint32_t w[V / 4];
    code_words<OD, V>(v, s, w);
    if (row) store_codes<V>(row, w, row_vec);
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

/* The columnwise codes staged ([kQRows][hidden] bytes of dynamic shared memory): the rows one
 * after the other, parameters held, two blocks an SM (the staged codes bound the blocks an SM
 * anyway; held parameters, and two blocks rather than three with fewer registers, measured faster
 * side by side: BENCHMARKS.md) */
template <int DT, int PDT, int OD, int V, int NC>
__global__ void __launch_bounds__(kRowThreads, NC *V <= 16 ? 2 : 1)
    k_norm_quantize_staged(Params p) {
  if (p.skip && *p.skip) return; /* uniform: before any barrier */
  __shared__ RowRed red;
  __shared__ float fred[32];
  uint8_t *staged = lkc::dyn_smem();
  const lutra_norm_args &a = p.n;
  const int64_t h = a.hidden, rows = a.rows, r0 = static_cast<int64_t>(blockIdx.x) * kQRows;
  const int64_t r1 = imin<int64_t>(rows, r0 + kQRows);
  const bool codes = !p.amax_pass;
  const float s = codes ? *p.scale : 1.0f;
  const bool beta = !a.rms;
  float g[NC][V], b[NC][V];
  load_params<PDT, V, NC>(a, beta, g, b);
  Raw<DT, V> cur[NC] = {}, nxt[NC] = {};
  if (r0 < r1) load_row<DT, V, NC>(a.x, r0 * h, h, cur);
  float m = -INFINITY;
  const bool row_vec = (reinterpret_cast<uintptr_t>(p.data) & (V == 8 ? 7 : 3)) == 0;
  for (int64_t r = r0; r < r1; r++) {
    float x[NC][V], mean, rstd;
    resident_row<DT, V, NC>(a, r, r1, cur, nxt, x, red, mean, rstd);
#pragma unroll
    for (int j = 0; j < NC; j++) {
      const int64_t c = col<V>(j);
      if (c >= h) continue;
      normalize<V>(x[j], mean, rstd, g[j], b[j], beta);
      if (a.y) stv<DT, V>(a.y, r * h + c, x[j]);
      emit_chunk<DT, OD, V>(x[j], s, codes, p.data ? p.data + r * h + c : nullptr, row_vec,
                            staged + (r - r0) * h + c, m);
    }
#pragma unroll
    for (int j = 0; j < NC; j++)
      cur[j] = nxt[j];
  }
  if (codes) {
    __syncthreads();
    const int64_t n = r1 - r0;
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
          *reinterpret_cast<uint4 *>(p.col_data + (c + k) * rows + r0) =
              make_uint4(o[0], o[1], o[2], o[3]);
        }
      }
    } else {
      for (int64_t e = threadIdx.x; e < n * h; e += kRowThreads) {
        const int64_t c = e / n, i = e % n;
        p.col_data[c * rows + r0 + i] = staged[i * h + c];
      }
    }
  }
  finish_rows(p, m, fred, s);
}

/* Rowwise codes only (or current scaling's amax pass): two rows at a time (normalized_pairs),
 * gamma and beta read per chunk (L1 hits), p.pair_rows rows a block: as the forward, the rows
 * spread over one wave of blocks (pair_rows_per_block), so no partial last wave and each
 * block's first, unoverlapped loads are paid once per many rows. */
template <int DT, int PDT, int OD, int V, int NC>
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
  normalized_pairs<DT, PDT, V, NC>(a, r0, imin<int64_t>(a.rows, r0 + p.pair_rows), red,
                                   [&](int64_t r, int64_t c, const float(&y)[V]) {
                                     if (a.y) stv<DT, V>(a.y, r * h + c, y);
                                     emit_chunk<DT, OD, V>(y, s, codes,
                                                           codes ? p.data + r * h + c : nullptr,
                                                           row_vec, nullptr, m);
                                   });
  finish_rows(p, m, fred, s);
}

} // namespace
