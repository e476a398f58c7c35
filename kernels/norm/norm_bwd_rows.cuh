/* The row-resident norm backward (norm_bwd_rows) and its selection: included by
 * kernels/norm/norm.cu inside its unnamed namespace, after the constants it uses (kGroupRows); no
 * include guard (spec/native/sim_norm.cpp and tools/norm_ab include norm.cu inside namespaces of
 * their own). */

/* The LayerNorm / RMSNorm backward in one pass over x and dy (see the top of the file): dx
 * when asked for, and the dgamma sums of row block blockIdx.x into partial[rb][c] and, for
 * LayerNorm, its dbeta sums into partial[nrb + rb][c] (f32). Dynamic shared memory: two doubles
 * per column a thread holds, then with S > 0 the S stages of rows (kernels/common/bulk_rows.cuh)
 * and their barriers. S = 0: the next row's x and dy loaded into registers during this row (one row
 * ahead); S > 0: rows S ahead brought into shared memory by the copy engine (16-byte rows, V > 1).
 * FULL: rows of exactly NC V kRowThreads columns, no column checks (the staged kernels only). */
/* the backward holds two rows (this one and the next, as loaded) of x and dy: two blocks an SM
 * fit 128 registers up to 32 bytes of each a thread */
template <int DT, int V, int NC> LKC_HD constexpr int bwd_blocks_per_sm() {
  return NC * V * (DT == LUTRA_F32 ? 4 : 2) <= 32 ? 2 : 1;
}

constexpr int kBwdStages = 3; /* rows in flight a block of the staged backward */

/* the staged backward's stage bytes: one row of x and one of dy, then the row's mean and rstd
 * (16 bytes, for the copies' alignment) */
template <int DT> LKC_HD int64_t bwd_stage_bytes(int64_t h) {
  return 2 * h * (DT == LUTRA_F32 ? 4 : 2) + 16;
}

