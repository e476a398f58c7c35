/* Activations forward/backward (every LUTRA_ACT_* kind), bias gradient and bias add (kernels.h).
 * Semantics: lutra_cpu_activation_forward/backward and lutra_cpu_bias_grad in
 * src/backend/cpu/activation_cpu.c; lk_add_bias is the bias step of
 * lutra_cpu_gemm done on an already stored D: d = round(d + bias) in f32. */
#include "activation_math.cuh"
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"

#include <type_traits>

using namespace lkc;

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192; /* grid-stride beyond this */

/* ---- element-wise activations ------------------------------------------------------------ */

/* out = K::f(x) (BWD false) or dy * K::df(x) (BWD true), N-element vectors for the first
 * nvec * N elements, scalars for the rest. In-place use (out == x or out == dy) is fine: each
 * element is read and written by one thread. */
template <class K, int DT, int N, bool BWD>
__global__ void __launch_bounds__(kThreads)
    act_kernel(const void *x, const void *dy, void *out, int64_t n) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t nvec = n / N;
  for (int64_t v = tid; v < nvec; v += stride) {
    float xv[N], r[N];
    ldv<DT, N>(x, v * N, xv);
    if constexpr (BWD) {
      float g[N];
      ldv<DT, N>(dy, v * N, g);
#pragma unroll
      for (int k = 0; k < N; k++)
        r[k] = fmul(g[k], K::df(xv[k]));
    } else {
#pragma unroll
      for (int k = 0; k < N; k++)
        r[k] = K::f(xv[k]);
    }
    stv<DT, N>(out, v * N, r);
  }
  for (int64_t i = nvec * N + tid; i < n; i += stride) {
    const float xi = ld<DT>(x, i);
    st<DT>(out, i, BWD ? fmul(ld<DT>(dy, i), K::df(xi)) : K::f(xi));
  }
}

template <bool BWD>
cudaError_t act_launch(int act, const void *x, const void *dy, void *out, int dtype, int64_t n,
                       cudaStream_t s) {
  if (n < 0 || !is_float_dtype(dtype)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (!x || !out || (BWD && !dy)) return cudaErrorInvalidValue;
  return with_act(act, [&](auto kind) {
    using K = decltype(kind);
    return with_float_dtype(dtype, [&](auto tag) {
      constexpr int DT = decltype(tag)::value;
      constexpr int V = vec16<DT>();
      const bool vec = aligned(x, 16) && aligned(out, 16) && (!BWD || aligned(dy, 16));
      const int64_t work = vec ? cdiv<int64_t>(n, V) : n;
      const unsigned blocks =
          static_cast<unsigned>(imin<int64_t>(cdiv<int64_t>(work, kThreads), kMaxBlocks));
      if (vec)
        act_kernel<K, DT, V, BWD><<<blocks, kThreads, 0, s>>>(x, dy, out, n);
      else
        act_kernel<K, DT, 1, BWD><<<blocks, kThreads, 0, s>>>(x, dy, out, n);
      return cudaGetLastError();
    });
  });
}

/* ---- gated activations ---------------------------------------------------------------------
 * x [rows, 2h]: one thread per (r, j < h), grid-stride over rows * h. Forward y[r, j] =
 * K::f(a) * b; backward dx[r, j] = dy * b * K::df(a), dx[r, h + j] = dy * K::f(a), the CPU's
 * order. Scalar accesses: a row's halves start at any element offset (h need not be a multiple
 * of the vector width), and these kernels are memory-bound either way. */
template <class K, int DT, bool BWD>
__global__ void __launch_bounds__(kThreads)
    gated_kernel(const void *x, const void *dy, void *out, int64_t rows, int64_t h) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t total = rows * h;
  for (int64_t i = tid; i < total; i += stride) {
    const int64_t r = i / h, j = i - r * h;
    const int64_t ia = r * 2 * h + j, ib = ia + h;
    const float a = ld<DT>(x, ia), b = ld<DT>(x, ib);
    if constexpr (BWD) {
      const float d = ld<DT>(dy, i);
      st<DT>(out, ia, fmul(fmul(d, b), K::df(a)));
      st<DT>(out, ib, fmul(d, K::f(a)));
    } else {
      st<DT>(out, i, fmul(K::f(a), b));
    }
  }
}

