/* The norm writing a GEMM's FP8 input (kernels.h: lk_norm_quantize; semantics:
 * lutra_norm_quant_args in src/backend/backend.h, reference
 * src/backend/cpu/norm_quantize_cpu.c = layernorm_forward followed by the quantizer).
 *
 * Per-tensor scaling with rows of up to 8192 elements takes the row-resident kernels
 * (kernels/norm/norm_quantize_rows.cuh: one pass over x, both copies' codes from it). Block
 * scaling, per-tensor current scaling with both copies, and per-tensor scaling with both copies
 * of a large matrix of wider rows, take the tile path where there is room for the rows'
 * statistics (launch_tiles below: the statistics (with max|y| and the scale, current scaling),
 * then the quantizer's own tile kernel normalizing as it loads). Elsewhere (block scaling of f32 or
 * unaligned inputs, per-tensor rows wider than 8192 elements) the tile kernel of
 * norm_quantize_tile.cuh. */
#include "common/elements.cuh"
#include "common/launch.cuh"
#include "common/scale.cuh"
#include "norm_rows.cuh"
#include "quantize/quantize_tiles.cuh"

using namespace lkc;

#include "norm_quantize_tile.cuh"

#include "norm_quantize_rows.cuh"

namespace {

template <class F> cudaError_t with_param_dtype(int dt, F &&f) {
  if (dt == LUTRA_F32) return f(std::integral_constant<int, LUTRA_F32>());
  if (dt == LUTRA_BF16) return f(std::integral_constant<int, LUTRA_BF16>());
  return cudaErrorInvalidValue;
}

template <class F> cudaError_t with_mode(int scaling, F &&f) {
  if (scaling == LUTRA_SCALING_TENSOR) return f(std::integral_constant<int, kTensor>());
  if (scaling == LUTRA_SCALING_MXFP8) return f(std::integral_constant<int, kMx>());
  if (scaling == LUTRA_SCALING_BLOCK_1D) return f(std::integral_constant<int, kBlock>());
  return cudaErrorInvalidValue;
}

std::atomic<uint64_t> smem_allowed[3][3][2][3][2];
template <int DT, int PDT, int OD, int V, int NC, int CL, bool FULL>
std::atomic<uint64_t> rows_smem_allowed;

#ifndef LK_STAGED_CLUSTER
#define LK_STAGED_CLUSTER 2
#endif
/* the blocks of a cluster of k_norm_quantize_staged on sm_90 and later (16-byte rows): two
 * measured faster than four or eight, and than the tile path (docs/lab/) */
constexpr int kStagedCluster = LK_STAGED_CLUSTER;

/* the cluster size of the staged kernel for the current device: kStagedCluster where clusters
 * launch (sm_90 on), else 1; 1 under the CPU simulation, which runs blocks one at a time */
template <int V> int staged_cluster() {
#ifdef LKC_SIM
  return 1;
#else
  return V > 1 && lkc::device_attr<cudaDevAttrComputeCapabilityMajor>(1) >= 9 ? kStagedCluster : 1;
#endif
}

using rows_fn = void (*)(Params);

/* k_norm_quantize_rows, or when stage the staged kernel in clusters of cl blocks, allowed the
 * shared memory of its widest row */
template <int DT, int PDT, int OD, int V, int NC, bool FULL>
rows_fn rows_kernel_of(bool stage, int cl, cudaError_t &e) {
  if (!stage) return k_norm_quantize_rows<DT, PDT, OD, V, NC, FULL>;
  auto allow = [&](auto k, std::atomic<uint64_t> &done) -> rows_fn {
    e = lkc::allow_smem(k, kQRows * kRowThreads * V * NC, done);
    return k;
  };
  if constexpr (V > 1 && kStagedCluster > 1)
    if (cl == kStagedCluster)
      return allow(k_norm_quantize_staged<DT, PDT, OD, V, NC, kStagedCluster, FULL>,
                   rows_smem_allowed<DT, PDT, OD, V, NC, kStagedCluster, FULL>);
  return allow(k_norm_quantize_staged<DT, PDT, OD, V, NC, 1, FULL>,
               rows_smem_allowed<DT, PDT, OD, V, NC, 1, FULL>);
}

/* the per-tensor row-resident kernel for rows of h columns, up to kResident elements a thread
 * (staging the columnwise codes when stage), or nullptr */
template <int DT, int PDT, int OD, int V>
rows_fn rows_kernel(int64_t h, bool stage, int cl, cudaError_t &e) {
  e = cudaSuccess;
  return with_resident_chunks<V, rows_fn>(h, [&](auto nc) -> rows_fn {
    constexpr int NC = decltype(nc)::value;
    return rows_full<V, NC>(h) ? rows_kernel_of<DT, PDT, OD, V, NC, true>(stage, cl, e)
                               : rows_kernel_of<DT, PDT, OD, V, NC, false>(stage, cl, e);
  });
}

/* a launch of the row-resident kernel k in clusters of cl blocks (cl > 1: sm_90 on) */
cudaError_t launch_rows(rows_fn k, unsigned grid, int smem, int cl, cudaStream_t s,
                        const Params &q) {
#ifndef LKC_SIM
  if (cl > 1) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = static_cast<unsigned>(cl);
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(kRowThreads);
    cfg.dynamicSmemBytes = static_cast<size_t>(smem);
    cfg.stream = s;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, k, q);
  }
