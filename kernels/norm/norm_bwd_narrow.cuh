/* The norm backward for narrow rows (norm_bwd_narrow) and its launch: included by
 * kernels/norm/norm.cu inside its unnamed namespace, after norm_bwd_rows.cuh and norm_dgamma_final;
 * no include guard (spec/native/sim_norm.cpp includes norm.cu inside a namespace of its own).
 *
 * norm_bwd_rows gives a row a block of kRowThreads threads, one chunk of V columns each, and the
 * whole block waits at a barrier every row: rows of fewer than kRowThreads chunks leave threads
 * idle (160 of 256 at 768 bf16 columns) while the block's few rows in flight leave the memory
 * system waiting. Here a row takes one warp and no barrier: lane l holds chunks l, l + 32, ...,
 * l + 32 (NC - 1), which are norm_bwd_rows' threads l, l + 32, ... (the chunks of its warps 0 ..
 * NC - 1), and the block's warps take rows side by side. The row's sums take row_reduce_all's
 * order: chunk j's butterfly over the lanes (norm_bwd_rows' warp j's), then those NC sums from
 * 0.0 in order, adding 0.0 for each of the kRowWarps - NC warps that hold no columns there: dx
 * has the same bits (and the CPU reference's). dgamma and dbeta: each thread's f32 sums over
 * kGroupRows rows into its doubles in shared memory, the warps' doubles added in order at the
 * end into partial[rb][c] (another order of the column sums, within the bound norm_bwd_rows' sums
 * keep). A lane holds its rows' x, dy and residual gradient only; gamma is read from shared
 * memory, and xhat is formed again for dx after the sums, so that 3 and 4 chunks a lane fit the
 * registers of several blocks an SM: the many warps' rows in flight hide the memory latency. */

/* the most chunks a lane of the narrow backward takes: 4 (1024 bf16 columns; RMSNorm's 3, see
 * backward_narrow). Rows of one chunk a lane keep the next row's loads in registers too, wider
 * ones rely on the warps in flight. */
constexpr int kNarrowChunks = 4;

/* the chunks a lane takes for rows of h columns (norm_bwd_narrow's NC), or 0 where the row is
 * too wide; unaligned rows (V = 1) take one column a lane at most */
template <int V> int narrow_chunks(int64_t h) {
  const int64_t nc = cdiv<int64_t>(cdiv<int64_t>(h, V), 32);
  return nc <= (V == 1 ? 1 : kNarrowChunks) ? static_cast<int>(nc) : 0;
}

/* the block: 8 warps, 4 where a lane holds 4 chunks (its 168 registers leave 12 warps an SM) */
LKC_HD constexpr int narrow_threads(int nc) {
  return nc <= 3 ? kRowThreads : kRowThreads / 2;
}

/* rows per row block at least: 2 a warp when a lane holds one chunk, 8 else (each row block
 * starts by zeroing, and ends by adding, doubles that grow with NC) */
inline int64_t narrow_min_rows(int nc) {
  return (nc == 1 ? 2 : 8) * (narrow_threads(nc) / 32);
}

/* the row blocks of the narrow backward: f32 partials as the rows kernel's, a function of rows and
 * hidden only */
inline int64_t narrow_row_blocks(int64_t rows, int64_t hidden, int nc) {
  const int64_t fit = 2 * static_cast<int64_t>(LK_BIAS_PARTIALS) / (2 * hidden);
  return imax<int64_t>(1, imin<int64_t>(cdiv<int64_t>(rows, narrow_min_rows(nc)), fit));
}

/* the narrow backward's dynamic shared memory: gamma as f32 (NC 32 V), then two doubles for each
 * of a thread's NC V columns */
template <int V, int NC> int narrow_smem_bytes() {
  return NC * 32 * V * static_cast<int>(sizeof(float)) +
         2 * NC * V * narrow_threads(NC) * static_cast<int>(sizeof(double));
}

/* blocks an SM: 16 warps, 12 where a lane holds 4 chunks (its registers would spill at 128) */
template <int NC> LKC_HD constexpr int narrow_blocks_per_sm() {
  return NC <= 3 ? 2 : 3;
}

