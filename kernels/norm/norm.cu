/* LayerNorm and RMSNorm forward and backward (kernels.h; semantics: lutra_norm_args in
 * src/backend/backend.h, reference src/backend/cpu/norm_cpu.c).
 *
 * Every row sum is the same f32 sum in the same order: kRowThreads (virtual) threads, thread
 * t adding the chunks t, t + kRowThreads, ... of V columns (16 bytes when the rows are aligned),
 * a butterfly per warp, the warps' sums in order from 0.0 (row_reduce). The CPU reference
 * (norm_cpu.c row_sum) adds them in this order, so mean, rstd, y and dx are its bits; dgamma and
 * dbeta agree within a bound (another order of the column sums).
 *
 * Rows of up to kResident elements per thread (8192 bf16 columns) stay in registers:
 *   forward: a block of 256 threads does kFwdRows rows (LayerNorm's two-row kernel: its share
 *     of one wave of blocks, fwd_rows_per_block), two at a time up to 16 elements a
 *     thread (norm_fwd_rows2: both rows' sums in one block reduction, the next two rows' 16-byte
 *     loads issued before the current ones' reductions, three blocks an SM), one at a time for
 *     wider rows (norm_fwd_rows); gamma and beta are read per row (L1 hits), so a thread holds
 *     little beyond its rows;
 *   backward (norm_bwd_rows, kernels/norm/norm_bwd_rows.cuh): dx and the dgamma/dbeta partials in
 *     one pass over x and dy. Block rb does the rows of row block rb (a split that depends on
 *     rows and hidden only, so the sums are the same on every device and run); each thread owns
 *     its columns, adds dy * xhat and dy over groups of kGroupRows rows in f32 and each group
 *     into a double per column in shared memory, and writes the block's sums, rounded to f32,
 *     to partial[rb][c]; norm_dgamma_final adds the row blocks in a fixed order. Two launches
 *     (TransformerEngine's bwd + finalize). On sm_90 and later, 16-byte rows come into shared
 *     memory by the bulk copy engine, each row of x and dy with its mean and rstd, kBwdStages
 *     rows ahead (kernels/common/bulk_rows.cuh): loaded one row ahead into registers instead, each
 *     row waited at the hand-over of the next row's loads (docs/lab/, "The norm backward's
 *     rows staged"). Older devices and unaligned rows keep the register loads. Rows of at most
 *     kNarrowChunks chunks a lane (1024 bf16 columns) take norm_bwd_narrow instead
 *     (kernels/norm/norm_bwd_narrow.cuh): a warp a row, several rows a block, no barrier a row,
 *     dx's bits the same.
 * The forward's row statistics' divisions and square root run in warp 0 alone (row_reduce's fin);
 * the row-resident backward's sums reach every warp after one barrier (row_reduce_all).
 * The sums were double once (FP64 adds and an f32 -> f64 conversion per element, the latter at a
 * quarter of the f32 rate on Hopper): that bound LayerNorm's forward and the fused casts behind
 * the memory system (docs/lab/, "The norms' row sums in f32"); f32 is what TransformerEngine
 * adds in too.
 * Wider rows take norm_fwd / norm_dx (x re-read from L2 per pass) and the column-tile partials
 * of norm_dgamma_partial (x and dy read again). */
#include "common/bulk_rows.cuh"
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"
#include "norm_rows.cuh"

#include <atomic>

using namespace lkc;

namespace {

constexpr int kColTile = 32, kRowLanes = 8, kRowsPerBlock = 64;
/* norm_dgamma_final's block: kFinalCols columns by kFinalLanes row lanes */
constexpr int kFinalCols = 8, kFinalLanes = 32;
constexpr int kFwdRows = 4;     /* rows per forward block */
constexpr int kGroupRows = 16;  /* rows of f32 column sums before each goes into its double */
constexpr int kBwdMinRows = 64; /* rows per backward row block at least: the partials' traffic */

template <int DT> __device__ __forceinline__ float gamma_at(const lutra_norm_args &a, int64_t c) {
  const float g = ld<DT>(a.gamma, c);
  return a.zero_centered_gamma ? fadd(g, 1.0f) : g;
}

/* f(c, x) over the columns of row base (vectorized when V > 1; the caller checked alignment) */
template <int DT, int V, class F>
__device__ __forceinline__ void for_cols(const void *p, int64_t base, int64_t h, F &&f) {
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * V; c < h; c += kRowThreads * V) {
    float v[V];
    ldv<DT, V>(p, base + c, v);
#pragma unroll
    for (int k = 0; k < V; k++)
      f(c + k, v[k]);
  }
}

