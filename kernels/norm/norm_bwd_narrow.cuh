/* The norm backward for narrow rows (norm_bwd_narrow) and its launch: included by
 * kernels/norm/norm.cu inside its unnamed namespace, after norm_bwd_rows.cuh and norm_dgamma_final;
 * no include guard (spec/native/sim_norm.cpp includes norm.cu inside a namespace of its own).
 *
 * norm_bwd_rows gives a row a block of kRowThreads threads, one chunk of V columns each: rows of
 * fewer than kRowThreads chunks leave threads idle (224 of 256 at 256 bf16 columns) and the block
 * still waits on a barrier per row. Here a row takes w warps, w = its chunks / 32
 * rounded up (at most kNarrowWarps), and a block holds rows side by side, one per row group of
 * 32 w threads. Thread t of a row group stands for norm_bwd_rows' thread t (the same chunk), and
 * the row's sums take row_reduce_all's order: each warp's butterfly, then the warps' sums from
 * 0.0 in order, adding 0.0 for each of the kRowWarps - w warps that hold no columns as those warps
 * add theirs there: dx has the same bits (and the CPU reference's). dgamma and dbeta: each
 * thread's f32 sums over kGroupRows rows into its doubles in shared memory, the row groups'
 * doubles added in order at the end into partial[rb][c] (another order of the column sums, within
 * the bound norm_bwd_rows' sums keep). */

/* the most warps a row of the narrow backward takes: one. Rows of three and four warps (768 and
 * 1024 bf16 columns) ran slower here than in norm_bwd_rows on an H100, rows of one warp twice as
 * fast (the figures are in the commit that set this). The kernel is written for any w up to
 * kRowWarps / 2. */
constexpr int kNarrowWarps = 1;
constexpr int kNarrowMinRows = 16; /* rows per row block at least (more blocks than the rows
                                      kernel: each row has fewer threads) */

/* the warps a row of h columns takes in norm_bwd_narrow, or 0 where the row is too wide */
template <int V> int narrow_warps(int64_t h) {
  const int64_t w = cdiv<int64_t>(cdiv<int64_t>(h, V), 32);
  return w <= kNarrowWarps ? static_cast<int>(w) : 0;
}

/* the row blocks of the narrow backward: f32 partials as the rows kernel's, a function of rows and
 * hidden only */
inline int64_t narrow_row_blocks(int64_t rows, int64_t hidden) {
  const int64_t fit = 2 * static_cast<int64_t>(LK_BIAS_PARTIALS) / (2 * hidden);
  return imax<int64_t>(1, imin<int64_t>(cdiv<int64_t>(rows, kNarrowMinRows), fit));
}

/* the V elements from element i as loaded (load_row's, at a chunk of this thread's choosing) */
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

/* Block rb: the rows of row block rb, R = blockDim.x / (32 w) of them at a time. Dynamic shared
 * memory: 2 V doubles a thread (dgamma's sums, then dbeta's). */