template <bool BWD> cudaError_t gated_launch(const lutra_act_args *a, cudaStream_t s) {
  const int64_t rows = a->rows, cols = a->cols;
  if (rows < 0 || cols < 0 || cols % 2 != 0 || !is_float_dtype(a->dtype))
    return cudaErrorInvalidValue;
  const int64_t h = cols / 2;
  if (rows == 0 || h == 0) return cudaSuccess;
  if (!a->x || !a->out || (BWD && !a->dy)) return cudaErrorInvalidValue;
  const unsigned blocks =
      static_cast<unsigned>(imin<int64_t>(cdiv<int64_t>(rows * h, kThreads), kMaxBlocks));
  return with_act(a->act, [&](auto kind) {
    using K = decltype(kind);
    return with_float_dtype(a->dtype, [&](auto tag) {
      constexpr int DT = decltype(tag)::value;
      gated_kernel<K, DT, BWD><<<blocks, kThreads, 0, s>>>(a->x, a->dy, a->out, rows, h);
      return cudaGetLastError();
    });
  });
}

/* ---- bias gradient ----------------------------------------------------------------------
 * db[c] (+)= sum_r dy[r, c], summed in double as the CPU does, deterministically:
 *   pass 1: block (bx, by) sums rows [by * rpb, (by + 1) * rpb) of a tile of 32 * N columns;
 *           threadIdx.x picks N consecutive columns (16-byte loads, coalesced across the warp),
 *           threadIdx.y (8) strides the rows; the 8 row partials are added in order in shared
 *           memory. With one row block it writes db directly; otherwise it writes double
 *           partials [by][c] into the caller's scratch (lk_scratch.bias_partial) and
 *   pass 2: block of 32 columns x 8 threads: thread (tx, ty) adds partials ty, ty + 8, ... of
 *           its column in order, then the 8 sums are added in order (plus db when
 *           accumulating) and db is stored.
 * The split depends only on (rows, cols), so results repeat bit for bit. The scratch comes from
 * the caller, one per stream: a device-global one was shared by every stream of the process, so
 * two threads' bias gradients (each on its own stream) overwrote each other's partials. */

constexpr int kBgTx = 32, kBgTy = 8;
constexpr int64_t kBgScratch = LK_BIAS_PARTIALS;
constexpr int64_t kBgTargetBlocks = 1024;
constexpr int64_t kBgMaxRowBlocks = 256;
constexpr int64_t kBgMinRowsPerBlock = 64;