/* the rows wider than the row-resident kernels take: x read once per sum and once for y */
template <int DT, int PDT, int V>
__global__ void __launch_bounds__(kRowThreads) norm_fwd(lutra_norm_args a) {
  __shared__ RowRed red;
  const int64_t r = blockIdx.x, h = a.hidden, o = r * h;
  float mean = 0.0f;
  if (!a.rms) {
    float s[1] = {0.0f};
    for_cols<DT, V>(a.x, o, h, [&](int64_t, float x) { s[0] = fadd(s[0], x); });
    row_reduce<1>(s, red, [&](float(&t)[1], bool lead) {
      if (lead) red.out[0] = fdiv(t[0], static_cast<float>(h));
    });
    mean = red.out[0];
  }
  float q[1] = {0.0f};
  for_cols<DT, V>(a.x, o, h, [&](int64_t, float x) {
    const float d = a.rms ? x : fsub(x, mean);
    q[0] = fadd(q[0], fmul(d, d));
  });
  row_reduce<1>(q, red, rstd_fin(a, r, mean, red));
  const float rstd = red.out[1];
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * V; c < h; c += kRowThreads * V) {
    float v[V];
    ldv<DT, V>(a.x, o + c, v);
#pragma unroll
    for (int k = 0; k < V; k++) {
      float y = fmul(fmul(fsub(v[k], mean), rstd), gamma_at<PDT>(a, c + k));
      if (!a.rms) y = fadd(y, ld<PDT>(a.beta, c + k));
      v[k] = y;
    }
    stv<DT, V>(a.y, o + c, v);
  }
}

/* The normalized input and its gradient at V elements from c of row offset o: the same
 * operations in both passes of norm_dx, so the second pass sees exactly what the sums saw. */
template <int DT, int PDT, int V>
__device__ __forceinline__ void dx_terms(const lutra_norm_args &a, int64_t o, int64_t c, float mean,
                                         float rstd, float (&xhat)[V], float (&dxhat)[V]) {
  float x[V], dy[V];
  ldv<DT, V>(a.x, o + c, x);
  ldv<DT, V>(a.dy, o + c, dy);
#pragma unroll
  for (int k = 0; k < V; k++) {
    xhat[k] = fmul(fsub(x[k], mean), rstd);
    dxhat[k] = fmul(dy[k], gamma_at<PDT>(a, c + k));
  }
}

/* c1 = mean(dxhat xhat), c2 = mean(dxhat) (0 for RMSNorm) into red.out, from warp 0 */
__device__ __forceinline__ void dx_coefficients(const lutra_norm_args &a, float (&s)[2],
                                                RowRed &red) {
  const float hf = static_cast<float>(a.hidden);
  row_reduce<2>(s, red, [&](float(&t)[2], bool lead) {
    const float c1 = fdiv(t[0], hf);
    const float c2 = a.rms ? 0.0f : fdiv(t[1], hf);
    if (!lead) return;
    red.out[0] = c1;
    red.out[1] = c2;
  });
}

/* dx[V] at element i stored, plus add (the residual's gradient at i as loaded: a.dx_add's) in f32
 * before the rounding where the caller passes one */
template <int DT, int V>
__device__ __forceinline__ void store_dx_plus(const lutra_norm_args &a, int64_t i, float (&dx)[V],
                                              const Raw<DT, V> *add) {
  if (add) {
    float r[V];
    unraw<DT, V>(*add, r);
#pragma unroll
    for (int k = 0; k < V; k++)
      dx[k] = fadd(dx[k], r[k]);
  }
  stv<DT, V>(a.dx, i, dx);
}