#else
  (void)cl;
#endif
  LKC_LAUNCH(k, grid, kRowThreads, smem, s, q);
  return cudaGetLastError();
}

/* norm_fwd's vector width: 16 bytes when every row of x (and of y, when written) is aligned */
bool vec_ok(const lutra_norm_args *a, int dt) {
  const int64_t bytes = a->hidden * (dt == LUTRA_F32 ? 4 : 2);
  return bytes % 16 == 0 && aligned(a->x, 16) && (!a->y || aligned(a->y, 16));
}

/* The statistics from the row-resident kernel, then the quantizer's own tile kernel normalizing
 * each tile as it loads it (lkq::NormIn): k_cast16 (per-tensor), k_mx16 (MXFP8), k_block16 /
 * k_block (1x128). Those read x once more but run near the quantizer's rate, where this file's tile
 * kernel, which stages f32 values through shared memory, and the staged per-tensor kernel ran at a
 * fraction of it (docs/lab/). Taken where there is room for the statistics (rows' mean and rstd
 * given: kept for backward, or the CUDA backend's scratch), a columnwise copy or block scaling is
 * asked for, x is 16-bit, every buffer is
 * 16-byte aligned and the dims suit the quantizer's vector path; returns cudaErrorNotSupported
 * (having launched nothing) elsewhere. */
#ifndef LK_TILE_MIN_TENSOR_ELEMS /* spec/native/sim_norm.cpp lowers it: its shapes are small */
#define LK_TILE_MIN_TENSOR_ELEMS (int64_t(1) << 22)
#endif
constexpr int64_t kTileMinTensorElems = LK_TILE_MIN_TENSOR_ELEMS;

/* whether a call suits the tile path, the statistics' room aside (lk_norm_quantize_tiles):
 * data / col_data the rowwise / columnwise codes asked for */
bool tiles_suit(const lutra_norm_args &n, const void *data, const void *col_data, int scaling,
                bool vec, bool current) {
  const int64_t multiple = scaling == LUTRA_SCALING_MXFP8 ? 32 : 16;
  /* per-tensor: the row-resident kernels (one pass over x, rowwise only or both copies) are
   * faster where they take the rows (docs/lab/); a large matrix takes the tiles where its rows
   * are wider than they hold, or so narrow that most of a row's threads would idle (at GPT-2's
   * 768 columns, both copies, the staged kernel took 1.4x the statistics' warps + k_cast16), or
   * under current scaling, whose first pass reads x anyway (the statistics come with max|y|) */
  const bool narrow = row_stats_by_warps<8>(n.hidden);
  return vec &&
         (scaling != LUTRA_SCALING_TENSOR ||
          (col_data && (n.hidden > kResident * kRowThreads || narrow || current) &&
           n.rows * n.hidden >= kTileMinTensorElems)) &&
         (n.dtype == LUTRA_BF16 || n.dtype == LUTRA_F16) && n.rows > 0 &&
         n.hidden % multiple == 0 &&
         (n.rows % multiple == 0 || (scaling == LUTRA_SCALING_BLOCK_1D && !col_data)) &&
         aligned(n.gamma, 16) && (n.rms || aligned(n.beta, 16)) && aligned(data, 16) &&
         aligned(col_data, 16) && (!n.y || aligned(n.y, 16)) &&
         cdiv<int64_t>(n.rows, 128) * cdiv<int64_t>(n.hidden, 128) < UINT32_MAX;
}