template <int DT, int PDT, int V, int NC, int S, bool FULL>
__global__ void __launch_bounds__(kRowThreads, bwd_blocks_per_sm<DT, V, NC>())
    norm_bwd_rows(lutra_norm_args a, float *partial, int64_t nrb) {
  static_assert(S == 0 || V > 1, "the staged backward takes 16-byte rows");
  __shared__ RowParts parts;
  /* dgamma's sums of this thread's columns, then dbeta's: slot (j V + k) kRowThreads + thread, so
   * that a warp's 8-byte accesses are consecutive (by column, a thread's V columns apart, they
   * were 16-way bank conflicts) */
  double *acc = reinterpret_cast<double *>(lkc::dyn_smem());
  auto slot = [](int j, int k) {
    return (j * V + k) * kRowThreads + static_cast<int>(threadIdx.x);
  };
  constexpr int kBeta = NC * V * kRowThreads;
  constexpr int esz = DT == LUTRA_F32 ? 4 : 2;
  /* RMSNorm has no dbeta and no mean term: its column sums, their doubles and the row's second
   * sum are skipped (a uniform branch) */
  const bool beta = !a.rms;
  const int64_t h = a.hidden, rb = blockIdx.x, rpb = cdiv<int64_t>(a.rows, nrb);
  const int64_t r0 = imin<int64_t>(a.rows, rb * rpb), r1 = imin<int64_t>(a.rows, r0 + rpb);
  /* the stages (bwd_stage_bytes each) S of them after the doubles, the barriers after those */
  const uint32_t row_bytes = static_cast<uint32_t>(h * esz);
  const int64_t stage_bytes = bwd_stage_bytes<DT>(h);
  unsigned char *stages = lkc::dyn_smem() + 2 * kBeta * sizeof(double);
  uint64_t *bars = reinterpret_cast<uint64_t *>(stages + S * stage_bytes);
  /* row r into stage st (row r0 + i takes stage i % S) */
  auto issue = [&](int64_t r, int st) {
    unsigned char *d = stages + st * stage_bytes;
    lkc::stage_expect(&bars[st], 2 * row_bytes);
    lkc::stage_copy(d, static_cast<const char *>(a.x) + r * h * esz, row_bytes, &bars[st]);
    lkc::stage_copy(d + row_bytes, static_cast<const char *>(a.dy) + r * h * esz, row_bytes,
                    &bars[st]);
    float *stats = reinterpret_cast<float *>(d + 2 * row_bytes);
    if (!a.rms) lkc::stage_copy4(stats, a.mean + r);
    lkc::stage_copy4(stats + 1, a.rstd + r);
    lkc::stage_arrive_copies(&bars[st]);
  };
  if constexpr (S > 0) {
    if (threadIdx.x == 0) {
      for (int st = 0; st < S; st++)
        lkc::stage_init(&bars[st], 2);
      for (int64_t r = r0; r < imin<int64_t>(r1, r0 + S); r++)
        issue(r, static_cast<int>(r - r0));
    }
  }
  float g[NC][V], sg[NC][V], sb[NC][V];
  load_params<PDT, V, NC>(a, false, g, sg);
#pragma unroll
  for (int j = 0; j < NC; j++) {
#pragma unroll
    for (int k = 0; k < V; k++) {
      sg[j][k] = sb[j][k] = 0.0f;
      acc[slot(j, k)] = 0.0;
      if (beta) acc[kBeta + slot(j, k)] = 0.0;
    }
  }
  if constexpr (S > 0) __syncthreads(); /* the barriers' init seen by every thread */
  /* the f32 group sums into the doubles: every kGroupRows rows and at the end */
  auto flush = [&] {
#pragma unroll
    for (int j = 0; j < NC; j++)
#pragma unroll
      for (int k = 0; k < V; k++) {
        const int64_t c = col<V>(j) + k;
        if (FULL || c < h) {
          acc[slot(j, k)] += sg[j][k];
          if (beta) acc[kBeta + slot(j, k)] += sb[j][k];
        }
        sg[j][k] = sb[j][k] = 0.0f;
      }
  };
  Raw<DT, V> xc[NC] = {}, xn[NC] = {}, dc[NC] = {}, dn[NC] = {};
  float mc = 0.0f, rc = 0.0f, mn = 0.0f, rn = 0.0f;
  if constexpr (S == 0) {
    if (r0 < r1) {
      load_row<DT, V, NC>(a.x, r0 * h, h, xc);
      load_row<DT, V, NC>(a.dy, r0 * h, h, dc);
      mc = a.rms ? 0.0f : a.mean[r0];
      rc = a.rstd[r0];
    }
  }
  int grouped = 0, half = 0;
  int st = 0;          /* S > 0: row r's stage, (r - r0) % S kept as a counter (a 64-bit */
  uint32_t parity = 0; /* division per row), and the phase its barrier completes, / S & 1 */
  for (int64_t r = r0; r < r1; r++) {
    if constexpr (S > 0) {
      lkc::stage_wait(&bars[st], parity);
      const unsigned char *d = stages + st * stage_bytes;
      load_row<DT, V, NC, FULL>(d, 0, h, xc);
      load_row<DT, V, NC, FULL>(d + row_bytes, 0, h, dc);
      const float *stats = reinterpret_cast<const float *>(d + 2 * row_bytes);
      mc = a.rms ? 0.0f : stats[0];
      rc = stats[1];
    } else if (r + 1 < r1) {
      load_row<DT, V, NC>(a.x, (r + 1) * h, h, xn);
      load_row<DT, V, NC>(a.dy, (r + 1) * h, h, dn);
      mn = a.rms ? 0.0f : a.mean[r + 1];
      rn = a.rstd[r + 1];
    }
    /* the residual's gradient for this row's dx, loaded now so that its latency passes under
     * the row's sums and their barriers instead of before each store */
    Raw<DT, V> addc[NC] = {};
    if (a.dx && a.dx_add) load_row<DT, V, NC, FULL>(a.dx_add, r * h, h, addc);
    float xhat[NC][V], dxhat[NC][V];
    float s[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < NC; j++) {
      float x[V], dy[V];
      unraw<DT, V>(xc[j], x);
      unraw<DT, V>(dc[j], dy);
      const bool in = FULL || col<V>(j) < h;
#pragma unroll
      for (int k = 0; k < V; k++) {
        xhat[j][k] = fmul(fsub(x[k], mc), rc);
        dxhat[j][k] = fmul(dy[k], g[j][k]);
        if (!in) continue;
        sg[j][k] = fadd(sg[j][k], fmul(dy[k], xhat[j][k]));
        s[0] = fadd(s[0], fmul(dxhat[j][k], xhat[j][k]));
        if (!beta) continue;
        sb[j][k] = fadd(sb[j][k], dy[k]);
        s[1] = fadd(s[1], dxhat[j][k]);
      }
    }
    if (++grouped == kGroupRows) {
      flush();
      grouped = 0;
    }
    float c1 = 0.0f, c2 = 0.0f;
    if (a.dx) {
      /* its barrier: every thread's reads of the stage done */
      if (beta) {
        row_reduce_all<2>(s, parts, half);
        c2 = fdiv(s[1], static_cast<float>(h));
      } else {
        float s0[1] = {s[0]};
        row_reduce_all<1>(s0, parts, half);
        s[0] = s0[0];
      }
      c1 = fdiv(s[0], static_cast<float>(h));
    } else if constexpr (S > 0) {
      __syncthreads();
    }
    if constexpr (S > 0) {
      if (threadIdx.x == 0 && r + S < r1) {
        lkc::stage_reuse_fence();
        issue(r + S, st); /* row r's stage */
      }
    }
    if (a.dx) {
#pragma unroll
      for (int j = 0; j < NC; j++) {
        const int64_t c = col<V>(j);
        if (!FULL && c >= h) continue;
        float dx[V];
#pragma unroll
        for (int k = 0; k < V; k++)
          dx[k] = fmul(fsub(dxhat[j][k], fadd(fmul(xhat[j][k], c1), c2)), rc);
        store_dx_plus<DT, V>(a, r * h + c, dx, a.dx_add ? &addc[j] : nullptr);
      }
    }
    if constexpr (S == 0) {
#pragma unroll
      for (int j = 0; j < NC; j++) {
        xc[j] = xn[j];
        dc[j] = dn[j];
      }
      mc = mn;
      rc = rn;
    } else if (++st == S) {
      st = 0;
      parity ^= 1;
    }
  }
  flush();
  /* a thread's V columns in 16-byte stores (h is a multiple of V): stored a column at a time, a
   * warp's stores were V floats apart, four times the sectors */
#pragma unroll
  for (int j = 0; j < NC; j++) {
    const int64_t c = col<V>(j);
    if (!FULL && c >= h) continue;
    float pg[V], pb[V];
#pragma unroll
    for (int k = 0; k < V; k++) {
      pg[k] = static_cast<float>(acc[slot(j, k)]);
      pb[k] = static_cast<float>(acc[kBeta + slot(j, k)]);
    }
    stv<LUTRA_F32, V>(partial, rb * h + c, pg);
    if (!a.rms) stv<LUTRA_F32, V>(partial, (nrb + rb) * h + c, pb); /* dbeta's */
  }
}