/* Block rb: the rows of row block rb, a warp's rows blockDim.x / 32 apart. */
template <int DT, int PDT, int V, int NC>
__global__ void __launch_bounds__(narrow_threads(NC), narrow_blocks_per_sm<NC>())
    norm_bwd_narrow(lutra_norm_args a, float *partial, int64_t nrb) {
  constexpr int nt = narrow_threads(NC), nw = nt / 32;
  constexpr bool AHEAD = NC == 1; /* the next row's loads issued before this row's work */
  float *gam = reinterpret_cast<float *>(lkc::dyn_smem());
  double *acc = reinterpret_cast<double *>(lkc::dyn_smem() + NC * 32 * V * sizeof(float));
  auto slot = [](int j, int k) { return (j * V + k) * nt + static_cast<int>(threadIdx.x); };
  constexpr int kBeta = NC * V * nt;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int64_t h = a.hidden;
  const bool beta = !a.rms;
  const int64_t rb = blockIdx.x, rpb = cdiv<int64_t>(a.rows, nrb);
  const int64_t r0 = imin<int64_t>(a.rows, rb * rpb), r1 = imin<int64_t>(a.rows, r0 + rpb);
  auto chunk = [&](int j) { return static_cast<int64_t>(lane + 32 * j) * V; };
  for (int c = static_cast<int>(threadIdx.x); c < NC * 32 * V; c += nt)
    gam[c] = c < h ? gamma_at<PDT>(a, c) : 0.0f;
  float sg[NC][V], sb[NC][V];
#pragma unroll
  for (int j = 0; j < NC; j++)
#pragma unroll
    for (int k = 0; k < V; k++) {
      sg[j][k] = sb[j][k] = 0.0f;
      acc[slot(j, k)] = 0.0;
      acc[kBeta + slot(j, k)] = 0.0;
    }
  __syncthreads(); /* gamma in shared memory */
  auto flush = [&] {
#pragma unroll
    for (int j = 0; j < NC; j++)
#pragma unroll
      for (int k = 0; k < V; k++) {
        acc[slot(j, k)] += sg[j][k];
        acc[kBeta + slot(j, k)] += sb[j][k];
        sg[j][k] = sb[j][k] = 0.0f;
      }
  };
  /* row r's loads: this lane's chunks of x, dy and the residual's gradient, the statistics */
  struct Row {
    Raw<DT, V> x[NC], dy[NC], add[NC];
    float mean, rstd;
  };
  auto load = [&](int64_t r, Row &w) {
#pragma unroll
    for (int j = 0; j < NC; j++) {
      w.x[j] = w.dy[j] = w.add[j] = Raw<DT, V>{};
      if (chunk(j) >= h) continue;
      w.x[j] = raw_at<DT, V>(a.x, r * h + chunk(j));
      w.dy[j] = raw_at<DT, V>(a.dy, r * h + chunk(j));
      if (a.dx && a.dx_add) w.add[j] = raw_at<DT, V>(a.dx_add, r * h + chunk(j));
    }
    w.mean = a.rms ? 0.0f : a.mean[r];
    w.rstd = a.rstd[r];
  };
  /* xhat and dxhat of chunk j, the same operations for the sums and for dx */
  auto terms = [&](const Row &w, int j, float(&xhat)[V], float(&dxhat)[V]) {
    float x[V], dy[V];
    unraw<DT, V>(w.x[j], x);
    unraw<DT, V>(w.dy[j], dy);
#pragma unroll
    for (int k = 0; k < V; k++) {
      xhat[k] = fmul(fsub(x[k], w.mean), w.rstd);
      dxhat[k] = fmul(dy[k], gam[chunk(j) + k]);
    }
  };
  Row cur, next;
  int grouped = 0;
  int64_t r = r0 + warp;
  if (AHEAD && r < r1) load(r, cur);
  for (; r < r1; r += nw) {
    if (AHEAD) {
      if (r + nw < r1) load(r + nw, next);
    } else {
      load(r, cur);
    }
    float s0[NC], s1[NC];
#pragma unroll
    for (int j = 0; j < NC; j++) {
      s0[j] = s1[j] = 0.0f;
      const bool in = chunk(j) < h;
      float xhat[V], dxhat[V], dy[V];
      terms(cur, j, xhat, dxhat);
      unraw<DT, V>(cur.dy[j], dy);
#pragma unroll
      for (int k = 0; k < V; k++) {
        if (!in) continue;
        sg[j][k] = fadd(sg[j][k], fmul(dy[k], xhat[k]));
        s0[j] = fadd(s0[j], fmul(dxhat[k], xhat[k]));
        if (!beta) continue;
        sb[j][k] = fadd(sb[j][k], dy[k]);
        s1[j] = fadd(s1[j], dxhat[k]);
      }
    }
    if (++grouped == kGroupRows) {
      flush();
      grouped = 0;
    }
    if (a.dx) {
      float t0 = 0.0f, t1 = 0.0f;
#pragma unroll
      for (int j = 0; j < NC; j++) {
        t0 = fadd(t0, warp_sum(s0[j]));
        if (beta) t1 = fadd(t1, warp_sum(s1[j]));
      }
#pragma unroll
      for (int j = NC; j < kRowWarps; j++) { /* norm_bwd_rows' warps without columns: their 0.0 */
        t0 = fadd(t0, 0.0f);
        t1 = fadd(t1, 0.0f);
      }
      const float c1 = fdiv(t0, static_cast<float>(h));
      const float c2 = beta ? fdiv(t1, static_cast<float>(h)) : 0.0f;
#pragma unroll
      for (int j = 0; j < NC; j++) {
        if (chunk(j) >= h) continue;
        float xhat[V], dxhat[V], dx[V];
        terms(cur, j, xhat, dxhat);
#pragma unroll
        for (int k = 0; k < V; k++)
          dx[k] = fmul(fsub(dxhat[k], fadd(fmul(xhat[k], c1), c2)), cur.rstd);
        store_dx_plus<DT, V>(a, r * h + chunk(j), dx, a.dx_add ? &cur.add[j] : nullptr);
      }
    }
    if (AHEAD) cur = next;
  }
  flush();
  __syncthreads();
  if (warp != 0) return;
    /* the warps' doubles in order, rounded to f32 */
#pragma unroll
  for (int j = 0; j < NC; j++) {
    if (chunk(j) >= h) continue;
    float pg[V], pb[V];
#pragma unroll
    for (int k = 0; k < V; k++) {
      double sgd = 0.0, sbd = 0.0;
      for (int q = 0; q < nw; q++) {
        sgd += acc[slot(j, k) + 32 * q];
        sbd += acc[kBeta + slot(j, k) + 32 * q];
      }
      pg[k] = static_cast<float>(sgd);
      pb[k] = static_cast<float>(sbd);
    }
    stv<LUTRA_F32, V>(partial, rb * h + chunk(j), pg);
    if (beta) stv<LUTRA_F32, V>(partial, (nrb + rb) * h + chunk(j), pb); /* dbeta's */
  }
}