/* dx[V] at element i, with the residual's gradient a.dx_add loaded here and added */
template <int DT, int V>
__device__ __forceinline__ void store_dx(const lutra_norm_args &a, int64_t i, float (&dx)[V]) {
  Raw<DT, V> add{};
  if (a.dx_add) add = raw_at<DT, V>(a.dx_add, i);
  store_dx_plus<DT, V>(a, i, dx, a.dx_add ? &add : nullptr);
}

template <int DT, int PDT, int V>
__global__ void __launch_bounds__(kRowThreads) norm_dx(lutra_norm_args a) {
  __shared__ RowRed red;
  const int64_t r = blockIdx.x, h = a.hidden, o = r * h;
  const float mean = a.rms ? 0.0f : a.mean[r], rstd = a.rstd[r];
  float s[2] = {0.0f, 0.0f};
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * V; c < h; c += kRowThreads * V) {
    float xhat[V], dxhat[V];
    dx_terms<DT, PDT, V>(a, o, c, mean, rstd, xhat, dxhat);
#pragma unroll
    for (int k = 0; k < V; k++) {
      s[0] = fadd(s[0], fmul(dxhat[k], xhat[k]));
      s[1] = fadd(s[1], dxhat[k]);
    }
  }
  dx_coefficients(a, s, red);
  const float c1 = static_cast<float>(red.out[0]), c2 = static_cast<float>(red.out[1]);
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * V; c < h; c += kRowThreads * V) {
    float xhat[V], dxhat[V], dx[V];
    dx_terms<DT, PDT, V>(a, o, c, mean, rstd, xhat, dxhat);
#pragma unroll
    for (int k = 0; k < V; k++)
      dx[k] = fmul(fsub(dxhat[k], fadd(fmul(xhat[k], c1), c2)), rstd);
    store_dx<DT, V>(a, o + c, dx);
  }
}

/* ---- the row-resident kernels ---------------------------------------------------------------
 * Thread t holds the chunks j = 0 .. NC - 1 of V columns from col<V>(j) (NC * V <= kResident),
 * which are norm_fwd's / norm_dx's chunks, so their sums and bits are the same. */

/* the one-row forward, for rows wider than norm_fwd_rows2 takes (more than 16 elements a
 * thread): gamma and beta read per row from L1, not held, so two blocks an SM fit */
template <int DT, int PDT, int V, int NC>
__global__ void __launch_bounds__(kRowThreads, 2) norm_fwd_rows(lutra_norm_args a, int64_t rpb) {
  __shared__ RowRed red;
  const int64_t h = a.hidden, r0 = static_cast<int64_t>(blockIdx.x) * rpb;
  const int64_t r1 = imin<int64_t>(a.rows, r0 + rpb);
  const bool beta = !a.rms, vec = params_vec<V>(a, beta);
  Raw<DT, V> cur[NC] = {}, nxt[NC] = {};
  load_row<DT, V, NC>(a.x, r0 * h, h, cur);
  for (int64_t r = r0; r < r1; r++) {
    float x[NC][V], mean, rstd;
    resident_row<DT, V, NC>(a, r, r1, cur, nxt, x, red, mean, rstd);
#pragma unroll
    for (int j = 0; j < NC; j++) {
      const int64_t c = col<V>(j);
      if (c >= h) continue;
      float g[V], b[V];
      load_param_chunk<PDT, V>(a, beta, vec, c, g, b);
      normalize<V>(x[j], mean, rstd, g, b, beta);
      stv<DT, V>(a.y, r * h + c, x[j]);
    }
#pragma unroll
    for (int j = 0; j < NC; j++)
      cur[j] = nxt[j];
  }
}

/* norm_fwd_rows two rows at a time (normalized_pairs: twice the bytes in flight); FULL: rows of
 * exactly NC V kRowThreads columns, no column checks */
template <int DT, int PDT, int V, int NC, bool FULL>
__global__ void __launch_bounds__(kRowThreads, 3) norm_fwd_rows2(lutra_norm_args a, int64_t rpb) {
  __shared__ RowRed red;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rpb;
  normalized_pairs<DT, PDT, V, NC, FULL>(
      a, r0, imin<int64_t>(a.rows, r0 + rpb), red,
      [&](int64_t r, int64_t c, const float(&y)[V]) { stv<DT, V>(a.y, r * a.hidden + c, y); });
}