using bwd_fn = void (*)(lutra_norm_args, float *, int64_t);
template <int DT, int PDT, int V, int NC, int S, bool FULL> std::atomic<uint64_t> bwd_smem_allowed;

/* the staged backward's dynamic shared memory for rows of h columns, ncols of them a thread */
template <int DT, int S> int bwd_smem_bytes(int ncols, int64_t h) {
  return ncols * kRowThreads * 2 * static_cast<int>(sizeof(double)) +
         S * static_cast<int>(bwd_stage_bytes<DT>(h) + sizeof(uint64_t));
}

/* the row-resident backward of S stages for rows of up to kResident elements a thread, or
 * nullptr; smem: the dynamic shared memory it takes (two doubles for each of a thread's columns;
 * the stages and their barriers), allowed. The allowance is set once per kernel and device, so
 * it is the most any row width of that kernel takes (capped at the device's opt-in): set for the
 * first width alone, a wider row's launch later failed (cudaErrorInvalidValue). */
template <int DT, int PDT, int V, int S>
bwd_fn bwd_rows_kernel_s(int64_t h, cudaError_t &e, int &smem) {
  const int64_t nc = cdiv<int64_t>(h, static_cast<int64_t>(kRowThreads) * V);
  auto pick = [&](auto k, std::atomic<uint64_t> &done, int ncols) -> bwd_fn {
    smem = bwd_smem_bytes<DT, S>(ncols, h);
    const int optin = lkc::smem_optin();
    if (S > 0 && smem > optin) return nullptr; /* the stages do not fit */
    const int widest = bwd_smem_bytes<DT, S>(ncols, static_cast<int64_t>(ncols) * kRowThreads);
    e = lkc::allow_smem(k, widest < optin ? widest : optin, done);
    return k;
  };
  e = cudaSuccess;
  /* FULL (rows that fill every thread's chunks, no column checks) for the staged kernels alone:
   * the register-loading one is the fallback, not worth twice its instantiations */
  auto of = [&](auto nc_c) -> bwd_fn {
    constexpr int NC = decltype(nc_c)::value;
    if constexpr (S > 0)
      if (rows_full<V, NC>(h))
        return pick(norm_bwd_rows<DT, PDT, V, NC, S, true>,
                    bwd_smem_allowed<DT, PDT, V, NC, S, true>, NC * V);
    return pick(norm_bwd_rows<DT, PDT, V, NC, S, false>, bwd_smem_allowed<DT, PDT, V, NC, S, false>,
                NC * V);
  };
  if (nc <= 1) return of(std::integral_constant<int, 1>());
  if (nc <= 2) return of(std::integral_constant<int, 2>());
  if (nc <= 4) return of(std::integral_constant<int, 4>());
  /* 64 bytes of x a thread at most: f32 rows of 8 vectors would spill */
  if constexpr (8 * V * (DT == LUTRA_F32 ? 4 : 2) <= 64)
    if (nc <= 8) return of(std::integral_constant<int, 8>());
  return nullptr;
}

/* the staged backward where rows are 16-byte vectors, the device has the bulk copy engine
 * (sm_90 on) and a block's shared memory holds the stages, else the one loading a row ahead
 * into registers */
template <int DT, int PDT, int V> bwd_fn bwd_rows_kernel(int64_t h, cudaError_t &e, int &smem) {
  if constexpr (V > 1) {
    if (lkc::bulk_copies())
      if (bwd_fn k = bwd_rows_kernel_s<DT, PDT, V, kBwdStages>(h, e, smem)) return k;
  }
  return bwd_rows_kernel_s<DT, PDT, V, 0>(h, e, smem);
}
