/* MoE routing (kernels.h): the fused softmax + top-k router and the token permutation, with
 * their backwards. Semantics: lutra_topk_args and lutra_permute_args (src/backend/backend.h),
 * references in src/backend/cpu/moe_cpu.c.
 *
 * Router: one thread per token, the selection an insertion into a sorted list of k registers
 * (the CPU's loop, so the indices are the same bits), the softmax in double in the CPU's
 * order. The row is read by one thread, but the logits are small next to the tokens' rows.
 *
 * Permute: a stable counting sort in three launches of fixed grids (a function of the slot
 * count and experts only), so it needs no host read and replays in a graph:
 *   1. count   one warp per chunk of LUTRA_MOE_CHUNK slots: counts[chunk][expert]
 *   2. scan    one block: counts become each chunk's first row per expert (expert offset +
 *              the counts of earlier chunks), m_splits the totals
 *   3. rank    one warp per chunk again, walking its slots 32 at a time in order: a slot's row
 *              is its chunk's next row for the expert + its rank among the warp's equal lanes
 *              (__match_any_sync), so within an expert rows follow slot order.
 * then the row copy. The combines (permute backward, unpermute) are one thread per element
 * group of a token, adding the k rows in order in f32 as the CPU does (the same bits); the
 * unpermute backward is a block per slot, its dot product in double with a fixed tree. */
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"
#include "common/reduce.cuh"

#include <limits.h>

/* spec/native/sim_moe.cpp runs these kernels on the host, one thread per CUDA thread: it defines
 * its own launch, dynamic shared memory and grid cap (small, so that the grid-stride loops loop) */
#ifndef LKM_LAUNCH
#define LKM_LAUNCH(kernel, grid, block, smem, stream, ...)                                         \
  kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#endif
#ifndef LKM_MAX_GRID
#define LKM_MAX_GRID 65535
#endif

using namespace lkc;

namespace {

#ifndef LKM_SIM
/* the block's dynamic shared memory: experts ints */
__device__ __forceinline__ int32_t *dyn_ints() {
  extern __shared__ int32_t lkm_dyn_smem[];
  return lkm_dyn_smem;
}
#else
int32_t *dyn_ints() {
  return reinterpret_cast<int32_t *>(dyn_smem());
}
#endif

constexpr int kMaxK = LUTRA_MOE_MAX_K;
constexpr int kChunk = LUTRA_MOE_CHUNK;
constexpr int kThreads = 256;
constexpr int kScanThreads = 1024;
/* the router's threads per block: few, so that a few thousand tokens still fill the SMs */
constexpr int kRouterThreads = 64;

__device__ __forceinline__ float topk_key(float v) {
  return isnan(v) ? -INFINITY : v;
}
__device__ __forceinline__ bool ranks_before(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

/* e[i] for the k keys and the softmax's denominator (the CPU's topk_denominator) */
template <int DT>
__device__ double topk_denominator(const void *logits, int64_t base, int64_t experts, int k,
                                   int renormalize, const float (&key)[kMaxK], float mx,
                                   double (&e)[kMaxK]) {
  double sum = 0.0;
#pragma unroll
  for (int i = 0; i < kMaxK; i++) {
    if (i < k) {
      e[i] = exp(static_cast<double>(fsub(key[i], mx)));
      if (renormalize) sum += e[i];
    }
  }
  if (!renormalize)
    for (int64_t j = 0; j < experts; j++)
      sum += exp(static_cast<double>(fsub(topk_key(ld<DT>(logits, base + j)), mx)));
  return sum;
}

template <int DT>
__global__ void __launch_bounds__(kRouterThreads)
    topk_forward_kernel(const void *logits, int64_t tokens, int64_t experts, int k, int renormalize,
                        double scale, float *probs, int32_t *indices) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouterThreads + threadIdx.x;
  if (t >= tokens) return;
  const int64_t base = t * experts;
  float bv[kMaxK];
  int bi[kMaxK];
#pragma unroll
  for (int i = 0; i < kMaxK; i++) {
    bv[i] = -INFINITY;
    bi[i] = INT_MAX;
  }
  for (int64_t j = 0; j < experts; j++) {
    float cv = topk_key(ld<DT>(logits, base + j));
    int ci = static_cast<int>(j);
#pragma unroll
    for (int i = 0; i < kMaxK; i++) {
      if (i < k && ranks_before(cv, ci, bv[i], bi[i])) {
        const float tv = bv[i];
        const int ti = bi[i];
        bv[i] = cv;
        bi[i] = ci;
        cv = tv;
        ci = ti;
      }
    }
  }
  double e[kMaxK];
  const double sum = topk_denominator<DT>(logits, base, experts, k, renormalize, bv, bv[0], e);
#pragma unroll
  for (int i = 0; i < kMaxK; i++) {
    if (i < k) {
      probs[t * k + i] = static_cast<float>(e[i] / sum * scale);
      indices[t * k + i] = bi[i];
    }
  }
}

template <int DT>
__global__ void __launch_bounds__(kRouterThreads)
    topk_backward_kernel(const void *logits, const int32_t *indices, const float *dprobs,
                         int64_t tokens, int64_t experts, int k, int renormalize, double s,
                         void *dlogits) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouterThreads + threadIdx.x;
  if (t >= tokens) return;
  const int64_t base = t * experts;
  float key[kMaxK];
  int idx[kMaxK];
  float g[kMaxK];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kMaxK; i++) {
    if (i < k) {
      idx[i] = indices[t * k + i];
      /* an index the forward cannot have given: NaN gradients rather than a wild read */
      const bool ok = idx[i] >= 0 && idx[i] < experts;
      key[i] = ok ? topk_key(ld<DT>(logits, base + idx[i])) : NAN;
      g[i] = dprobs[t * k + i];
      mx = fmaxf(mx, key[i]);
    }
  }
  double e[kMaxK];
  const double sum = topk_denominator<DT>(logits, base, experts, k, renormalize, key, mx, e);
  double G = 0.0;