template <int DT, int PDT, int V>
__global__ void __launch_bounds__(kRowThreads, 2)
    norm_bwd_narrow(lutra_norm_args a, float *partial, int64_t nrb, int w) {
  __shared__ float parts[2][kRowWarps][2]; /* [half][warp][sum], alternating as row_reduce_all */
  double *acc = reinterpret_cast<double *>(lkc::dyn_smem());
  const int nt = static_cast<int>(blockDim.x), gt = 32 * w; /* threads: the block's, a row's */
  const int R = nt / gt, grp = static_cast<int>(threadIdx.x) / gt;
  const int t = static_cast<int>(threadIdx.x) % gt, warp = static_cast<int>(threadIdx.x) >> 5;
  const int64_t h = a.hidden, c = static_cast<int64_t>(t) * V;
  const bool in = c < h, beta = !a.rms;
  const int64_t rb = blockIdx.x, rpb = cdiv<int64_t>(a.rows, nrb);
  const int64_t r0 = imin<int64_t>(a.rows, rb * rpb), r1 = imin<int64_t>(a.rows, r0 + rpb);
  const int64_t iters = cdiv<int64_t>(r1 - r0, R); /* the same in every thread: the barriers */
  float g[V], unused[V], sg[V], sb[V];
  load_param_chunk<PDT, V>(a, false, params_vec<V>(a, false), c, g, unused);
#pragma unroll
  for (int k = 0; k < V; k++) {
    sg[k] = sb[k] = 0.0f;
    acc[k * nt + threadIdx.x] = 0.0;
    acc[(V + k) * nt + threadIdx.x] = 0.0;
  }
  auto flush = [&] {
#pragma unroll
    for (int k = 0; k < V; k++) {
      acc[k * nt + threadIdx.x] += sg[k];
      acc[(V + k) * nt + threadIdx.x] += sb[k];
      sg[k] = sb[k] = 0.0f;
    }
  };
  Raw<DT, V> xc[1] = {}, xn[1] = {}, dc[1] = {}, dn[1] = {};
  float mc = 0.0f, rc = 0.0f, mn = 0.0f, rn = 0.0f;
  /* row r into registers: this thread's chunk of x and dy, the row's statistics */
  auto load = [&](int64_t r, Raw<DT, V>(&x)[1], Raw<DT, V>(&dy)[1], float &m, float &rs) {
    if (in) {
      x[0] = raw_at<DT, V>(a.x, r * h + c);
      dy[0] = raw_at<DT, V>(a.dy, r * h + c);
    }
    m = a.rms ? 0.0f : a.mean[r];
    rs = a.rstd[r];
  };
  if (r0 + grp < r1) load(r0 + grp, xc, dc, mc, rc);
  int grouped = 0, half = 0;
  for (int64_t i = 0; i < iters; i++) {
    const int64_t r = r0 + i * R + grp;
    const bool live = r < r1;
    if (r + R < r1) load(r + R, xn, dn, mn, rn);
    float xhat[V], dxhat[V], s[2] = {0.0f, 0.0f};
    {
      float x[V], dy[V];
      unraw<DT, V>(xc[0], x);
      unraw<DT, V>(dc[0], dy);
#pragma unroll
      for (int k = 0; k < V; k++) {
        xhat[k] = fmul(fsub(x[k], mc), rc);
        dxhat[k] = fmul(dy[k], g[k]);
        if (!live || !in) continue;
        sg[k] = fadd(sg[k], fmul(dy[k], xhat[k]));
        s[0] = fadd(s[0], fmul(dxhat[k], xhat[k]));
        if (!beta) continue;
        sb[k] = fadd(sb[k], dy[k]);
        s[1] = fadd(s[1], dxhat[k]);
      }
    }
    if (live && ++grouped == kGroupRows) {
      flush();
      grouped = 0;
    }
    if (a.dx) {
      s[0] = warp_sum(s[0]);
      if (beta) s[1] = warp_sum(s[1]);
      if ((threadIdx.x & 31) == 0) {
        parts[half][warp][0] = s[0];
        parts[half][warp][1] = s[1];
      }
      __syncthreads();
      float t0 = 0.0f, t1 = 0.0f;
      for (int k = 0; k < w; k++) {
        t0 = fadd(t0, parts[half][grp * w + k][0]);
        t1 = fadd(t1, parts[half][grp * w + k][1]);
      }
      for (int k = w; k < kRowWarps; k++) { /* the warps without columns there: their 0.0 */
        t0 = fadd(t0, 0.0f);
        t1 = fadd(t1, 0.0f);
      }
      half ^= 1;
      const float c1 = fdiv(t0, static_cast<float>(h));
      const float c2 = beta ? fdiv(t1, static_cast<float>(h)) : 0.0f;
      if (live && in) {
        float dx[V];
#pragma unroll
        for (int k = 0; k < V; k++)
          dx[k] = fmul(fsub(dxhat[k], fadd(fmul(xhat[k], c1), c2)), rc);
        store_dx<DT, V>(a, r * h + c, dx);
      }
    }
    xc[0] = xn[0];
    dc[0] = dn[0];
    mc = mn;
    rc = rn;
  }
  flush();
  __syncthreads();
  if (grp != 0 || !in) return;
  /* the row groups' doubles in order, rounded to f32 */
  float pg[V], pb[V];
#pragma unroll
  for (int k = 0; k < V; k++) {
    double sgd = 0.0, sbd = 0.0;
    for (int q = 0; q < R; q++) {
      sgd += acc[k * nt + q * gt + t];
      sbd += acc[(V + k) * nt + q * gt + t];
    }
    pg[k] = static_cast<float>(sgd);
    pb[k] = static_cast<float>(sbd);
  }
  stv<LUTRA_F32, V>(partial, rb * h + c, pg);
  if (beta) stv<LUTRA_F32, V>(partial, (nrb + rb) * h + c, pb); /* dbeta's */
}

/* The narrow backward (norm_bwd_narrow, then norm_dgamma_final) where rows of h columns take at
 * most kNarrowWarps warps; done = false leaves the rows to the other kernels. */
template <int DT, int PDT, int V>
cudaError_t backward_narrow(const lutra_norm_args *a, const lk_scratch *scratch, cudaStream_t s,
                            bool &done) {
  const int w = narrow_warps<V>(a->hidden);
  done = w > 0;
  if (!done) return cudaSuccess;
  const int threads = 32 * w * (kRowWarps / w); /* as many row groups as kRowThreads holds */
  const int64_t nrb = narrow_row_blocks(a->rows, a->hidden);
  const int smem = 2 * V * threads * static_cast<int>(sizeof(double));
  float *partial = reinterpret_cast<float *>(scratch->bias_partial);
  LKC_LAUNCH((norm_bwd_narrow<DT, PDT, V>), static_cast<unsigned>(nrb), threads, smem, s, *a,
             partial, nrb, w);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const unsigned g2 = static_cast<unsigned>(cdiv<int64_t>(a->hidden, kFinalCols));
  LKC_LAUNCH((norm_dgamma_final<PDT, float>), g2, dim3(kFinalCols, kFinalLanes), 0, s, *a,
             static_cast<const float *>(partial), nrb);
  return cudaGetLastError();
}