template <int DT, int N>
__global__ void __launch_bounds__(kBgTx *kBgTy)
    bias_grad_partial(const void *__restrict__ dy, int64_t rows, int64_t cols,
                      int64_t rows_per_block, double *__restrict__ partial, void *db, int db_dtype,
                      int accumulate, const int32_t *skip) {
  /* slot k * 32 + tx holds column tx * N + k of the tile: conflict-free both ways */
  __shared__ double sm[kBgTy][kBgTx * N];
  if (skip && *skip) return; /* the whole block returns, before its barrier */
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * (kBgTx * N);
  const int64_t c = tile0 + static_cast<int64_t>(tx) * N; /* cols % N == 0 when N > 1 */
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_block;
  const int64_t r1 = imin<int64_t>(rows, r0 + rows_per_block);

  double acc[N];
#pragma unroll
  for (int k = 0; k < N; k++)
    acc[k] = 0.0;
  if (c < cols) {
#pragma unroll 4
    for (int64_t r = r0 + ty; r < r1; r += kBgTy) {
      float f[N];
      ldv<DT, N>(dy, r * cols + c, f);
#pragma unroll
      for (int k = 0; k < N; k++)
        acc[k] += static_cast<double>(f[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < N; k++)
    sm[ty][k * kBgTx + tx] = acc[k];
  __syncthreads();

  const int t = ty * kBgTx + tx;
  if (t < kBgTx * N) {
    const int col_in_tile = (t % kBgTx) * N + t / kBgTx;
    const int64_t col = tile0 + col_in_tile;
    if (col < cols) {
      double sum = 0.0;
#pragma unroll
      for (int y = 0; y < kBgTy; y++)
        sum += sm[y][t];
      if (partial) {
        partial[static_cast<int64_t>(blockIdx.y) * cols + col] = sum;
      } else {
        if (accumulate) sum = static_cast<double>(ld_rt(db, db_dtype, col)) + sum;
        st_rt(db, db_dtype, col, static_cast<float>(sum));
      }
    }
  }
}

/* Pass 2: thread (tx, ty) adds rows ty, ty + 8, ... of column c of the partials (the bias
 * gradient's scratch) in order, in double, then the 8 sums are added in order, so results
 * repeat bit for bit. */
__global__ void __launch_bounds__(kBgTx *kBgTy)
    column_sums_final(const double *__restrict__ partials, int64_t ny, int64_t cols, void *db,
                      int db_dtype, int accumulate, const int32_t *skip) {
  __shared__ double sm[kBgTy][kBgTx];
  if (skip && *skip) return;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kBgTx + tx;
  double sum = 0.0;
  if (c < cols) {
#pragma unroll 4
    for (int64_t y = ty; y < ny; y += kBgTy)
      sum += static_cast<double>(partials[y * cols + c]);
  }
  sm[ty][tx] = sum;
  __syncthreads();
  if (ty == 0 && c < cols) {
    double total = accumulate ? static_cast<double>(ld_rt(db, db_dtype, c)) : 0.0;
#pragma unroll
    for (int y = 0; y < kBgTy; y++)
      total += sm[y][tx];
    st_rt(db, db_dtype, c, static_cast<float>(total));
  }
}

/* ---- bias add ---------------------------------------------------------------------------
 * thread: N consecutive columns (bias kept in registers), looping over the rows
 * blockIdx.y, + gridDim.y, ... */

constexpr int kAbThreads = 128;

template <int DD, int DB, int N>
__global__ void __launch_bounds__(kAbThreads)
    add_bias_kernel(void *d, const void *__restrict__ bias, int64_t rows, int64_t cols) {
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kAbThreads + threadIdx.x) * N;
  if (c >= cols) return; /* cols % N == 0 when N > 1 */
  float b[N];
  ldv<DB, N>(bias, c, b);
#pragma unroll 4
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    float v[N];
    ldv<DD, N>(d, r * cols + c, v);
#pragma unroll
    for (int k = 0; k < N; k++)
      v[k] = fadd(v[k], b[k]);
    stv<DD, N>(d, r * cols + c, v);
  }
}

} // namespace

extern "C" cudaError_t lk_activation_forward(const lutra_act_args *a, cudaStream_t s) {
  if (!a) return cudaErrorInvalidValue;
  if (lutra_act_is_gated(a->act)) return gated_launch<false>(a, s);
  return act_launch<false>(a->act, a->x, nullptr, a->out, a->dtype, a->n, s);
}

extern "C" cudaError_t lk_activation_backward(const lutra_act_args *a, cudaStream_t s) {
  if (!a) return cudaErrorInvalidValue;
  if (lutra_act_is_gated(a->act)) return gated_launch<true>(a, s);
  return act_launch<true>(a->act, a->x, a->dy, a->out, a->dtype, a->n, s);
}

