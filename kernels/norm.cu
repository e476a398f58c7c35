/* LayerNorm and RMSNorm forward and backward (kernels.h; semantics: lutra_norm_args in
 * src/backend/backend.h, reference src/backend/cpu/norm_cpu.c).
 *   forward:  one block per row; each thread sums its columns (16-byte vector loads when the
 *             row is aligned) in double, a fixed-tree block_sum gives the row's sums; mean and
 *             rstd are rounded into f32; the element formula is the CPU's f32 sequence
 *             (fadd/fmul, no FMA). Rows of up to 8 chunks per thread stay in registers
 *             (norm_fwd_reg), so x is read once.
 *   backward: dx one block per row, the row sums c1, c2 in double the same way; dgamma and dbeta
 *             are column sums done in two deterministic passes (no atomics): pass 1, block
 *             (column tile of 32, row block rb) sums its rows in double (8 row lanes added in
 *             order) into scratch partial[rb][c]; pass 2 adds the row blocks of a column in order.
 * The CPU reference (norm_cpu.c row_sum) adds the row sums in this order, so mean, rstd, y
 * and dx are its bits; dgamma/dbeta agree within a bound (another order of the column sums). */
#include "common.cuh"
#include "ops_common.cuh"

using namespace lkops;

namespace {

constexpr int kRowThreads = 256;
constexpr int kColTile = 32, kRowLanes = 8, kRowsPerBlock = 64;

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

template <int DT, int PDT, int V>
__global__ void __launch_bounds__(kRowThreads) norm_fwd(lutra_norm_args a) {
  __shared__ double smem[kRowThreads / 32];
  const int64_t r = blockIdx.x, h = a.hidden, o = r * h;
  double s = 0.0;
  if (!a.rms) for_cols<DT, V>(a.x, o, h, [&](int64_t, float x) { s += x; });
  const double mean_d = a.rms ? 0.0 : block_sum<kRowThreads>(s, smem) / static_cast<double>(h);
  double q = 0.0;
  for_cols<DT, V>(a.x, o, h, [&](int64_t, float x) {
    const double d = x - mean_d;
    q += dmul_rn(d, d);
  });
  const double var = block_sum<kRowThreads>(q, smem) / static_cast<double>(h);
  const float mean = static_cast<float>(mean_d);
  const float rstd = static_cast<float>(1.0 / sqrt(var + static_cast<double>(a.eps)));
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
  if (threadIdx.x == 0) {
    if (a.mean && !a.rms) a.mean[r] = mean;
    if (a.rstd) a.rstd[r] = rstd;
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

template <int DT, int PDT, int V>
__global__ void __launch_bounds__(kRowThreads) norm_dx(lutra_norm_args a) {
  __shared__ double smem[kRowThreads / 32];
  const int64_t r = blockIdx.x, h = a.hidden, o = r * h;
  const float mean = a.rms ? 0.0f : a.mean[r], rstd = a.rstd[r];
  double s1 = 0.0, s2 = 0.0;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * V; c < h; c += kRowThreads * V) {
    float xhat[V], dxhat[V];
    dx_terms<DT, PDT, V>(a, o, c, mean, rstd, xhat, dxhat);
#pragma unroll
    for (int k = 0; k < V; k++) {
      s1 += static_cast<double>(fmul(dxhat[k], xhat[k]));
      s2 += dxhat[k];
    }
  }
  const float c1 = static_cast<float>(block_sum<kRowThreads>(s1, smem) / static_cast<double>(h));
  const double t2 = block_sum<kRowThreads>(s2, smem);
  const float c2 = a.rms ? 0.0f : static_cast<float>(t2 / static_cast<double>(h));
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * V; c < h; c += kRowThreads * V) {
    float xhat[V], dxhat[V], dx[V];
    dx_terms<DT, PDT, V>(a, o, c, mean, rstd, xhat, dxhat);
#pragma unroll
    for (int k = 0; k < V; k++)
      dx[k] = fmul(fsub(dxhat[k], fadd(fmul(xhat[k], c1), c2)), rstd);
    stv<DT, V>(a.dx, o + c, dx);
  }
}

/* The row-resident versions of norm_fwd and norm_dx, for rows of at most kRowThreads * V * NC
 * elements: thread t holds its chunks t, t + kRowThreads, ... (NC of them) in registers, so x
 * (and dy) are read once. The chunks, their order in each thread's double sums and the
 * block_sum tree are norm_fwd's / norm_dx's, so every output bit is the same. */
template <int DT, int PDT, int V, int NC>
__global__ void __launch_bounds__(kRowThreads) norm_fwd_reg(lutra_norm_args a) {
  __shared__ double smem[kRowThreads / 32];
  const int64_t r = blockIdx.x, h = a.hidden, o = r * h;
  float v[NC][V] = {};
#pragma unroll
  for (int j = 0; j < NC; j++) {
    const int64_t c = (static_cast<int64_t>(threadIdx.x) + kRowThreads * j) * V;
    if (c < h) ldv<DT, V>(a.x, o + c, v[j]);
  }
  double s = 0.0;
  if (!a.rms) {
#pragma unroll
    for (int j = 0; j < NC; j++)
      if ((static_cast<int64_t>(threadIdx.x) + kRowThreads * j) * V < h) {
#pragma unroll
        for (int k = 0; k < V; k++)
          s += v[j][k];
      }
  }
  const double mean_d = a.rms ? 0.0 : block_sum<kRowThreads>(s, smem) / static_cast<double>(h);
  double q = 0.0;
#pragma unroll
  for (int j = 0; j < NC; j++)
    if ((static_cast<int64_t>(threadIdx.x) + kRowThreads * j) * V < h) {
#pragma unroll
      for (int k = 0; k < V; k++) {
        const double d = v[j][k] - mean_d;
        q += dmul_rn(d, d);
      }
    }
  const double var = block_sum<kRowThreads>(q, smem) / static_cast<double>(h);
  const float mean = static_cast<float>(mean_d);
  const float rstd = static_cast<float>(1.0 / sqrt(var + static_cast<double>(a.eps)));
#pragma unroll
  for (int j = 0; j < NC; j++) {
    const int64_t c = (static_cast<int64_t>(threadIdx.x) + kRowThreads * j) * V;
    if (c >= h) continue;
#pragma unroll
    for (int k = 0; k < V; k++) {
      float y = fmul(fmul(fsub(v[j][k], mean), rstd), gamma_at<PDT>(a, c + k));
      if (!a.rms) y = fadd(y, ld<PDT>(a.beta, c + k));
      v[j][k] = y;
    }
    stv<DT, V>(a.y, o + c, v[j]);
  }
  if (threadIdx.x == 0) {
    if (a.mean && !a.rms) a.mean[r] = mean;
    if (a.rstd) a.rstd[r] = rstd;
  }
}

template <int DT, int PDT, int V, int NC>
__global__ void __launch_bounds__(kRowThreads) norm_dx_reg(lutra_norm_args a) {
  __shared__ double smem[kRowThreads / 32];
  const int64_t r = blockIdx.x, h = a.hidden, o = r * h;
  const float mean = a.rms ? 0.0f : a.mean[r], rstd = a.rstd[r];
  float xhat[NC][V] = {}, dxhat[NC][V] = {};
#pragma unroll
  for (int j = 0; j < NC; j++) {
    const int64_t c = (static_cast<int64_t>(threadIdx.x) + kRowThreads * j) * V;
    if (c < h) dx_terms<DT, PDT, V>(a, o, c, mean, rstd, xhat[j], dxhat[j]);
  }
  double s1 = 0.0, s2 = 0.0;
#pragma unroll
  for (int j = 0; j < NC; j++)
    if ((static_cast<int64_t>(threadIdx.x) + kRowThreads * j) * V < h) {
#pragma unroll
      for (int k = 0; k < V; k++) {
        s1 += static_cast<double>(fmul(dxhat[j][k], xhat[j][k]));
        s2 += dxhat[j][k];
      }
    }
  const float c1 = static_cast<float>(block_sum<kRowThreads>(s1, smem) / static_cast<double>(h));
  const double t2 = block_sum<kRowThreads>(s2, smem);
  const float c2 = a.rms ? 0.0f : static_cast<float>(t2 / static_cast<double>(h));
#pragma unroll
  for (int j = 0; j < NC; j++) {
    const int64_t c = (static_cast<int64_t>(threadIdx.x) + kRowThreads * j) * V;
    if (c >= h) continue;
    float dx[V];
#pragma unroll
    for (int k = 0; k < V; k++)
      dx[k] = fmul(fsub(dxhat[j][k], fadd(fmul(xhat[j][k], c1), c2)), rstd);
    stv<DT, V>(a.dx, o + c, dx);
  }
}

/* the row-resident kernel for rows of up to 8 chunks per thread, or nullptr */
template <int DT, int PDT, int V> auto fwd_kernel(int64_t h) -> void (*)(lutra_norm_args) {
  const int64_t nc = cdiv<int64_t>(h, static_cast<int64_t>(kRowThreads) * V);
  if (nc <= 1) return norm_fwd_reg<DT, PDT, V, 1>;
  if (nc <= 2) return norm_fwd_reg<DT, PDT, V, 2>;
  if (nc <= 4) return norm_fwd_reg<DT, PDT, V, 4>;
  if (nc <= 8) return norm_fwd_reg<DT, PDT, V, 8>;
  return norm_fwd<DT, PDT, V>;
}

template <int DT, int PDT, int V> auto dx_kernel(int64_t h) -> void (*)(lutra_norm_args) {
  const int64_t nc = cdiv<int64_t>(h, static_cast<int64_t>(kRowThreads) * V);
  if (nc <= 1) return norm_dx_reg<DT, PDT, V, 1>;
  if (nc <= 2) return norm_dx_reg<DT, PDT, V, 2>;
  if (nc <= 4) return norm_dx_reg<DT, PDT, V, 4>;
  if (nc <= 8) return norm_dx_reg<DT, PDT, V, 8>;
  return norm_dx<DT, PDT, V>;
}

/* pass 1: partial[rb][c] = sum over row block rb of dy * xhat (and [nrb + rb][c]: of dy) */
template <int DT>
__global__ void __launch_bounds__(kColTile *kRowLanes)
    norm_dgamma_partial(lutra_norm_args a, double *partial, int64_t nrb) {
  __shared__ double sg[kRowLanes][kColTile], sb[kRowLanes][kColTile];
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
  sg[threadIdx.y][threadIdx.x] = g;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y != 0 || c >= h) return;
  for (int k = 1; k < kRowLanes; k++) {
    g += sg[k][threadIdx.x];
    b += sb[k][threadIdx.x];
  }
  partial[rb * h + c] = g;
  partial[(nrb + rb) * h + c] = b;
}