#pragma unroll
  for (int i = 0; i < kMaxK; i++)
    if (i < k) G += static_cast<double>(g[i]) * (e[i] / sum);
  for (int64_t j = 0; j < experts; j++) {
    float v = 0.0f;
    if (!renormalize) {
      const double q = exp(static_cast<double>(fsub(topk_key(ld<DT>(logits, base + j)), mx))) / sum;
      v = static_cast<float>(s * q * (0.0 - G));
    }
    st<DT>(dlogits, base + j, v);
  }
#pragma unroll
  for (int i = 0; i < kMaxK; i++) {
    if (i < k && idx[i] >= 0 && idx[i] < experts) {
      const double q = e[i] / sum;
      st<DT>(dlogits, base + idx[i], static_cast<float>(s * q * (static_cast<double>(g[i]) - G)));
    }
  }
}

/* ---- counting sort ------------------------------------------------------------------------ */

__global__ void __launch_bounds__(32)
    count_kernel(const int32_t *indices, int64_t slots, int experts, int32_t *counts,
                 int32_t *bad_index) {
  int32_t *cnt = dyn_ints();
  const int lane = threadIdx.x;
  for (int e = lane; e < experts; e += 32)
    cnt[e] = 0;
  __syncwarp();
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int64_t end = imin<int64_t>(slots, begin + kChunk);
  bool bad = false;
  for (int64_t s = begin + lane; s < end; s += 32) {
    const int32_t e = indices[s];
    if (e >= 0 && e < experts)
      atomicAdd(&cnt[e], 1);
    else
      bad = true;
  }
  if (bad && bad_index) *bad_index = 1;
  __syncwarp();
  int32_t *out = counts + static_cast<int64_t>(blockIdx.x) * experts;
  for (int e = lane; e < experts; e += 32)
    out[e] = cnt[e];
}