#include "norm_bwd_rows.cuh"

/* the row-resident kernel for rows of up to kResident elements a thread, or nullptr; pairs:
 * whether it is the two-row one */
template <int DT, int PDT, int V>
auto fwd_rows_kernel(int64_t h, bool &pairs) -> void (*)(lutra_norm_args, int64_t) {
  return with_resident_chunks<V, void (*)(lutra_norm_args, int64_t)>(
      h, [&pairs, h](auto nc) -> void (*)(lutra_norm_args, int64_t) {
        constexpr int NC = decltype(nc)::value;
        pairs = NC * V <= 16;
        if constexpr (NC * V <= 16)
          return rows_full<V, NC>(h) ? norm_fwd_rows2<DT, PDT, V, NC, true>
                                     : norm_fwd_rows2<DT, PDT, V, NC, false>;
        return norm_fwd_rows<DT, PDT, V, NC>;
      });
}

/* the column kernels' row lanes: lane y's sums g and b added into lane 0's in lane order (one
 * fixed tree); true in lane 0 of a column in range, which then holds the totals */
template <int COLS, int LANES>
__device__ __forceinline__ bool sum_lanes(double &g, double &b, bool in_range) {
  __shared__ double sg[LANES][COLS], sb[LANES][COLS];
  sg[threadIdx.y][threadIdx.x] = g;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y != 0 || !in_range) return false;
  for (int k = 1; k < LANES; k++) {
    g += sg[k][threadIdx.x];
    b += sb[k][threadIdx.x];
  }
  return true;
}

/* wider rows' dgamma/dbeta, pass 1: partial[rb][c] = sum over row block rb of dy * xhat (and
 * [nrb + rb][c]: of dy), x and dy read again */
template <int DT>
__global__ void __launch_bounds__(kColTile *kRowLanes)
    norm_dgamma_partial(lutra_norm_args a, double *partial, int64_t nrb) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t rb = blockIdx.y, h = a.hidden;
  const int64_t rpb = cdiv<int64_t>(a.rows, nrb);
  const int64_t r0 = rb * rpb, r1 = imin<int64_t>(a.rows, r0 + rpb);
  double g = 0.0, b = 0.0;
  if (c < h) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const float mean = a.rms ? 0.0f : a.mean[r];
      const float xhat = fmul(fsub(ld<DT>(a.x, r * h + c), mean), a.rstd[r]);
      const float dy = ld<DT>(a.dy, r * h + c);
      g += static_cast<double>(fmul(dy, xhat));
      b += dy;
    }
  }
  if (!sum_lanes<kColTile, kRowLanes>(g, b, c < h)) return;
  partial[rb * h + c] = g;
  partial[(nrb + rb) * h + c] = b;
}

/* dgamma[c], dbeta[c] = the row blocks' partials in a fixed tree, rounded once: row lane y adds
 * the row blocks y, y + kFinalLanes, ... in order, then lane 0 adds the lanes in order. A lane
 * loads kFinalBatch row blocks before it adds them (in the same order), and the block is narrow
 * (kFinalCols columns) so that the grid has warps enough to keep the loads in flight: as 32
 * columns by 8 lanes, one load at a time, this kernel took about a tenth of the row-resident
 * backward's time. RMSNorm's dbeta partials are not read. */
constexpr int kFinalBatch = 8;

template <int PDT, class P>
__global__ void __launch_bounds__(kFinalCols *kFinalLanes)
    norm_dgamma_final(lutra_norm_args a, const P *partial, int64_t nrb) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kFinalCols + threadIdx.x, h = a.hidden;
  const bool beta = !a.rms;
  double g = 0.0, b = 0.0;
  if (c < h) {
    int64_t rb = threadIdx.y;
    for (; rb + (kFinalBatch - 1) * kFinalLanes < nrb; rb += kFinalBatch * kFinalLanes) {
      P pg[kFinalBatch], pb[kFinalBatch] = {};
#pragma unroll
      for (int u = 0; u < kFinalBatch; u++) {
        pg[u] = partial[(rb + u * kFinalLanes) * h + c];
        if (beta) pb[u] = partial[(nrb + rb + u * kFinalLanes) * h + c];
      }
#pragma unroll
      for (int u = 0; u < kFinalBatch; u++) {
        g += pg[u];
        b += pb[u];
      }
    }
    for (; rb < nrb; rb += kFinalLanes) {
      g += partial[rb * h + c];
      if (beta) b += partial[(nrb + rb) * h + c];
    }
  }
  if (!sum_lanes<kFinalCols, kFinalLanes>(g, b, c < h)) return;
  st<PDT>(a.dgamma, c, static_cast<float>(g));
  if (!a.rms) st<PDT>(a.dbeta, c, static_cast<float>(b));
}