/* pass 2: dgamma[c], dbeta[c] = the row blocks' partials added in order, rounded once */
template <int PDT>
__global__ void norm_dgamma_final(lutra_norm_args a, const double *partial, int64_t nrb) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, h = a.hidden;
  if (c >= h) return;
  double g = 0.0, b = 0.0;
  for (int64_t rb = 0; rb < nrb; rb++) {
    g += partial[rb * h + c];
    b += partial[(nrb + rb) * h + c];
  }
  st<PDT>(a.dgamma, c, static_cast<float>(g));
  if (!a.rms) st<PDT>(a.dbeta, c, static_cast<float>(b));
}

template <class F> cudaError_t with_param_dtype(int dt, F &&f) {
  if (dt == LUTRA_F32) return f(std::integral_constant<int, LUTRA_F32>());
  if (dt == LUTRA_BF16) return f(std::integral_constant<int, LUTRA_BF16>());
  return cudaErrorInvalidValue;
}

bool bad(const lutra_norm_args *a) {
  return !a || a->rows < 0 || a->hidden <= 0 || !float_dtype(a->dtype) || !a->x || !a->gamma ||
         (!a->rms && !a->beta) || a->rows > 0x7FFFFFFF;
}

/* the row kernels' vector width: 16 bytes when every row starts aligned */
template <int DT> bool vec_ok(const lutra_norm_args *a, const void *p, const void *q) {
  const int64_t bytes = a->hidden * elem_size<DT>();
  return bytes % 16 == 0 && aligned(p, 16) && aligned(q, 16);
}

} // namespace