__global__ void __launch_bounds__(kScanThreads)
    scan_kernel(int32_t *counts, int64_t chunks, int experts, int32_t *m_splits) {
  int32_t *total = dyn_ints(); /* [experts] */
  __shared__ int32_t part[kScanThreads];
  const int tid = threadIdx.x;
  /* per expert: the counts of earlier chunks (exclusive), and the total */
  for (int e = tid; e < experts; e += kScanThreads) {
    int32_t run = 0;
    for (int64_t c = 0; c < chunks; c++) {
      const int32_t v = counts[c * experts + e];
      counts[c * experts + e] = run;
      run += v;
    }
    total[e] = run;
    m_splits[e] = run;
  }
  __syncthreads();
  /* exclusive scan of the totals over experts: a contiguous segment per thread, then a scan of
   * the segment sums across the block */
  const int seg = (experts + kScanThreads - 1) / kScanThreads;
  const int lo = imin(experts, tid * seg), hi = imin(experts, lo + seg);
  int32_t sum = 0;
  for (int e = lo; e < hi; e++)
    sum += total[e];
  part[tid] = sum;
  __syncthreads();
  for (int off = 1; off < kScanThreads; off <<= 1) {
    const int32_t v = tid >= off ? part[tid - off] : 0;
    __syncthreads();
    part[tid] += v;
    __syncthreads();
  }
  int32_t offset = tid > 0 ? part[tid - 1] : 0;
  for (int e = lo; e < hi; e++) {
    const int32_t v = total[e];
    total[e] = offset;
    offset += v;
  }
  __syncthreads();
  for (int e = tid; e < experts; e += kScanThreads) {
    const int32_t off = total[e];
    for (int64_t c = 0; c < chunks; c++)
      counts[c * experts + e] += off;
  }
}

__global__ void __launch_bounds__(32)
    rank_kernel(const int32_t *indices, int64_t slots, int experts, const int32_t *first,
                int32_t *row_map) {
  int32_t *next = dyn_ints();
  const int lane = threadIdx.x;
  const int32_t *mine = first + static_cast<int64_t>(blockIdx.x) * experts;
  for (int e = lane; e < experts; e += 32)
    next[e] = mine[e];
  __syncwarp();
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int64_t end = imin<int64_t>(slots, begin + kChunk);
  const unsigned below = (1u << lane) - 1u;
  for (int64_t s0 = begin; s0 < end; s0 += 32) {
    const int64_t s = s0 + lane;
    const bool live = s < end;
    const int32_t e = live ? indices[s] : -1;
    const bool ok = live && e >= 0 && e < experts;
    const unsigned peers = __match_any_sync(0xFFFFFFFFu, ok ? e : -1);
    if (ok)
      row_map[s] = next[e] + __popc(peers & below);
    else if (live)
      row_map[s] = -1;
    __syncwarp();
    if (ok && lane == __ffs(peers) - 1) next[e] += __popc(peers);
    __syncwarp();
  }
}

/* out[row_map[s]] = x[s / k], rows of V words */
template <class V>
__global__ void __launch_bounds__(kThreads)
    scatter_rows_kernel(const V *x, V *out, const int32_t *row_map, int64_t slots, int k,
                        int64_t row_words) {
  for (int64_t s = blockIdx.x; s < slots; s += gridDim.x) {
    const int32_t r = row_map[s];
    if (r < 0) continue;
    const V *src = x + (s / k) * row_words;
    V *dst = out + static_cast<int64_t>(r) * row_words;
    for (int64_t w = threadIdx.x; w < row_words; w += kThreads)
      dst[w] = src[w];
  }
}

/* out[t] = sum_i w_i x[row_map[t k + i]] over groups of N elements, w_i = probs or 1 */
template <int DT, int N, bool WEIGHTED>
__global__ void __launch_bounds__(kThreads)
    combine_kernel(const void *x, const int32_t *row_map, const void *probs, int probs_dtype,
                   int64_t tokens, int k, int64_t hidden, void *out) {
  const int64_t groups = hidden / N;
  const int64_t total = tokens * groups;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; g < total;
       g += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t t = g / groups, h = (g % groups) * N;
    float acc[N];
#pragma unroll
    for (int n = 0; n < N; n++)
      acc[n] = 0.0f;
    for (int i = 0; i < k; i++) {
      const int32_t r = row_map[t * k + i];
      if (r < 0) continue;
      float v[N];
      ldv<DT, N>(x, static_cast<int64_t>(r) * hidden + h, v);
      const float w = WEIGHTED ? ld_rt(probs, probs_dtype, t * k + i) : 1.0f;
#pragma unroll
      for (int n = 0; n < N; n++)
        acc[n] = fadd(acc[n], WEIGHTED ? fmul(w, v[n]) : v[n]);
    }
    stv<DT, N>(out, t * hidden + h, acc);
  }
}