/* current scaling's first pass on the tile path (k_row_stats_amax), or nullptr */
void (*stats_amax_kernel(const lutra_norm_args &n))(Params) {
  const bool f32 = n.param_dtype == LUTRA_F32;
  if (n.dtype == LUTRA_BF16)
    return f32 ? row_stats_amax_kernel<LUTRA_BF16, LUTRA_F32, vec16<LUTRA_BF16>()>(n.hidden)
               : row_stats_amax_kernel<LUTRA_BF16, LUTRA_BF16, vec16<LUTRA_BF16>()>(n.hidden);
  return f32 ? row_stats_amax_kernel<LUTRA_F16, LUTRA_F32, vec16<LUTRA_F16>()>(n.hidden)
             : row_stats_amax_kernel<LUTRA_F16, LUTRA_BF16, vec16<LUTRA_F16>()>(n.hidden);
}

cudaError_t launch_tiles(const Params &p, int scaling, int out_dtype, bool vec, bool current,
                         cudaStream_t s) {
  const lutra_norm_args &n = p.n;
  const bool ok = n.rstd && (n.rms || n.mean) &&
                  tiles_suit(n, p.data, p.col_data, scaling, vec, current) &&
                  (n.param_dtype == LUTRA_F32 || n.param_dtype == LUTRA_BF16);
  auto sk = !ok || current          ? nullptr
            : n.dtype == LUTRA_BF16 ? row_stats_kernel<LUTRA_BF16, vec16<LUTRA_BF16>()>(n.hidden)
                                    : row_stats_kernel<LUTRA_F16, vec16<LUTRA_F16>()>(n.hidden);
  auto ak = ok && current ? stats_amax_kernel(n) : nullptr;
  if (!sk && !ak) return cudaErrorNotSupported;
  lkq::TileArgs t;
  memset(&t, 0, sizeof t);
  t.x = n.x;
  t.rows = n.rows;
  t.cols = n.hidden;
  t.skip = p.skip;
  t.data = p.data;
  t.col_data = p.col_data;
  t.scale_inv = p.scale_inv;
  t.col_scale_inv = p.col_scale_inv;
  t.max_rcp = p.max_rcp;
  t.fp8_max = p.fp8_max;
  t.eps = p.amax_epsilon;
  t.power_2_scale = p.power_2_scale;
  t.norm = {n.rms ? nullptr : n.mean, n.rstd, n.gamma,
            n.rms ? nullptr : n.beta, n.y,    n.param_dtype == LUTRA_F32,
            n.zero_centered_gamma};
  if (scaling == LUTRA_SCALING_TENSOR) {
    t.scale = p.scale;
    t.amax = current ? nullptr : p.amax; /* current: the first pass writes amax and scale */
    t.cast_scale_inv = static_cast<float *>(p.scale_inv);
    t.cast_col_scale_inv = static_cast<float *>(p.col_scale_inv);
  }
  const int64_t stat_rows = row_stats_rows<8>(n.hidden); /* vec16 of a 16-bit dtype */
  const unsigned stat_grid = static_cast<unsigned>(cdiv<int64_t>(n.rows, stat_rows));
  if (ak)
    LKC_LAUNCH(ak, stat_grid, kRowThreads, 0, s, p);
  else
    LKC_LAUNCH(sk, stat_grid, kRowThreads, 0, s, n, p.skip);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  if (scaling == LUTRA_SCALING_BLOCK_1D) return lkq::launch_block_norm(t, n.dtype, out_dtype, s);
  return lkq::launch_t128(t, n.dtype, out_dtype, scaling == LUTRA_SCALING_MXFP8, s);
}