int64_t lk_norm_row_blocks(int64_t rows, int64_t hidden) {
  const int64_t fit = LK_BIAS_PARTIALS / (2 * hidden);
  return imax<int64_t>(1, imin<int64_t>(cdiv<int64_t>(rows, kRowsPerBlock), fit));
}

cudaError_t lk_layernorm_forward(const lutra_norm_args *a, cudaStream_t s) {
  if (bad(a) || !a->y) return cudaErrorInvalidValue;
  if (a->rows == 0) return cudaSuccess;
  return with_dtype(a->dtype, [&](auto t) {
    constexpr int DT = decltype(t)::value;
    return with_param_dtype(a->param_dtype, [&](auto pt) {
      constexpr int PDT = decltype(pt)::value;
      const dim3 grid(static_cast<unsigned>(a->rows));
      if (vec_ok<DT>(a, a->x, a->y))
        LKC_LAUNCH((fwd_kernel<DT, PDT, vec16<DT>()>(a->hidden)), grid, kRowThreads, 0, s, *a);
      else
        LKC_LAUNCH((fwd_kernel<DT, PDT, 1>(a->hidden)), grid, kRowThreads, 0, s, *a);
      return cudaGetLastError();
    });
  });
}

cudaError_t lk_layernorm_backward(const lutra_norm_args *a, const lk_scratch *scratch,
                                  cudaStream_t s) {
  if (bad(a) || !a->dy || !a->rstd || (!a->rms && (!a->mean || !a->dbeta)) || !a->dgamma ||
      !scratch || 2 * a->hidden > LK_BIAS_PARTIALS)
    return cudaErrorInvalidValue;
  return with_dtype(a->dtype, [&](auto t) {
    constexpr int DT = decltype(t)::value;
    return with_param_dtype(a->param_dtype, [&](auto pt) {
      constexpr int PDT = decltype(pt)::value;
      if (a->dx && a->rows > 0) {
        const dim3 grid(static_cast<unsigned>(a->rows));
        if (vec_ok<DT>(a, a->x, a->dx) && aligned(a->dy, 16))
          LKC_LAUNCH((dx_kernel<DT, PDT, vec16<DT>()>(a->hidden)), grid, kRowThreads, 0, s, *a);
        else
          LKC_LAUNCH((dx_kernel<DT, PDT, 1>(a->hidden)), grid, kRowThreads, 0, s, *a);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
      }
      const int64_t nrb = lk_norm_row_blocks(a->rows, a->hidden);
      const dim3 g1(static_cast<unsigned>(cdiv<int64_t>(a->hidden, kColTile)),
                    static_cast<unsigned>(nrb));
      LKC_LAUNCH(norm_dgamma_partial<DT>, g1, dim3(kColTile, kRowLanes), 0, s, *a,
                 scratch->bias_partial, nrb);
      const cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) return e;
      const unsigned g2 = static_cast<unsigned>(cdiv<int64_t>(a->hidden, 256));
      LKC_LAUNCH(norm_dgamma_final<PDT>, g2, 256, 0, s, *a, scratch->bias_partial, nrb);
      return cudaGetLastError();
    });
  });
}