/* block per slot: dexpert[row] = p * dy[t]; dprobs[s] = dy[t] . x[row] (double, fixed tree) */
template <int DT, int N>
__global__ void __launch_bounds__(kThreads)
    unpermute_backward_kernel(const void *x, const void *dy, const int32_t *row_map,
                              const void *probs, int probs_dtype, int64_t slots, int k,
                              int64_t hidden, void *dexpert, void *dprobs) {
  __shared__ double red[kThreads / 32];
  for (int64_t s = blockIdx.x; s < slots; s += gridDim.x) {
    const int32_t r = row_map[s];
    if (r < 0) {
      if (threadIdx.x == 0) st_rt(dprobs, probs_dtype, s, 0.0f);
      continue;
    }
    const float p = ld_rt(probs, probs_dtype, s);
    const int64_t trow = (s / k) * hidden, xrow = static_cast<int64_t>(r) * hidden;
    double dot = 0.0;
    for (int64_t h = static_cast<int64_t>(threadIdx.x) * N; h < hidden;
         h += static_cast<int64_t>(kThreads) * N) {
      float g[N], v[N];
      ldv<DT, N>(dy, trow + h, g);
      ldv<DT, N>(x, xrow + h, v);
#pragma unroll
      for (int n = 0; n < N; n++) {
        dot += static_cast<double>(g[n]) * static_cast<double>(v[n]);
        g[n] = fmul(p, g[n]);
      }
      stv<DT, N>(dexpert, xrow + h, g);
    }
    dot = block_sum<kThreads>(dot, red);
    if (threadIdx.x == 0) st_rt(dprobs, probs_dtype, s, static_cast<float>(dot));
  }
}

unsigned grid_for(int64_t items, int64_t per_block) {
  return static_cast<unsigned>(
      imax<int64_t>(1, imin<int64_t>(cdiv(items, per_block), LKM_MAX_GRID)));
}

/* the vector width of a row-wise kernel: 16-byte groups when every row starts aligned */
template <int DT>
bool rows_vectorizable(int64_t hidden, const void *a, const void *b, const void *c) {
  return hidden % vec16<DT>() == 0 && aligned(a, 16) && aligned(b, 16) && (!c || aligned(c, 16));
}

} // namespace

extern "C" cudaError_t lk_moe_topk_forward(const lutra_topk_args *a, cudaStream_t s) {
  if (a->k < 1 || a->k > kMaxK) return cudaErrorInvalidValue;
  const unsigned grid = static_cast<unsigned>(cdiv<int64_t>(a->tokens, kRouterThreads));
  return with_float_dtype(a->dtype, [&](auto dt) {
    auto kernel = topk_forward_kernel<decltype(dt)::value>;
    LKM_LAUNCH(kernel, grid, kRouterThreads, 0, s, a->logits, a->tokens, a->experts, a->k,
               a->renormalize, static_cast<double>(a->scaling_factor), a->probs, a->indices);
    return cudaGetLastError();
  });
}

extern "C" cudaError_t lk_moe_topk_backward(const lutra_topk_args *a, cudaStream_t s) {
  if (a->k < 1 || a->k > kMaxK) return cudaErrorInvalidValue;
  const unsigned grid = static_cast<unsigned>(cdiv<int64_t>(a->tokens, kRouterThreads));
  return with_float_dtype(a->dtype, [&](auto dt) {
    auto kernel = topk_backward_kernel<decltype(dt)::value>;
    LKM_LAUNCH(kernel, grid, kRouterThreads, 0, s, a->logits, a->indices, a->dprobs, a->tokens,
               a->experts, a->k, a->renormalize, static_cast<double>(a->scaling_factor),
               a->dlogits);
    return cudaGetLastError();
  });
}