template <class F> cudaError_t with_param_dtype(int dt, F &&f) {
  if (dt == LUTRA_F32) return f(std::integral_constant<int, LUTRA_F32>());
  if (dt == LUTRA_BF16) return f(std::integral_constant<int, LUTRA_BF16>());
  return cudaErrorInvalidValue;
}

bool bad(const lutra_norm_args *a) {
  return !a || a->rows < 0 || a->hidden <= 0 || !is_float_dtype(a->dtype) || !a->x || !a->gamma ||
         (!a->rms && !a->beta) || a->rows > 0x7FFFFFFF;
}

/* the row kernels' vector width: 16 bytes when every row starts aligned */
template <int DT> bool vec_ok(const lutra_norm_args *a, const void *p, const void *q) {
  const int64_t bytes = a->hidden * elem_size<DT>();
  return bytes % 16 == 0 && aligned(p, 16) && aligned(q, 16);
}

/* the row blocks of the row-resident backward: f32 partials, two per column and row block, in
 * the scratch's LK_BIAS_PARTIALS doubles; a function of rows and hidden only */
int64_t bwd_row_blocks(int64_t rows, int64_t hidden) {
  const int64_t fit = 2 * static_cast<int64_t>(LK_BIAS_PARTIALS) / (2 * hidden);
  return imax<int64_t>(1, imin<int64_t>(cdiv<int64_t>(rows, kBwdMinRows), fit));
}

template <int DT, int PDT, int V>
cudaError_t backward_rows(const lutra_norm_args *a, const lk_scratch *scratch, cudaStream_t s,
                          bool &done) {
  cudaError_t e;
  int smem = 0;
  const bwd_fn k = bwd_rows_kernel<DT, PDT, V>(a->hidden, e, smem);
  done = k != nullptr;
  if (!k || e != cudaSuccess) return e;
  const int64_t nrb = bwd_row_blocks(a->rows, a->hidden);
  float *partial = reinterpret_cast<float *>(scratch->bias_partial);
  LKC_LAUNCH(k, static_cast<unsigned>(nrb), kRowThreads, smem, s, *a, partial, nrb);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const unsigned g2 = static_cast<unsigned>(cdiv<int64_t>(a->hidden, kFinalCols));
  LKC_LAUNCH((norm_dgamma_final<PDT, float>), g2, dim3(kFinalCols, kFinalLanes), 0, s, *a,
             static_cast<const float *>(partial), nrb);
  return cudaGetLastError();
}

#include "norm_bwd_narrow.cuh"

/* the row blocks of the wider rows' backward: double partials */
int64_t wide_row_blocks(int64_t rows, int64_t hidden) {
  const int64_t fit = LK_BIAS_PARTIALS / (2 * hidden);
  return imax<int64_t>(1, imin<int64_t>(cdiv<int64_t>(rows, kRowsPerBlock), fit));
}

template <int DT, int PDT, int V>
cudaError_t backward_wide(const lutra_norm_args *a, const lk_scratch *scratch, cudaStream_t s) {
  if (a->dx && a->rows > 0) {
    LKC_LAUNCH((norm_dx<DT, PDT, V>), static_cast<unsigned>(a->rows), kRowThreads, 0, s, *a);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  const int64_t nrb = wide_row_blocks(a->rows, a->hidden);
  const dim3 g1(static_cast<unsigned>(cdiv<int64_t>(a->hidden, kColTile)),
                static_cast<unsigned>(nrb));
  LKC_LAUNCH(norm_dgamma_partial<DT>, g1, dim3(kColTile, kRowLanes), 0, s, *a,
             scratch->bias_partial, nrb);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const unsigned g2 = static_cast<unsigned>(cdiv<int64_t>(a->hidden, kFinalCols));
  LKC_LAUNCH((norm_dgamma_final<PDT, double>), g2, dim3(kFinalCols, kFinalLanes), 0, s, *a,
             static_cast<const double *>(scratch->bias_partial), nrb);
  return cudaGetLastError();
}

} // namespace