/* k_norm_quantize_rows' rows a block: an even share of one wave (its blocks an SM: three up to
 * 16 elements a thread, else one), at least kQRows */
int64_t pair_rows_per_block(int64_t rows, int64_t hidden) {
  return wave_share_rows(rows, hidden <= 16 * static_cast<int64_t>(kRowThreads) ? 3 : 1, kQRows);
}

/* k_norm_quantize_staged's blocks, clusters of cl: one wave (three blocks an SM up to 16
 * elements a thread, as its launch bounds, else one), trimmed so that every cluster takes the
 * same number of super groups (cl groups of kQRows rows; the last clusters one fewer) */
unsigned staged_grid(int64_t rows, int64_t hidden, int cl) {
  const int64_t supers = cdiv<int64_t>(cdiv<int64_t>(rows, kQRows), cl);
  const int64_t slots = (hidden <= 16 * static_cast<int64_t>(kRowThreads) ? 3 : 1) *
                        static_cast<int64_t>(lkc::num_sms()) / cl;
  return static_cast<unsigned>(
      cl * imax<int64_t>(1, cdiv<int64_t>(supers, cdiv<int64_t>(supers, imax<int64_t>(1, slots)))));
}

cudaError_t launch(const Params &p, int scaling, int out_dtype, bool vec, cudaStream_t s) {
  const lutra_norm_args &n = p.n;
  return with_float_dtype(n.dtype, [&](auto t) {
    constexpr int DT = decltype(t)::value;
    return with_param_dtype(n.param_dtype, [&](auto pt) {
      constexpr int PDT = decltype(pt)::value;
      return lkc::with_fp8_dtype(out_dtype, [&](auto ot) {
        constexpr int OD = decltype(ot)::value;
        return with_mode(scaling, [&](auto mt) {
          constexpr int MODE = decltype(mt)::value;
          if constexpr (MODE == kTensor) {
            cudaError_t e;
            const bool stage = p.col_data && !p.amax_pass;
            const int cl = !stage ? 1 : vec ? staged_cluster<vec16<DT>()>() : 1;
            auto k = vec ? rows_kernel<DT, PDT, OD, vec16<DT>()>(n.hidden, stage, cl, e)
                         : rows_kernel<DT, PDT, OD, 1>(n.hidden, stage, cl, e);
            if (e != cudaSuccess) return e;
            if (k) {
              Params q = p;
              q.pair_rows = pair_rows_per_block(n.rows, n.hidden);
              const unsigned grid =
                  stage
                      ? staged_grid(n.rows, n.hidden, cl)
                      : static_cast<unsigned>(imax<int64_t>(1, cdiv<int64_t>(n.rows, q.pair_rows)));
              const int smem = stage ? static_cast<int>(kQRows * n.hidden) : 0;
              return launch_rows(k, grid, smem, cl, s, q);
            }
          }
          Params q = p;
          /* block scaling with the statistics kept for backward: they come first from the
           * row-resident kernel (two launches, each near the bandwidth) */
          if (MODE != kTensor && n.rstd && (n.rms || n.mean) && n.rows > 0) {
            auto sk = vec ? row_stats_kernel<DT, vec16<DT>()>(n.hidden)
                          : row_stats_kernel<DT, 1>(n.hidden);
            if (sk) {
              const int64_t stat_rows =
                  vec ? row_stats_rows<vec16<DT>()>(n.hidden) : row_stats_rows<1>(n.hidden);
              LKC_LAUNCH(sk, static_cast<unsigned>(cdiv<int64_t>(n.rows, stat_rows)), kRowThreads,
                         0, s, n, p.skip);
              const cudaError_t e = cudaGetLastError();
              if (e != cudaSuccess) return e;
              q.stats_ready = 1;
            }
          }
          constexpr int TR = TileShape<MODE>::TR, SMEM = smem_bytes<MODE>();
          const unsigned grid = static_cast<unsigned>(imax<int64_t>(1, cdiv<int64_t>(n.rows, TR)));
          auto run = [&](auto kernel, int vi) {
            cudaError_t e = lkc::allow_smem(
                kernel, SMEM, smem_allowed[DT][PDT][OD == LUTRA_E4M3 ? 0 : 1][MODE][vi]);
            if (e != cudaSuccess) return e;
            LKC_LAUNCH(kernel, grid, kThreads, SMEM, s, q);
            return cudaGetLastError();
          };
          if (vec) return run(k_norm_quantize<DT, PDT, OD, vec16<DT>(), MODE>, 1);
          return run(k_norm_quantize<DT, PDT, OD, 1, MODE>, 0);
        });
      });
    });
  });
}