template <class V>
static void scatter_rows(const lutra_permute_args *a, unsigned grid, cudaStream_t s) {
  const int64_t words =
      a->hidden * (a->dtype == LUTRA_F32 ? 4 : 2) / static_cast<int64_t>(sizeof(V));
  auto kernel = scatter_rows_kernel<V>;
  LKM_LAUNCH(kernel, grid, kThreads, 0, s, static_cast<const V *>(a->x), static_cast<V *>(a->out),
             static_cast<const int32_t *>(a->row_map), a->tokens * a->k, static_cast<int>(a->k),
             words);
}

extern "C" cudaError_t lk_moe_permute(const lutra_permute_args *a, cudaStream_t s) {
  const int64_t slots = a->tokens * a->k;
  const unsigned chunks = static_cast<unsigned>(cdiv<int64_t>(slots, kChunk));
  const size_t smem = static_cast<size_t>(a->experts) * sizeof(int32_t);
  const int experts = a->experts;
  const int32_t *indices = a->indices;
  LKM_LAUNCH(count_kernel, chunks, 32, smem, s, indices, slots, experts, a->scratch, a->bad_index);
  LKM_LAUNCH(scan_kernel, 1, kScanThreads, smem, s, a->scratch, static_cast<int64_t>(chunks),
             experts, a->m_splits);
  LKM_LAUNCH(rank_kernel, chunks, 32, smem, s, indices, slots, experts,
             static_cast<const int32_t *>(a->scratch), a->row_map);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || !a->x) return e;
  const int64_t bytes = a->hidden * (a->dtype == LUTRA_F32 ? 4 : 2);
  const unsigned grid = grid_for(slots, 1);
  if (bytes % 16 == 0 && aligned(a->x, 16) && aligned(a->out, 16))
    scatter_rows<uint4>(a, grid, s);
  else if (bytes % 4 == 0)
    scatter_rows<uint32_t>(a, grid, s);
  else
    scatter_rows<uint16_t>(a, grid, s);
  return cudaGetLastError();
}

template <bool WEIGHTED> static cudaError_t combine(const lutra_permute_args *a, cudaStream_t s) {
  return with_float_dtype(a->dtype, [&](auto dt) {
    constexpr int DT = decltype(dt)::value;
    const bool vec = rows_vectorizable<DT>(a->hidden, a->x, a->out, nullptr);
    auto kernel = vec ? combine_kernel<DT, vec16<DT>(), WEIGHTED> : combine_kernel<DT, 1, WEIGHTED>;
    const int64_t groups = a->tokens * (vec ? a->hidden / vec16<DT>() : a->hidden);
    LKM_LAUNCH(kernel, grid_for(groups, kThreads), kThreads, 0, s, a->x,
               static_cast<const int32_t *>(a->row_map), a->probs, static_cast<int>(a->probs_dtype),
               a->tokens, static_cast<int>(a->k), a->hidden, a->out);
    return cudaGetLastError();
  });
}

extern "C" cudaError_t lk_moe_permute_backward(const lutra_permute_args *a, cudaStream_t s) {
  return combine<false>(a, s);
}

extern "C" cudaError_t lk_moe_unpermute(const lutra_permute_args *a, cudaStream_t s) {
  if (!is_float_dtype(a->probs_dtype)) return cudaErrorInvalidValue;
  return combine<true>(a, s);
}

extern "C" cudaError_t lk_moe_unpermute_backward(const lutra_permute_args *a, cudaStream_t s) {
  if (!is_float_dtype(a->probs_dtype)) return cudaErrorInvalidValue;
  const int64_t slots = a->tokens * a->k;
  const unsigned grid = grid_for(slots, 1);
  return with_float_dtype(a->dtype, [&](auto dt) {
    constexpr int DT = decltype(dt)::value;
    const bool vec = rows_vectorizable<DT>(a->hidden, a->x, a->dy, a->out);
    auto kernel =
        vec ? unpermute_backward_kernel<DT, vec16<DT>()> : unpermute_backward_kernel<DT, 1>;
    LKM_LAUNCH(kernel, grid, kThreads, 0, s, a->x, a->dy, static_cast<const int32_t *>(a->row_map),
               a->probs, static_cast<int>(a->probs_dtype), slots, static_cast<int>(a->k), a->hidden,
               a->out, a->dprobs);
    return cudaGetLastError();
  });
}