extern "C" cudaError_t lk_bias_grad(const lutra_bias_grad_args *a, const lk_scratch *scratch,
                                    cudaStream_t s) {
  if (!a || !scratch || !scratch->bias_partial) return cudaErrorInvalidValue;
  const void *dy = a->dy;
  void *db = a->db;
  const int dtype = a->dtype, db_dtype = a->db_dtype, accumulate = a->accumulate;
  const int64_t rows = a->rows, cols = a->cols;
  const int32_t *skip = a->skip;
  if (rows < 0 || cols < 0 || !is_float_dtype(dtype) || !is_float_dtype(db_dtype))
    return cudaErrorInvalidValue;
  if (cols == 0) return cudaSuccess;
  /* rows == 0 still writes db (zeros, or db itself when accumulating), as the CPU does */
  if (!db || (rows > 0 && !dy)) return cudaErrorInvalidValue;
  return with_float_dtype(dtype, [&](auto tag) {
    constexpr int DT = decltype(tag)::value;
    constexpr int V = vec16<DT>();
    const bool vec = cols % V == 0 && aligned(dy, 16);
    const int n = vec ? V : 1;
    const int64_t tiles = cdiv<int64_t>(cols, kBgTx * n);
    if (tiles > 0x7FFFFFFF) return cudaErrorInvalidValue;
    int64_t ny = cdiv<int64_t>(kBgTargetBlocks, tiles);
    ny = imin<int64_t>(ny, kBgMaxRowBlocks);
    ny = imin<int64_t>(ny, cdiv<int64_t>(rows, kBgMinRowsPerBlock));
    ny = imin<int64_t>(ny, kBgScratch / cols);
    ny = imax<int64_t>(ny, 1);
    const int64_t rpb = cdiv<int64_t>(rows, ny);
    if (rpb > 0) ny = cdiv<int64_t>(rows, rpb); /* no empty row blocks */
    double *partial = ny > 1 ? scratch->bias_partial : nullptr;
    const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(ny));
    const dim3 block(kBgTx, kBgTy);
    if (vec)
      bias_grad_partial<DT, V>
          <<<grid, block, 0, s>>>(dy, rows, cols, rpb, partial, db, db_dtype, accumulate, skip);
    else
      bias_grad_partial<DT, 1>
          <<<grid, block, 0, s>>>(dy, rows, cols, rpb, partial, db, db_dtype, accumulate, skip);
    if (partial) {
      const cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) return e;
      /* ny > 1 means cols <= kBgScratch / 2: the grid fits */
      column_sums_final<<<static_cast<unsigned>(cdiv<int64_t>(cols, kBgTx)), block, 0, s>>>(
          partial, ny, cols, db, db_dtype, accumulate, skip);
    }
    return cudaGetLastError();
  });
}

extern "C" cudaError_t lk_add_bias(void *d, int d_dtype, const void *bias, int bias_dtype,
                                   int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows < 0 || cols < 0 || !is_float_dtype(d_dtype) || !is_float_dtype(bias_dtype))
    return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (!d || !bias) return cudaErrorInvalidValue;
  return with_float_dtype(d_dtype, [&](auto dtag) {
    constexpr int DD = decltype(dtag)::value;
    return with_float_dtype(bias_dtype, [&](auto btag) {
      constexpr int DB = decltype(btag)::value;
      constexpr int V = vec16<DD>();
      const bool vec = cols % V == 0 && aligned(d, 16) &&
                       aligned(bias, imin<uintptr_t>(16, V * elem_size<DB>()));
      const int n = vec ? V : 1;
      const int64_t tiles = cdiv<int64_t>(cols, static_cast<int64_t>(kAbThreads) * n);
      if (tiles > 0x7FFFFFFF) return cudaErrorInvalidValue;
      int64_t ny = imax<int64_t>(1, kMaxBlocks / tiles);
      ny = imin<int64_t>(imin<int64_t>(ny, rows), 65535);
      const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(ny));
      if (vec)
        add_bias_kernel<DD, DB, V><<<grid, kAbThreads, 0, s>>>(d, bias, rows, cols);
      else
        add_bias_kernel<DD, DB, 1><<<grid, kAbThreads, 0, s>>>(d, bias, rows, cols);
      return cudaGetLastError();
    });
  });
}
