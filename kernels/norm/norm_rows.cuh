/* What the norm kernels share (kernels/norm/norm.cu, kernels/norm/norm_quantize.cu): the row split
 * of kRowThreads threads whose order every row sum follows (norm_cpu.c row_sum repeats it), its
 * block reduction, and the row-resident kernels' chunk loads.
 * No include guard, and everything in an unnamed namespace: spec/native/sim_norm.cpp includes both
 * .cu files into one translation unit, each inside a namespace of its own (the two headers
 * below have guards). */
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"
#include "common/reduce.cuh"

namespace {

using namespace lkc;

constexpr int kRowThreads = 256, kRowWarps = kRowThreads / 32;
constexpr int kResident = 32; /* the most row elements a thread of a row-resident kernel holds */

/* The sums of the block's threads, N at a time, in block_sum's tree (kernels/common/reduce.cuh:
 * a butterfly per warp, the warps in order from 0.0). fin(t, lead) then runs in warp 0 alone
 * and stores in red.out (lead: lane 0) what every thread reads after the return. The next call
 * may follow at once: part is rewritten only after everyone passed this call's last barrier. */
struct RowRed {
  float part[2][kRowWarps];
  float out[2];
};

/* both reductions' first level: each warp's sums (warp_sum's butterfly) into part[n][warp],
 * then the barrier after which every warp's are there */
template <int N>
__device__ __forceinline__ void warp_parts(float (&v)[N], float (&part)[2][kRowWarps]) {
  static_assert(N >= 1 && N <= 2, "one or two sums a call");
#pragma unroll
  for (int n = 0; n < N; n++)
    v[n] = warp_sum(v[n]);
  if ((threadIdx.x & 31) == 0) {
#pragma unroll
    for (int n = 0; n < N; n++)
      part[n][threadIdx.x >> 5] = v[n];
  }
  __syncthreads();
}

/* the warps' sums in order from 0.0 */
template <int N>
__device__ __forceinline__ void add_parts(const float (&part)[2][kRowWarps], float (&t)[N]) {
#pragma unroll
  for (int n = 0; n < N; n++) {
    t[n] = 0.0f;
#pragma unroll
    for (int w = 0; w < kRowWarps; w++)
      t[n] = fadd(t[n], part[n][w]);
  }
}

template <int N, class F>
__device__ __forceinline__ void row_reduce(float (&v)[N], RowRed &red, F &&fin) {
  warp_parts<N>(v, red.part);
  if (threadIdx.x < 32) {
    float t[N];
    add_parts<N>(red.part, t);
    fin(t, threadIdx.x == 0);
  }
  __syncthreads();
}

/* row_reduce's sums with each total left in every thread, after one barrier instead of two:
 * every warp adds the warps' sums itself (the same adds in the same order, so the same bits in
 * every thread). Consecutive calls alternate between the two halves of parts (half, uniform over
 * the block, flips each call): a thread reads call k's half before it arrives at call k + 1's
 * barrier, which the writers of call k + 2 have passed. Taken by the backward, whose dx waits on
 * each row's sums (the LayerNorm backward 0.94x with it, docs/lab/). The forward keeps
 * row_reduce: there every warp would then take the statistics' divisions and square roots, and
 * parts would grow RowRed, which the fused two-copy casts' shared memory cannot spare (a third
 * block an SM). */
using RowParts = float[2][2][kRowWarps]; /* [half][sum][warp] */

template <int N>
__device__ __forceinline__ void row_reduce_all(float (&v)[N], RowParts &parts, int &half) {
  float(&part)[2][kRowWarps] = parts[half];
  half ^= 1;
  warp_parts<N>(v, part);
  add_parts<N>(part, v);
}

/* Rows a block of a row-resident kernel takes so that blocks_per_sm blocks an SM cover the rows
 * in one wave: an even share (the two-row loops), at least least rows */
inline int64_t wave_share_rows(int64_t rows, int64_t blocks_per_sm, int64_t least) {
  const int64_t per = cdiv<int64_t>(rows, blocks_per_sm * static_cast<int64_t>(lkc::num_sms()));
  return imax<int64_t>(least, per + (per & 1));
}

template <int V> __device__ __forceinline__ int64_t col(int j) {
  return (static_cast<int64_t>(threadIdx.x) + static_cast<int64_t>(kRowThreads) * j) * V;
}

/* V elements as loaded, unpacked later: the next row's loads then do not hold the warp at an
 * unpack before the current row's work is issued. V > 1 is one 16-byte vector. */
template <int DT, int V> struct Raw { uint4 q; };
template <int DT> struct Raw<DT, 1> { float f; };

/* the V elements from element i as loaded (load_row's, at a chunk of the caller's choosing) */
template <int DT, int V> __device__ __forceinline__ Raw<DT, V> raw_at(const void *p, int64_t i) {
  Raw<DT, V> r;
  if constexpr (V == 1) {
    r.f = ld<DT>(p, i);
  } else {
    constexpr int esz = DT == LUTRA_F32 ? 4 : 2;
    r.q = *reinterpret_cast<const uint4 *>(static_cast<const char *>(p) + i * esz);
  }
  return r;
}

/* FULL (the kernels' template flag): every thread's NC chunks lie inside the row (hidden is
 * NC V kRowThreads), so no column check is compiled */
template <int DT, int V, int NC, bool FULL = false>
__device__ __forceinline__ void load_row(const void *p, int64_t o, int64_t h, Raw<DT, V> (&r)[NC]) {
#pragma unroll
  for (int j = 0; j < NC; j++) {
    const int64_t c = col<V>(j);
    if (!FULL && c >= h) continue;
    if constexpr (V == 1) {
      r[j].f = ld<DT>(p, o + c);
    } else {
      constexpr int esz = DT == LUTRA_F32 ? 4 : 2;
      static_assert(V * esz == 16, "a raw chunk is one 16-byte vector");
      r[j].q = *reinterpret_cast<const uint4 *>(static_cast<const char *>(p) + (o + c) * esz);
    }
  }
}

template <int DT, int V> __device__ __forceinline__ void unraw(const Raw<DT, V> &r, float (&f)[V]) {
  if constexpr (V == 1) {
    f[0] = r.f;
  } else if constexpr (DT == LUTRA_F32) {
    f[0] = __uint_as_float(r.q.x);
    f[1] = __uint_as_float(r.q.y);
    f[2] = __uint_as_float(r.q.z);
    f[3] = __uint_as_float(r.q.w);
  } else {
    unpack2<DT>(r.q.x, f[0], f[1]);
    unpack2<DT>(r.q.y, f[2], f[3]);
    unpack2<DT>(r.q.z, f[4], f[5]);
    unpack2<DT>(r.q.w, f[6], f[7]);
  }
}

/* whether gamma (and beta, when read) take 16-byte vector loads: V > 1 columns start at
 * multiples of V, so both pointers' alignment decides */
template <int V> __device__ __forceinline__ bool params_vec(const lutra_norm_args &a, bool beta) {
  return V > 1 && (reinterpret_cast<uintptr_t>(a.gamma) & 15) == 0 &&
         (!beta || (reinterpret_cast<uintptr_t>(a.beta) & 15) == 0);
}

/* gamma (with zero_centered_gamma's + 1) and, when beta, beta at the V columns from c (zeros
 * past the row's end) */
template <int PDT, int V, bool FULL = false>
__device__ __forceinline__ void load_param_chunk(const lutra_norm_args &a, bool beta, bool vec,
                                                 int64_t c, float (&g)[V], float (&b)[V]) {
#pragma unroll
  for (int k = 0; k < V; k++)
    g[k] = b[k] = 0.0f;
  if (!FULL && c >= a.hidden) return;
  if (vec) {
    ldv<PDT, V>(a.gamma, c, g);
    if (beta) ldv<PDT, V>(a.beta, c, b);
  } else {
#pragma unroll
    for (int k = 0; k < V; k++) {
      g[k] = ld<PDT>(a.gamma, c + k);
      if (beta) b[k] = ld<PDT>(a.beta, c + k);
    }
  }
  if (a.zero_centered_gamma) {
#pragma unroll
    for (int k = 0; k < V; k++)
      g[k] = fadd(g[k], 1.0f);
  }
}

/* the forward's formula on V values in place: y = (x - mean) * rstd * g (+ b) */
template <int V>
__device__ __forceinline__ void normalize(float (&x)[V], float mean, float rstd,
                                          const float (&g)[V], const float (&b)[V], bool beta) {
#pragma unroll
  for (int k = 0; k < V; k++) {
    float y = fmul(fmul(fsub(x[k], mean), rstd), g[k]);
    if (beta) y = fadd(y, b[k]);
    x[k] = y;
  }
}

/* the same at all of this thread's chunks, for kernels that keep them in registers */
template <int PDT, int V, int NC>
__device__ __forceinline__ void load_params(const lutra_norm_args &a, bool beta, float (&g)[NC][V],
                                            float (&b)[NC][V]) {
  const bool vec = params_vec<V>(a, beta);
#pragma unroll
  for (int j = 0; j < NC; j++)
    load_param_chunk<PDT, V>(a, beta, vec, col<V>(j), g[j], b[j]);
}

/* 1 / sqrt(var + eps) of a row whose squared deviations sum to t (each step rounded) */
__device__ __forceinline__ float row_rstd(const lutra_norm_args &a, float t) {
  return fdiv(1.0f, fsqrt(fadd(fdiv(t, static_cast<float>(a.hidden)), a.eps)));
}

/* row r's statistics into a.mean (LayerNorm) and a.rstd where given */
__device__ __forceinline__ void keep_stats(const lutra_norm_args &a, int64_t r, float mean,
                                           float rstd) {
  if (a.mean && !a.rms) a.mean[r] = mean;
  if (a.rstd) a.rstd[r] = rstd;
}

/* row_reduce's fin for row r's sum of squares: its rstd into red.out[1], its statistics kept */
__device__ __forceinline__ auto rstd_fin(const lutra_norm_args &a, int64_t r, float mean,
                                         RowRed &red) {
  return [&a, r, mean, &red](float(&t)[1], bool lead) {
    const float rs = row_rstd(a, t[0]);
    if (!lead) return;
    red.out[1] = rs;
    keep_stats(a, r, mean, rs);
  };
}

/* A row sum's first level, a thread's own elements (the chunks col<V>(j), in column order, fadd:
 * no contraction), then row_reduce's tree; norm_cpu.c row_sum adds in the same order. The
 * deviations are taken from the mean as rounded to f32, the one y uses. */
template <int V, int NC, bool FULL = false>
__device__ __forceinline__ float thread_sum(const lutra_norm_args &a, const float (&x)[NC][V]) {
  float p = 0.0f;
#pragma unroll
  for (int j = 0; j < NC; j++)
    if (FULL || col<V>(j) < a.hidden) {
#pragma unroll
      for (int k = 0; k < V; k++)
        p = fadd(p, x[j][k]);
    }
  return p;
}

/* x - 0.0 is x: RMSNorm's squares skip the subtraction */
template <int V, int NC, bool FULL = false>
__device__ __forceinline__ float thread_squares(const lutra_norm_args &a, const float (&x)[NC][V],
                                                float mean) {
  float p = 0.0f;
#pragma unroll
  for (int j = 0; j < NC; j++)
    if (FULL || col<V>(j) < a.hidden) {
#pragma unroll
      for (int k = 0; k < V; k++) {
        const float d = a.rms ? x[j][k] : fsub(x[j][k], mean);
        p = fadd(p, fmul(d, d));
      }
    }
  return p;
}

/* mean and rstd of row r held as x (the chunks col<V>(j)) in lk_layernorm_forward's order and
 * roundings; warp 0 also stores them in a.mean[r] / a.rstd[r] when those are given. */
template <int V, int NC>
__device__ __forceinline__ void resident_stats(const lutra_norm_args &a, int64_t r,
                                               const float (&x)[NC][V], RowRed &red, float &mean,
                                               float &rstd) {
  const float hf = static_cast<float>(a.hidden);
  mean = 0.0f;
  if (!a.rms) {
    float s[1] = {thread_sum<V, NC>(a, x)};
    row_reduce<1>(s, red, [&](float(&t)[1], bool lead) {
      if (lead) red.out[0] = fdiv(t[0], hf);
    });
    mean = red.out[0];
  }
  float q[1] = {thread_squares<V, NC>(a, x, mean)};
  row_reduce<1>(q, red, rstd_fin(a, r, mean, red));
  rstd = red.out[1];
}

/* resident_stats for rows r and r + 1 at once (the second only when two): both rows' sums in one
 * block reduction (row_reduce<2>: each row's tree as alone, so the same bits), half the barriers
 * a row. */
template <int V, int NC, bool FULL>
__device__ __forceinline__ void resident_stats2(const lutra_norm_args &a, int64_t r, bool two,
                                                const float (&x)[2][NC][V], RowRed &red,
                                                float (&mean)[2], float (&rstd)[2]) {
  const float hf = static_cast<float>(a.hidden);
  mean[0] = mean[1] = 0.0f;
  if (!a.rms) {
    float s[2] = {thread_sum<V, NC, FULL>(a, x[0]), thread_sum<V, NC, FULL>(a, x[1])};
    row_reduce<2>(s, red, [&](float(&t)[2], bool lead) {
      if (!lead) return;
      red.out[0] = fdiv(t[0], hf);
      red.out[1] = fdiv(t[1], hf);
    });
    mean[0] = red.out[0];
    mean[1] = red.out[1];
  }
  float q[2] = {thread_squares<V, NC, FULL>(a, x[0], mean[0]),
                thread_squares<V, NC, FULL>(a, x[1], mean[1])};
  row_reduce<2>(q, red, [&](float(&t)[2], bool lead) {
    const float rs[2] = {row_rstd(a, t[0]), row_rstd(a, t[1])};
    if (!lead) return;
    red.out[0] = rs[0];
    red.out[1] = rs[1];
    keep_stats(a, r, mean[0], rs[0]);
    if (two) keep_stats(a, r + 1, mean[1], rs[1]);
  });
#pragma unroll
  for (int i = 0; i < 2; i++)
    rstd[i] = red.out[i];
}

/* Rows r and r + 1 (the second only when two) as loaded in c0 / c1, normalized: both rows'
 * statistics (resident_stats2), then per chunk of V columns from c, gamma and beta read once (L1
 * hits) for both rows, and f(r, c, y) with y the forward's output at row r (in f32, not yet
 * rounded). vec: params_vec, which the loops below take once, not per pair. */
template <int DT, int PDT, int V, int NC, bool FULL, class F>
__device__ __forceinline__ void normalized_pair(const lutra_norm_args &a, int64_t r, bool two,
                                                bool vec, const Raw<DT, V> (&c0)[NC],
                                                const Raw<DT, V> (&c1)[NC], RowRed &red, F &&f) {
  const int64_t h = a.hidden;
  const bool beta = !a.rms;
  float x[2][NC][V], mean[2], rstd[2];
#pragma unroll
  for (int j = 0; j < NC; j++) {
    unraw<DT, V>(c0[j], x[0][j]);
    unraw<DT, V>(c1[j], x[1][j]);
  }
  resident_stats2<V, NC, FULL>(a, r, two, x, red, mean, rstd);
#pragma unroll
  for (int j = 0; j < NC; j++) {
    const int64_t c = col<V>(j);
    if (!FULL && c >= h) continue;
    float g[V], b[V];
    load_param_chunk<PDT, V, FULL>(a, beta, vec, c, g, b);
#pragma unroll
    for (int i = 0; i < 2; i++) {
      if (i == 1 && !two) break;
      normalize<V>(x[i][j], mean[i], rstd[i], g, b, beta);
      f(r + i, c, x[i][j]);
    }
  }
}

/* A row-resident loop over rows r0 .. r1 two at a time (normalized_pair): the next two rows'
 * loads are issued before the current two's statistics, so twice the bytes of a one-row loop
 * are in flight. */
template <int DT, int PDT, int V, int NC, bool FULL, class F>
__device__ __forceinline__ void normalized_pairs(const lutra_norm_args &a, int64_t r0, int64_t r1,
                                                 RowRed &red, F &&f) {
  const int64_t h = a.hidden;
  const bool vec = params_vec<V>(a, !a.rms);
  Raw<DT, V> c0[NC] = {}, c1[NC] = {}, n0[NC] = {}, n1[NC] = {};
  if (r0 < r1) load_row<DT, V, NC, FULL>(a.x, r0 * h, h, c0);
  if (r0 + 1 < r1) load_row<DT, V, NC, FULL>(a.x, (r0 + 1) * h, h, c1);
  for (int64_t r = r0; r < r1; r += 2) {
    if (r + 2 < r1) load_row<DT, V, NC, FULL>(a.x, (r + 2) * h, h, n0);
    if (r + 3 < r1) load_row<DT, V, NC, FULL>(a.x, (r + 3) * h, h, n1);
    normalized_pair<DT, PDT, V, NC, FULL>(a, r, r + 1 < r1, vec, c0, c1, red, f);
#pragma unroll
    for (int j = 0; j < NC; j++) {
      c0[j] = n0[j];
      c1[j] = n1[j];
    }
  }
}

/* The same over n rows, the loop's i-th row being row_of(i) (rows 2k and 2k + 1 of the loop must
 * be consecutive rows of x), and after each pair (i, i + 1) pair_done(i), uniform over the
 * block, while the next pair's loads are in flight. (The plain range loop above is kept apart:
 * through this one, the rowwise fused kernel measured slower, docs/lab/.) */
template <int DT, int PDT, int V, int NC, bool FULL, class M, class F, class G>
__device__ __forceinline__ void normalized_pairs_of(const lutra_norm_args &a, int64_t n, M &&row_of,
                                                    RowRed &red, F &&f, G &&pair_done) {
  const int64_t h = a.hidden;
  const bool vec = params_vec<V>(a, !a.rms);
  Raw<DT, V> c0[NC] = {}, c1[NC] = {}, n0[NC] = {}, n1[NC] = {};
  if (0 < n) load_row<DT, V, NC, FULL>(a.x, row_of(0) * h, h, c0);
  if (1 < n) load_row<DT, V, NC, FULL>(a.x, (row_of(0) + 1) * h, h, c1);
  for (int64_t i = 0; i < n; i += 2) {
    if (i + 2 < n) load_row<DT, V, NC, FULL>(a.x, row_of(i + 2) * h, h, n0);
    if (i + 3 < n) load_row<DT, V, NC, FULL>(a.x, (row_of(i + 2) + 1) * h, h, n1);
    normalized_pair<DT, PDT, V, NC, FULL>(a, row_of(i), i + 1 < n, vec, c0, c1, red, f);
    pair_done(i); /* before the hand-over below, which waits for the next pair's loads */
#pragma unroll
    for (int j = 0; j < NC; j++) {
      c0[j] = n0[j];
      c1[j] = n1[j];
    }
  }
}

/* row r of a row-resident loop over rows .. r1: the next row's loads issued into nxt first (they
 * are in flight during this row's reductions), then row r, as loaded in cur, unpacked into x
 * with its mean and rstd */
template <int DT, int V, int NC>
__device__ __forceinline__ void
resident_row(const lutra_norm_args &a, int64_t r, int64_t r1, const Raw<DT, V> (&cur)[NC],
             Raw<DT, V> (&nxt)[NC], float (&x)[NC][V], RowRed &red, float &mean, float &rstd) {
  if (r + 1 < r1) load_row<DT, V, NC>(a.x, (r + 1) * a.hidden, a.hidden, nxt);
#pragma unroll
  for (int j = 0; j < NC; j++)
    unraw<DT, V>(cur[j], x[j]);
  resident_stats<V, NC>(a, r, x, red, mean, rstd);
}

/* f(std::integral_constant<int, NC>()) for rows of h columns held NC chunks of V a thread by
 * the row-resident kernels (NC 1, 2, 4 or 8, at most kResident elements a thread), or R() when
 * the rows are wider */
/* whether rows of h columns fill every thread's NC chunks of V exactly (the kernels' FULL) */
template <int V, int NC> bool rows_full(int64_t h) {
  return h == static_cast<int64_t>(NC) * V * kRowThreads;
}

template <int V, class R, class F> R with_resident_chunks(int64_t h, F &&f) {
  const int64_t nc = cdiv<int64_t>(h, static_cast<int64_t>(kRowThreads) * V);
  if (nc <= 1) return f(std::integral_constant<int, 1>());
  if (nc <= 2) return f(std::integral_constant<int, 2>());
  if (nc <= 4) return f(std::integral_constant<int, 4>());
  if constexpr (8 * V <= kResident)
    if (nc <= 8) return f(std::integral_constant<int, 8>());
  return R();
}

/* The row statistics alone, mean and rstd into a.mean / a.rstd (resident_stats: the forward's
 * bits), kStatRows rows a block, for the fused norm + block-scaled casts: their tile kernel
 * (kernels/norm/norm_quantize.cu) then reads them instead of summing every row in one warp, whose
 * per-row work bounds it. skip: TransformerEngine's noop flag, as the quantizers'. */
constexpr int kStatRows = 4;

template <int DT, int V, int NC>
__global__ void __launch_bounds__(kRowThreads, NC *V <= 16 ? 4 : 2)
    k_row_stats(lutra_norm_args a, const int32_t *skip) {
  if (skip && *skip) return;
  __shared__ RowRed red;
  const int64_t h = a.hidden, r0 = static_cast<int64_t>(blockIdx.x) * kStatRows;
  const int64_t r1 = imin<int64_t>(a.rows, r0 + kStatRows);
  Raw<DT, V> cur[NC] = {}, nxt[NC] = {};
  if (r0 < r1) load_row<DT, V, NC>(a.x, r0 * h, h, cur);
  for (int64_t r = r0; r < r1; r++) {
    float x[NC][V], mean, rstd;
    resident_row<DT, V, NC>(a, r, r1, cur, nxt, x, red, mean, rstd);
#pragma unroll
    for (int j = 0; j < NC; j++)
      cur[j] = nxt[j];
  }
}

/* norm_fwd's statistics of row o (kernels/norm/norm.cu) computed by one warp: lane l stands for
 * norm_fwd's threads l, l + 32, ..., l + 224 (kRowThreads of them in all), keeps each one's
 * f32 sum over its chunks in that thread's order, and adds the virtual threads' warp sums in
 * block_sum's order (warp_sum per group of 32, then the groups from 0.0 in order): the same
 * mean and rstd bits as lk_layernorm_forward, without a block barrier per row. The chunk index
 * j runs outermost so that a lane has kGroups loads in flight at a time. */
template <int DT, int V>
__device__ __forceinline__ float warp_row_sum(const lutra_norm_args &a, int64_t o, int lane,
                                              float mean, bool squares) {
  constexpr int G = kRowThreads / 32;
  const int64_t h = a.hidden;
  float s[G];
#pragma unroll
  for (int g = 0; g < G; g++)
    s[g] = 0.0f;
  for (int64_t j0 = static_cast<int64_t>(lane) * V; j0 < h; j0 += kRowThreads * V) {
    float v[G][V] = {};
#pragma unroll
    for (int g = 0; g < G; g++)
      if (j0 + 32 * g * V < h) ldv<DT, V>(a.x, o + j0 + 32 * g * V, v[g]);
#pragma unroll
    for (int g = 0; g < G; g++) {
      if (j0 + 32 * g * V >= h) continue;
#pragma unroll
      for (int k = 0; k < V; k++) {
        if (squares) {
          const float d = a.rms ? v[g][k] : fsub(v[g][k], mean);
          s[g] = fadd(s[g], fmul(d, d));
        } else {
          s[g] = fadd(s[g], v[g][k]);
        }
      }
    }
  }
  float r = 0.0f;
#pragma unroll
  for (int g = 0; g < G; g++)
    r = fadd(r, warp_sum(s[g]));
  return r;
}

template <int DT, int V>
__device__ __forceinline__ void row_stats(const lutra_norm_args &a, int64_t o, int lane,
                                          float &mean, float &rstd) {
  const float h = static_cast<float>(a.hidden);
  mean = a.rms ? 0.0f : fdiv(warp_row_sum<DT, V>(a, o, lane, 0.0f, false), h);
  rstd = row_rstd(a, warp_row_sum<DT, V>(a, o, lane, mean, true));
}

/* row_stats for rows of at most NC chunks a lane (32 NC V columns): the chunks are loaded once
 * and both sums taken from registers, the groups without columns skipped (their warp sums are
 * 0.0, and adding 0.0 to a sum that started at +0.0 changes nothing): the same bits with one
 * read of the row and no shuffles for empty groups. x[g] is lane's chunk l + 32 g (zeros where
 * it lies past the row), kept for a caller that needs the values again. */
template <int DT, int V, int NC>
__device__ __forceinline__ void row_stats_resident(const lutra_norm_args &a, int64_t o, int lane,
                                                   float (&x)[NC][V], float &mean, float &rstd) {
  const int64_t h = a.hidden;
#pragma unroll
  for (int g = 0; g < NC; g++) {
    const int64_t j = (static_cast<int64_t>(lane) + 32 * g) * V;
    if (j < h) {
      ldv<DT, V>(a.x, o + j, x[g]);
    } else {
#pragma unroll
      for (int k = 0; k < V; k++)
        x[g][k] = 0.0f;
    }
  }
  float r = 0.0f;
#pragma unroll
  for (int g = 0; g < NC; g++) {
    if (32 * g * V >= h) break; /* uniform across the warp */
    float s = 0.0f;
    if ((static_cast<int64_t>(lane) + 32 * g) * V < h)
#pragma unroll
      for (int k = 0; k < V; k++)
        s = fadd(s, x[g][k]);
    r = fadd(r, warp_sum(s));
  }
  mean = a.rms ? 0.0f : fdiv(r, static_cast<float>(h));
  r = 0.0f;
#pragma unroll
  for (int g = 0; g < NC; g++) {
    if (32 * g * V >= h) break;
    float s = 0.0f;
    if ((static_cast<int64_t>(lane) + 32 * g) * V < h)
#pragma unroll
      for (int k = 0; k < V; k++) {
        const float d = a.rms ? x[g][k] : fsub(x[g][k], mean);
        s = fadd(s, fmul(d, d));
      }
    r = fadd(r, warp_sum(s));
  }
  rstd = row_rstd(a, r);
}

/* k_row_stats for rows narrower than one chunk of V a thread: a warp a row (row_stats_resident,
 * the same bits), kRowWarps rows a block. k_row_stats's block per row leaves most of its threads
 * idle there (96 of 256 at 768 columns) and pays a block reduction per row. */
template <int DT, int V, int NC>
__global__ void __launch_bounds__(kRowThreads)
    k_row_stats_warps(lutra_norm_args a, const int32_t *skip) {
  if (skip && *skip) return;
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
  if (r >= a.rows) return;
  float x[NC][V], mean, rstd;
  row_stats_resident<DT, V, NC>(a, r * a.hidden, lane, x, mean, rstd);
  if (lane == 0) keep_stats(a, r, mean, rstd);
}

/* f(std::integral_constant<int, NC>) for a narrow row's chunks a lane (1, 2, 4 or 8: h below
 * kRowThreads V columns takes at most 8) */
template <int V, class R, class F> R with_lane_chunks(int64_t h, F &&f) {
  const int64_t nc = cdiv<int64_t>(h, 32 * V);
  if (nc <= 1) return f(std::integral_constant<int, 1>());
  if (nc <= 2) return f(std::integral_constant<int, 2>());
  if (nc <= 4) return f(std::integral_constant<int, 4>());
  return f(std::integral_constant<int, 8>());
}

/* whether row_stats_kernel(h) is the warp-a-row kernel */
template <int V> bool row_stats_by_warps(int64_t h) {
  return h < static_cast<int64_t>(kRowThreads) * V;
}

/* rows a block of row_stats_kernel(h) takes */
template <int V> int64_t row_stats_rows(int64_t h) {
  return row_stats_by_warps<V>(h) ? kRowWarps : kStatRows;
}

/* The row statistics kernel for rows of h columns (k_row_stats_warps for narrow rows, else
 * k_row_stats), or nullptr where they exceed kResident elements a thread */
template <int DT, int V>
auto row_stats_kernel(int64_t h) -> void (*)(lutra_norm_args, const int32_t *) {
  using K = void (*)(lutra_norm_args, const int32_t *);
  if (row_stats_by_warps<V>(h))
    return with_lane_chunks<V, K>(
        h, [](auto nc) { return k_row_stats_warps<DT, V, decltype(nc)::value>; });
  return with_resident_chunks<V, K>(
      h, [](auto nc) { return k_row_stats<DT, V, decltype(nc)::value>; });
}

} // namespace