bool bad(const lutra_norm_quant_args *a) {
  const lutra_norm_args &n = a->norm;
  const lutra_quant_args &q = a->quant;
  if (n.rows < 0 || n.hidden <= 0 || n.rows > 0x7FFFFFFF || !is_float_dtype(n.dtype) || !n.x ||
      !n.gamma || (!n.rms && !n.beta))
    return true;
  if ((q.data && !q.scale_inv) || (q.col_data && !q.col_scale_inv)) return true;
  if (a->scaling == LUTRA_SCALING_TENSOR) return !q.scale || (a->current && (!q.amax || !a->work));
  if (a->current) return true;
  if (a->scaling == LUTRA_SCALING_MXFP8)
    return (q.data && n.hidden % 32 != 0) || (q.col_data && n.rows % 32 != 0);
  return a->scaling != LUTRA_SCALING_BLOCK_1D;
}

} // namespace

extern "C" int lk_norm_quantize_tiles(const lutra_norm_quant_args *a) {
  return a && !bad(a) &&
         tiles_suit(a->norm, a->quant.data, a->quant.col_data, a->scaling,
                    vec_ok(&a->norm, a->norm.dtype), a->current);
}

extern "C" cudaError_t lk_norm_quantize(const lutra_norm_quant_args *a, cudaStream_t s) {
  if (!a || bad(a)) return cudaErrorInvalidValue;
  const lutra_quant_args &q = a->quant;
  Params p{};
  p.n = a->norm;
  p.skip = q.skip;
  p.data = static_cast<uint8_t *>(q.data);
  p.col_data = static_cast<uint8_t *>(q.col_data);
  p.scale_inv = q.scale_inv;
  p.col_scale_inv = q.col_scale_inv;
  p.scale = q.scale;
  p.amax = q.amax;
  p.fp8_max = q.out_dtype == LUTRA_E4M3 ? 448.0f : 57344.0f;
  p.max_rcp = 1.0f / p.fp8_max;
  p.amax_epsilon = q.amax_epsilon;
  p.power_2_scale = q.power_2_scale;
  if (a->current) p.fp8_max = a->fp8_max;
  p.write_tensor_inv = a->scaling == LUTRA_SCALING_TENSOR;
  /* one vector width for both passes of current scaling: the same statistics in each */
  const bool vec = vec_ok(&a->norm, a->norm.dtype);
  p.work = a->work;
  /* per-tensor current scaling takes two passes: the statistics and max|y| in one, the codes in
   * the other (on the tiles, else this file's row kernels) */
  const cudaError_t tiles = launch_tiles(p, a->scaling, q.out_dtype, vec, a->current, s);
  if (tiles != cudaErrorNotSupported) return tiles;
  if (a->scaling == LUTRA_SCALING_TENSOR && a->current) {
    Params first = p;
    first.amax_pass = 1;
    first.data = first.col_data = nullptr;
    first.write_tensor_inv = 0;
    const cudaError_t e = launch(first, a->scaling, q.out_dtype, vec, s);
    if (e != cudaSuccess) return e;
    p.amax = nullptr;
    p.n.y = nullptr; /* written by the first pass */
  }
  return launch(p, a->scaling, q.out_dtype, vec, s);
}