template <int DT, int PDT, int V, int NC> std::atomic<uint64_t> narrow_smem_allowed;

/* The narrow backward (norm_bwd_narrow, then norm_dgamma_final) where a lane takes at most
 * kNarrowChunks chunks of the row; done = false leaves the rows to the other kernels. */
template <int DT, int PDT, int V>
cudaError_t backward_narrow(const lutra_norm_args *a, const lk_scratch *scratch, cudaStream_t s,
                            bool &done) {
  const int nc = narrow_chunks<V>(a->hidden);
  /* RMSNorm's rows of 4 chunks a lane stay with norm_bwd_rows, which measured faster for them
   * (without dbeta its per-row work is less, and this kernel has 12 warps an SM there); LayerNorm's
   * are faster here */
  done = nc > 0 && !(nc == 4 && a->rms);
  if (!done) return cudaSuccess;
  const int64_t nrb = narrow_row_blocks(a->rows, a->hidden, nc);
  float *partial = reinterpret_cast<float *>(scratch->bias_partial);
  auto launch = [&](auto nc_c) {
    constexpr int NC = decltype(nc_c)::value;
    constexpr auto k = norm_bwd_narrow<DT, PDT, V, NC>;
    const int threads = narrow_threads(NC), smem = narrow_smem_bytes<V, NC>();
    cudaError_t e = lkc::allow_smem(k, smem, narrow_smem_allowed<DT, PDT, V, NC>);
    if (e != cudaSuccess) return e;
    LKC_LAUNCH(k, static_cast<unsigned>(nrb), threads, smem, s, *a, partial, nrb);
    return cudaGetLastError();
  };
  cudaError_t e;
  if constexpr (V == 1) {
    e = launch(std::integral_constant<int, 1>());
  } else {
    static_assert(kNarrowChunks == 4, "a launch for each chunk count");
    switch (nc) {
    case 1:
      e = launch(std::integral_constant<int, 1>());
      break;
    case 2:
      e = launch(std::integral_constant<int, 2>());
      break;
    case 3:
      e = launch(std::integral_constant<int, 3>());
      break;
    default:
      e = launch(std::integral_constant<int, 4>());
      break;
    }
  }
  if (e != cudaSuccess) return e;
  const unsigned g2 = static_cast<unsigned>(cdiv<int64_t>(a->hidden, kFinalCols));
  LKC_LAUNCH((norm_dgamma_final<PDT, float>), g2, dim3(kFinalCols, kFinalLanes), 0, s, *a,
             static_cast<const float *>(partial), nrb);
  return cudaGetLastError();
}
