/* What the norm kernels share (kernels/norm.cu, kernels/norm_quantize.cu): the row split of
 * kRowThreads threads whose order every row sum follows (norm_cpu.c row_sum repeats it), its
 * block reduction, and the row-resident kernels' chunk loads.
 * No include guard, and everything in an unnamed namespace: tools/sim_norm.cpp includes both
 * .cu files into one translation unit, each inside a namespace of its own (the two headers
 * below have guards). */
#include "common.cuh"
#include "ops_common.cuh"

namespace {

using namespace lkops;

constexpr int kRowThreads = 256, kRowWarps = kRowThreads / 32;
constexpr int kResident = 32; /* the most row elements a thread of a row-resident kernel holds */

/* The sums of the block's threads, N at a time, in block_sum's tree (kernels/ops_common.cuh:
 * a butterfly per warp, the warps in order from 0.0). fin(t, lead) then runs in warp 0 alone
 * and stores in red.out (lead: lane 0) what every thread reads after the return. The next call
 * may follow at once: part is rewritten only after everyone passed this call's last barrier. */
struct RowRed {
  double part[4][kRowWarps];
  double out[4];
};

template <int N, class F>
__device__ __forceinline__ void row_reduce(double (&v)[N], RowRed &red, F &&fin) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int n = 0; n < N; n++)
    v[n] = warp_sum(v[n]);
  if (lane == 0) {
#pragma unroll
    for (int n = 0; n < N; n++)
      red.part[n][warp] = v[n];
  }
  __syncthreads();
  if (warp == 0) {
    double t[N];
#pragma unroll
    for (int n = 0; n < N; n++) {
      t[n] = 0.0;
#pragma unroll
      for (int w = 0; w < kRowWarps; w++)
        t[n] += red.part[n][w];
    }
    fin(t, lane == 0);
  }
  __syncthreads();
}

template <int V> __device__ __forceinline__ int64_t col(int j) {
  return (static_cast<int64_t>(threadIdx.x) + static_cast<int64_t>(kRowThreads) * j) * V;
}

/* V elements as loaded, unpacked later: the next row's loads then do not hold the warp at an
 * unpack before the current row's work is issued. V > 1 is one 16-byte vector. */
template <int DT, int V> struct Raw { uint4 q; };
template <int DT> struct Raw<DT, 1> { float f; };

