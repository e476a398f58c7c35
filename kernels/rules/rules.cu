/* External scaling rules (src/fp8/rules.c) on CUDA: every meta's scale and history gathered into
 * one device buffer (copied to the host in one transfer) and the history rolled as
 * lk_delayed_update does; then the scales the host computed written. One block per meta; the
 * metas go in the kernel parameters, up to RULE_CHUNK per launch. */
#include "common/f32.cuh"
#include "kernels.h"

#include <string.h>

using namespace lkc;

namespace {

constexpr int RULE_CHUNK = 768;
constexpr int RULE_THREADS = 256;

struct RuleMeta {
  float *scale, *scale_inv, *history;
  int64_t off; /* of this meta's [scale, history...] in the staging buffer */
  int32_t history_len, index;
};

struct RuleParams {
  int32_t n, pad;
  float *staging;      /* gathered [scale, history] per meta */
  const float *scales; /* apply: the new scales, one per meta (index) */
  RuleMeta m[RULE_CHUNK];
};

/* The block copies the history into the staging buffer, waits, then rolls it from that copy
 * (new[i] = old[i + 1], new[len - 1] = old[0], new[0] = 0), so no thread overwrites what another
 * still has to read. */
__global__ void __launch_bounds__(RULE_THREADS)
    k_rules_gather(const __grid_constant__ RuleParams p) {
  if ((int)blockIdx.x >= p.n) return;
  const RuleMeta &m = p.m[blockIdx.x];
  float *dst = p.staging + m.off;
  const int64_t len = m.history_len;
  if (threadIdx.x == 0) dst[0] = *m.scale;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x)
    dst[1 + i] = m.history[i];
  __syncthreads();
  const float *old = dst + 1;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x)
    m.history[i] = i == 0 ? 0.0f : i == len - 1 ? old[0] : old[i + 1];
}

__global__ void k_rules_apply(const __grid_constant__ RuleParams p) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= p.n) return;
  const RuleMeta &m = p.m[j];
  const float scale = p.scales[m.index];
  *m.scale = scale;
  *m.scale_inv = div_x86(1.0f, scale);
}

template <typename F>
cudaError_t chunks(lutra_scale_meta *const *metas, int n, float *staging, const float *scales,
                   F launch) {
  int64_t off = 0;
  for (int j0 = 0; j0 < n; j0 += RULE_CHUNK) {
    RuleParams p;
    memset(&p, 0, sizeof p);
    p.n = n - j0 < RULE_CHUNK ? n - j0 : RULE_CHUNK;
    p.staging = staging;
    p.scales = scales;
    for (int j = 0; j < p.n; j++) {
      const lutra_scale_meta *m = metas[j0 + j];
      p.m[j] = RuleMeta{m->scale, m->scale_inv, m->amax_history, off, m->history_len, j0 + j};
      off += 1 + m->history_len;
    }
    cudaError_t e = launch(p);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

static_assert(sizeof(RuleParams) <= 32764, "kernel parameters of at most 32764 bytes");

} // namespace

extern "C" cudaError_t lk_rules_gather(lutra_scale_meta *const *metas, int n, float *staging,
                                       cudaStream_t s) {
  if (n < 0 || (n > 0 && (!metas || !staging))) return cudaErrorInvalidValue;
  return chunks(metas, n, staging, nullptr, [&](const RuleParams &p) {
    LKC_LAUNCH(k_rules_gather, p.n, RULE_THREADS, 0, s, p);
    return cudaGetLastError();
  });
}

extern "C" cudaError_t lk_rules_apply(lutra_scale_meta *const *metas, int n, const float *scales,
                                      cudaStream_t s) {
  if (n < 0 || (n > 0 && (!metas || !scales))) return cudaErrorInvalidValue;
  return chunks(metas, n, nullptr, scales, [&](const RuleParams &p) {
    LKC_LAUNCH(k_rules_apply, (p.n + RULE_THREADS - 1) / RULE_THREADS, RULE_THREADS, 0, s, p);
    return cudaGetLastError();
  });
}