int64_t lk_norm_row_blocks(int64_t rows, int64_t hidden) {
  return wide_row_blocks(rows, hidden);
}

/* rows a LayerNorm forward block of norm_fwd_rows2 (pairs) does: the rows spread over one wave
 * of resident blocks (three an SM), in pairs, kFwdRows at least, so no tail wave and each
 * block's first loads (which nothing in the block overlaps) paid once per many rows. RMSNorm and
 * the one-row kernel keep kFwdRows: measured 0.975x for LayerNorm, 1.10x for RMSNorm side by
 * side (docs/lab/); the one-row kernel not measured. Only the split depends on the device,
 * not the result. */
int64_t fwd_rows_per_block(const lutra_norm_args *a, bool pairs) {
  if (a->rms || !pairs) return kFwdRows;
  return wave_share_rows(a->rows, 3, kFwdRows);
}

cudaError_t lk_layernorm_forward(const lutra_norm_args *a, cudaStream_t s) {
  if (bad(a) || !a->y) return cudaErrorInvalidValue;
  if (a->rows == 0) return cudaSuccess;
  return with_float_dtype(a->dtype, [&](auto t) {
    constexpr int DT = decltype(t)::value;
    return with_param_dtype(a->param_dtype, [&](auto pt) {
      constexpr int PDT = decltype(pt)::value;
      auto run = [&](auto v) {
        constexpr int V = decltype(v)::value;
        bool pairs = false;
        if (auto k = fwd_rows_kernel<DT, PDT, V>(a->hidden, pairs)) {
          const int64_t rpb = fwd_rows_per_block(a, pairs);
          const unsigned grid = static_cast<unsigned>(cdiv<int64_t>(a->rows, rpb));
          LKC_LAUNCH(k, grid, kRowThreads, 0, s, *a, rpb);
        } else {
          LKC_LAUNCH((norm_fwd<DT, PDT, V>), static_cast<unsigned>(a->rows), kRowThreads, 0, s, *a);
        }
        return cudaGetLastError();
      };
      if (vec_ok<DT>(a, a->x, a->y)) return run(std::integral_constant<int, vec16<DT>()>());
      return run(std::integral_constant<int, 1>());
    });
  });
}

cudaError_t lk_layernorm_backward(const lutra_norm_args *a, const lk_scratch *scratch,
                                  cudaStream_t s) {
  if (bad(a) || !a->dy || !a->rstd || (!a->rms && (!a->mean || !a->dbeta)) || !a->dgamma ||
      (a->dx_add && !a->dx) || !scratch || 2 * a->hidden > LK_BIAS_PARTIALS)
    return cudaErrorInvalidValue;
  return with_float_dtype(a->dtype, [&](auto t) {
    constexpr int DT = decltype(t)::value;
    return with_param_dtype(a->param_dtype, [&](auto pt) {
      constexpr int PDT = decltype(pt)::value;
      auto run = [&](auto v) {
        constexpr int V = decltype(v)::value;
        bool done = false;
        cudaError_t e = backward_narrow<DT, PDT, V>(a, scratch, s, done);
        if (done || e != cudaSuccess) return e;
        e = backward_rows<DT, PDT, V>(a, scratch, s, done);
        if (done || e != cudaSuccess) return e;
        return backward_wide<DT, PDT, V>(a, scratch, s);
      };
      const bool vec = vec_ok<DT>(a, a->x, a->dy) && (!a->dx || aligned(a->dx, 16)) &&
                       (!a->dx_add || aligned(a->dx_add, 16));
      if (vec) return run(std::integral_constant<int, vec16<DT>()>());
      return run(std::integral_constant<int, 1>());
    });
  });
}