template <int DT, int V, int NC>
__device__ __forceinline__ void load_row(const void *p, int64_t o, int64_t h, Raw<DT, V> (&r)[NC]) {
#pragma unroll
  for (int j = 0; j < NC; j++) {
    const int64_t c = col<V>(j);
    if (c >= h) continue;
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
template <int PDT, int V>
__device__ __forceinline__ void load_param_chunk(const lutra_norm_args &a, bool beta, bool vec,
                                                 int64_t c, float (&g)[V], float (&b)[V]) {
#pragma unroll
  for (int k = 0; k < V; k++)
    g[k] = b[k] = 0.0f;
  if (c >= a.hidden) return;
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

/* 1 / sqrt(var + eps) in double, rounded once */
__device__ __forceinline__ float rstd_of(const lutra_norm_args &a, double var) {
  return static_cast<float>(1.0 / sqrt(var + static_cast<double>(a.eps)));
}

/* A LayerNorm row's mean and biased variance from one pass: the double sums s1 of d = x - shift
 * and s2 of d * d, shift the row's first element (row_shift). The shifted sums lose nothing the
 * f32 statistics keep: (shift - mean)^2 is at most hidden times the variance (the shift is one
 * of the row's elements), so the subtraction below costs about log2(hidden + 1) of double's 53
 * bits. norm_cpu.c ln_moments is the same operations (no FMA). */
__device__ __forceinline__ double ln_moments(const lutra_norm_args &a, double shift, double s1,
                                             double s2, double &mean) {
  const double hd = static_cast<double>(a.hidden), m1 = s1 / hd;
  mean = shift + m1;
  return fmax(0.0, s2 / hd - dmul_rn(m1, m1));
}

/* row r's shift for ln_moments (0 for RMSNorm, which sums x * x unshifted) */
template <int DT> __device__ __forceinline__ float row_shift(const lutra_norm_args &a, int64_t r) {
  return a.rms ? 0.0f : ld<DT>(a.x, r * a.hidden);
}

/* row r's statistics into a.mean (LayerNorm) and a.rstd where given */
__device__ __forceinline__ void keep_stats(const lutra_norm_args &a, int64_t r, double mean_d,
                                           float rstd) {
  if (a.mean && !a.rms) a.mean[r] = static_cast<float>(mean_d);
  if (a.rstd) a.rstd[r] = rstd;
}

/* this thread's share of N rows' sums, xv(i, j, k) the element k of chunk j (col<V>(j)) of row
 * i: LayerNorm's s1 and s2 of row i in v[2i], v[2i + 1]; RMSNorm's sum of squares in v[2i]
 * (the loops twice, not a runtime index: that would put v in local memory) */
template <int N, int V, int NC, class X>
__device__ __forceinline__ void thread_sums(const lutra_norm_args &a, X &&xv,
                                            const float (&shift)[N], double (&v)[2 * N]) {
#pragma unroll
  for (int n = 0; n < 2 * N; n++)
    v[n] = 0.0;
  if (a.rms) {
#pragma unroll
    for (int j = 0; j < NC; j++)
      if (col<V>(j) < a.hidden) {
#pragma unroll
        for (int k = 0; k < V; k++)
#pragma unroll
          for (int i = 0; i < N; i++) {
            const double x = static_cast<double>(xv(i, j, k));
            v[2 * i] += dmul_rn(x, x);
          }
      }
    return;
  }
#pragma unroll
  for (int j = 0; j < NC; j++)
    if (col<V>(j) < a.hidden) {
#pragma unroll
      for (int k = 0; k < V; k++)
#pragma unroll
        for (int i = 0; i < N; i++) {
          const double d = static_cast<double>(xv(i, j, k)) - static_cast<double>(shift[i]);
          v[2 * i] += d;
          v[2 * i + 1] += dmul_rn(d, d);
        }
    }
}

/* mean and rstd of N rows from r (only the first `count` real) from this thread's sums v
 * (thread_sums' layout), in lk_layernorm_forward's order and roundings: all rows' sums in one
 * block reduction (each row's tree as alone, so the same bits); warp 0 also stores them in
 * a.mean / a.rstd where given */
template <int N>
__device__ __forceinline__ void moments_of_sums(const lutra_norm_args &a, int64_t r, int count,
                                                double (&v)[2 * N], const float (&shift)[N],
                                                RowRed &red, float (&mean)[N], float (&rstd)[N]) {
  auto fin = [&](double(&t)[2 * N], bool lead) {
#pragma unroll
    for (int i = 0; i < N; i++) {
      double m = 0.0;
      const double var = a.rms ? t[2 * i] / static_cast<double>(a.hidden)
                               : ln_moments(a, shift[i], t[2 * i], t[2 * i + 1], m);
      const float rs = rstd_of(a, var);
      if (!lead) continue;
      red.out[2 * i] = m;
      red.out[2 * i + 1] = rs;
      if (i < count) keep_stats(a, r + i, m, rs);
    }
  };
  if (a.rms) {
    /* one sum a row: half the shuffles */
    double q[N];
#pragma unroll
    for (int i = 0; i < N; i++)
      q[i] = v[2 * i];
    row_reduce<N>(q, red, [&](double(&t)[N], bool lead) {
      double t2[2 * N];
#pragma unroll
      for (int i = 0; i < N; i++)
        t2[2 * i] = t[i], t2[2 * i + 1] = 0.0;
      fin(t2, lead);
    });
  } else {
    row_reduce<2 * N>(v, red, fin);
  }
#pragma unroll
  for (int i = 0; i < N; i++) {
    mean[i] = static_cast<float>(red.out[2 * i]);
    rstd[i] = static_cast<float>(red.out[2 * i + 1]);
  }
}

/* moments_of_sums of N rows, xv as thread_sums' */
template <int N, int V, int NC, class X>
__device__ __forceinline__ void resident_moments(const lutra_norm_args &a, int64_t r, int count,
                                                 X &&xv, const float (&shift)[N], RowRed &red,
                                                 float (&mean)[N], float (&rstd)[N]) {
  double v[2 * N];
  thread_sums<N, V, NC>(a, xv, shift, v);
  moments_of_sums<N>(a, r, count, v, shift, red, mean, rstd);
}

/* A row-resident loop over rows r0 .. r1 two at a time: the next two rows' loads are issued before
 * the current two's statistics (resident_moments), so twice the bytes of a one-row loop are in
 * flight; then per chunk of V columns from c, gamma and beta read once (L1 hits) for both rows, and
 * f(r, c, y) with y the forward's output at row r (in f32, not yet rounded). */
template <int DT, int PDT, int V, int NC, class F>
__device__ __forceinline__ void normalized_pairs(const lutra_norm_args &a, int64_t r0, int64_t r1,
                                                 RowRed &red, F &&f) {
  const int64_t h = a.hidden;
  const bool beta = !a.rms, vec = params_vec<V>(a, beta);
  Raw<DT, V> c0[NC] = {}, c1[NC] = {}, n0[NC] = {}, n1[NC] = {};
  if (r0 < r1) load_row<DT, V, NC>(a.x, r0 * h, h, c0);
  if (r0 + 1 < r1) load_row<DT, V, NC>(a.x, (r0 + 1) * h, h, c1);
  for (int64_t r = r0; r < r1; r += 2) {
    const bool two = r + 1 < r1;
    /* the shifts are L1 hits (rows r and r + 1 are in): loaded with the next rows' loads they
     * would hold four more registers */
    const float sc[2] = {row_shift<DT>(a, r), two ? row_shift<DT>(a, r + 1) : 0.0f};
    if (r + 2 < r1) load_row<DT, V, NC>(a.x, (r + 2) * h, h, n0);
    if (r + 3 < r1) load_row<DT, V, NC>(a.x, (r + 3) * h, h, n1);
    float x[2][NC][V], mean[2], rstd[2];
#pragma unroll
    for (int j = 0; j < NC; j++) {
      unraw<DT, V>(c0[j], x[0][j]);
      unraw<DT, V>(c1[j], x[1][j]);
    }
    resident_moments<2, V, NC>(
        a, r, two ? 2 : 1, [&](int i, int j, int k) { return x[i][j][k]; }, sc, red, mean, rstd);
#pragma unroll
    for (int j = 0; j < NC; j++) {
      const int64_t c = col<V>(j);
      if (c >= h) continue;
      float g[V], b[V];
      load_param_chunk<PDT, V>(a, beta, vec, c, g, b);
#pragma unroll
      for (int i = 0; i < 2; i++) {
        if (i == 1 && !two) break;
        normalize<V>(x[i][j], mean[i], rstd[i], g, b, beta);
        f(r + i, c, x[i][j]);
      }
    }
#pragma unroll
    for (int j = 0; j < NC; j++) {
      c0[j] = n0[j];
      c1[j] = n1[j];
    }
  }
}

/* row r of a row-resident loop over rows .. r1: its shift loaded (an L1 hit: row r is in), the
 * next row's loads issued into nxt (in flight during this row's reduction), then row r, as
 * loaded in cur, unpacked into x with its mean and rstd */
template <int DT, int V, int NC>
__device__ __forceinline__ void
resident_row(const lutra_norm_args &a, int64_t r, int64_t r1, const Raw<DT, V> (&cur)[NC],
             Raw<DT, V> (&nxt)[NC], float (&x)[NC][V], RowRed &red, float &mean, float &rstd) {
  const float shift[1] = {row_shift<DT>(a, r)};
  if (r + 1 < r1) load_row<DT, V, NC>(a.x, (r + 1) * a.hidden, a.hidden, nxt);
#pragma unroll
  for (int j = 0; j < NC; j++)
    unraw<DT, V>(cur[j], x[j]);
  float m[1], rs[1];
  resident_moments<1, V, NC>(
      a, r, 1, [&](int, int j, int k) { return x[j][k]; }, shift, red, m, rs);
  mean = m[0];
  rstd = rs[0];
}

/* f(std::integral_constant<int, NC>()) for rows of h columns held NC chunks of V a thread by
 * the row-resident kernels (NC 1, 2, 4 or 8, at most kResident elements a thread), or R() when
 * the rows are wider */
template <int V, class R, class F> R with_resident_chunks(int64_t h, F &&f) {
  const int64_t nc = cdiv<int64_t>(h, static_cast<int64_t>(kRowThreads) * V);
  if (nc <= 1) return f(std::integral_constant<int, 1>());
  if (nc <= 2) return f(std::integral_constant<int, 2>());
  if (nc <= 4) return f(std::integral_constant<int, 4>());
  if constexpr (8 * V <= kResident)
    if (nc <= 8) return f(std::integral_constant<int, 8>());
  return R();
}

/* The row statistics alone, mean and rstd into a.mean / a.rstd (resident_moments: the forward's
 * bits), kStatRows rows a block, for the fused norm + block-scaled casts: their tile kernel
 * (kernels/norm_quantize.cu) then reads them instead of summing every row in one warp, whose
 * FP64 work bounds it. skip: TransformerEngine's noop flag, as the quantizers'. */
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

/* k_row_stats for rows of h columns, or nullptr where they exceed kResident elements a thread */
template <int DT, int V>
auto row_stats_kernel(int64_t h) -> void (*)(lutra_norm_args, const int32_t *) {
  return with_resident_chunks<V, void (*)(lutra_norm_args, const int32_t *)>(
      h, [](auto nc) { return k_row_stats<DT, V, decltype(nc)::value>; });
}

/* norm_fwd's statistics of row o (kernels/norm.cu) computed by one warp: lane l stands for
 * norm_fwd's threads l, l + 32, ..., l + 224 (kRowThreads of them in all), keeps each one's
 * double sums (thread_sums' s1, s2) over its chunks in that thread's order, and adds the virtual
 * threads' warp sums in block_sum's order (warp_sum per group of 32, then the groups from 0.0 in
 * order): the same mean and rstd bits as lk_layernorm_forward, without a block barrier per row.
 */
template <int DT, int V>
__device__ __forceinline__ void row_stats(const lutra_norm_args &a, int64_t o, int lane,
                                          float &mean, float &rstd) {
  constexpr int G = kRowThreads / 32;
  const int64_t h = a.hidden;
  const double shift = a.rms ? 0.0 : static_cast<double>(ld<DT>(a.x, o));
  double s1[G], s2[G];
#pragma unroll
  for (int g = 0; g < G; g++)
    s1[g] = s2[g] = 0.0;
  /* one chunk loaded at a time: the sixteen double sums already hold a third of the registers
   * the tile kernel that calls this has */
  for (int64_t j0 = static_cast<int64_t>(lane) * V; j0 < h; j0 += kRowThreads * V) {
#pragma unroll
    for (int g = 0; g < G; g++) {
      if (j0 + 32 * g * V >= h) continue;
      float v[V];
      ldv<DT, V>(a.x, o + j0 + 32 * g * V, v);
#pragma unroll
      for (int k = 0; k < V; k++) {
        const double d = static_cast<double>(v[k]) - shift;
        s1[g] += d;
        s2[g] += dmul_rn(d, d);
      }
    }
  }
  double t1 = 0.0, t2 = 0.0;
#pragma unroll
  for (int g = 0; g < G; g++) {
    t1 += warp_sum(s1[g]);
    t2 += warp_sum(s2[g]);
  }
  double mean_d = 0.0;
  const double var = a.rms ? t2 / static_cast<double>(h) : ln_moments(a, shift, t1, t2, mean_d);
  mean = static_cast<float>(mean_d);
  rstd = rstd_of(a, var);
}

} // namespace
