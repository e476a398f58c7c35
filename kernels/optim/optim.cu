/* SGD and AdamW steps over many tensors per launch (kernels.h). Semantics: lutra_cpu_sgd_step
 * and lutra_cpu_adamw_step (src/backend/cpu/optim_cpu.c), bit for bit: the element updates are
 * sgd_update / adamw_update below, rounded where the CPU rounds (common/f32.cuh's fadd...).
 *
 * Multi-tensor apply: the kernel parameters (a __grid_constant__ struct, read in place) carry
 * up to kMaxTensors tensors' pointers, sizes and dtypes plus the prefix sums of their chunk
 * counts; block b finds its tensor by binary search in those prefix sums and updates elements
 * [chunk * kChunk, (chunk + 1) * kChunk) of it. More tensors (or more than 2^31 - 1 chunks)
 * take more launches. The lutra_optim_args arrays are host arrays of device pointers.
 *
 * AdamW's step counter on the device (lutra_optim_args.device_step, when set): the bias
 * corrections come from t = *device_step + 1, read in the kernel, and the kernel advances the
 * counter itself, so that a CUDA graph that captured the launch takes steps t, t + 1, ... when
 * replayed (a step passed by value would be frozen into the graph). See step_scalars() below.
 * SGD reads and advances the same counter (its scheduled lr depends on it). The lr of step t is
 * lutra_lr_at (src/backend/optim_math.h), computed per block from t like the bias corrections.
 *
 * Global-norm clipping (lutra_optim_args.max_grad_norm > 0): grad_sumsq_kernel runs first, over
 * the same packing of the tensors, on a fixed grid of LUTRA_CLIP_PARTIALS blocks; each block sums
 * the squares of its chunks' gradients in double (fixed per-thread order, a fixed block tree) into
 * its own slot of args.clip (the step's first launch overwrites, later ones add: stream order),
 * and the last block of the last launch to arrive adds the slots in index order into
 * args.clip[LUTRA_CLIP_SUMSQ]. The same gradients give the same bits every run, with no host
 * read; the update launches then scale every gradient by lutra_clip_factor of that sum. */
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"
#include "common/reduce.cuh"

#include "backend/optim_math.h"

#include <math.h>
#include <string.h>

using namespace lkc;

namespace {

/* ---- the element updates (optim_cpu.c, operation for operation) ---------------------------- */

struct SgdHyper {
  float lr, mu, wd;
};

/* one SGD element: w from master or value, g the gradient; mom is read and written when
 * has_mom (the CPU's momentum != 0) */
LKC_HD float sgd_update(float w, float g, bool has_mom, float &mom, const SgdHyper &h) {
  g = fadd(g, fmul(h.wd, w));
  if (has_mom) {
    mom = fadd(fmul(h.mu, mom), g);
    g = mom;
  }
  return fsub(w, fmul(h.lr, g));
}

struct AdamHyper {
  float lr;
  float decay;      /* lr * weight_decay, f32 (0 for a tensor without decay) */
  float b1, b2;     /* betas */
  float omb1, omb2; /* 1 - beta, f32 */
  float bc1, bc2;   /* (float)(1 - pow(beta, step)), computed in double */
  float eps;
};

LKC_HD float adamw_update(float w, float g, float &m, float &v, const AdamHyper &h) {
  w = fsub(w, fmul(h.decay, w));
  m = fadd(fmul(h.b1, m), fmul(h.omb1, g));
  v = fadd(fmul(h.b2, v), fmul(fmul(h.omb2, g), g));
  const float mhat = fdiv(m, h.bc1), vhat = fdiv(v, h.bc2);
  return fsub(w, fdiv(fmul(h.lr, mhat), fadd(fsqrt(vhat), h.eps)));
}

constexpr int kThreads = 256;
constexpr int kVec = 4;                     /* elements per thread access */
constexpr int kChunk = kThreads * kVec * 4; /* elements per block */
constexpr int kMaxTensors = 128;
constexpr int64_t kMaxChunksPerLaunch = 0x7FFFFFFF; /* grid.x limit */
constexpr int kNormBlocks = LUTRA_CLIP_PARTIALS;

struct OptimParams {
  void *value[kMaxTensors];
  const void *grad[kMaxTensors];
  float *master[kMaxTensors]; /* NULL: no master copy */
  float *m[kMaxTensors];      /* SGD: NULL without momentum */
  float *v[kMaxTensors];      /* AdamW only */
  int64_t numel[kMaxTensors];
  int32_t chunk_start[kMaxTensors + 1]; /* prefix sums of the chunk counts */
  uint8_t value_dtype[kMaxTensors];
  uint8_t grad_dtype[kMaxTensors];
  uint8_t vec[kMaxTensors];    /* every pointer of the tensor is aligned for kVec accesses */
  uint8_t decays[kMaxTensors]; /* the tensor takes weight decay */
  int32_t count;
  SgdHyper sgd;   /* lr: set per block from the schedule */
  AdamHyper adam; /* lr, decay, bc1, bc2: set per block */
  lutra_lr_schedule schedule;
  float base_lr, weight_decay;
  int64_t host_step;    /* t when there is no device counter */
  int64_t *device_step; /* steps taken so far, or NULL (host_step given) */
  uint32_t *arrivals;   /* blocks of this launch past their read of *device_step */
  const double *sumsq;  /* clipping: grad_sumsq_kernel's sum; NULL: no clipping */
  float max_norm;
  int32_t advance; /* the step's last launch: it advances *device_step */
};
static_assert(sizeof(OptimParams) <= 32764, "kernel parameter limit (sm_70+, CUDA 12.1+)");

/* largest t in [0, count) with start[t] <= b (start[0] == 0, start increasing) */
__device__ __forceinline__ int find_tensor(const int32_t *start, int count, int32_t b) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (start[mid] <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

/* N elements from index i of tensor t; clip scales the gradient when clipping */
template <int VDT, int GDT, bool ADAM, int N>
__device__ __forceinline__ void update(const SgdHyper &sgd, const AdamHyper &adam, bool clipping,
                                       float clip, void *value, const void *grad, float *master,
                                       float *m, float *v, int64_t i) {
  float w[N], g[N], mm[N], vv[N];
  if (master)
    ldv<LUTRA_F32, N>(master, i, w);
  else
    ldv<VDT, N>(value, i, w);
  ldv<GDT, N>(grad, i, g);
  if (m) ldv<LUTRA_F32, N>(m, i, mm);
  if constexpr (ADAM) ldv<LUTRA_F32, N>(v, i, vv);
#pragma unroll
  for (int k = 0; k < N; k++) {
    if (clipping) g[k] = fmul(g[k], clip);
    if constexpr (ADAM)
      w[k] = adamw_update(w[k], g[k], mm[k], vv[k], adam);
    else
      w[k] = sgd_update(w[k], g[k], m != nullptr, mm[k], sgd);
  }
  if (master) stv<LUTRA_F32, N>(master, i, w);
  stv<VDT, N>(value, i, w);
  if (m) stv<LUTRA_F32, N>(m, i, mm);
  if constexpr (ADAM) stv<LUTRA_F32, N>(v, i, vv);
}

template <int VDT, int GDT, bool ADAM>
__device__ __forceinline__ void run_chunk(const OptimParams &p, const SgdHyper &sgd,
                                          const AdamHyper &adam, float clip, int t, int64_t begin,
                                          int64_t end) {
  void *value = p.value[t];
  const void *grad = p.grad[t];
  float *master = p.master[t], *m = p.m[t], *v = p.v[t];
  const bool clipping = p.sumsq != nullptr;
  int64_t scalar_begin = begin;
  if (p.vec[t]) {
    const int64_t vec_end = begin + (end - begin) / kVec * kVec;
    for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * kVec; i < vec_end;
         i += kThreads * kVec)
      update<VDT, GDT, ADAM, kVec>(sgd, adam, clipping, clip, value, grad, master, m, v, i);
    scalar_begin = vec_end;
  }
  for (int64_t i = scalar_begin + threadIdx.x; i < end; i += kThreads)
    update<VDT, GDT, ADAM, 1>(sgd, adam, clipping, clip, value, grad, master, m, v, i);
}

/* (float)(1 - beta^t) as the CPU computes it (lutra_cpu_adamw_step): pow in double, rounded */
__device__ __forceinline__ float bias_correction(float beta, int64_t t) {
  return static_cast<float>(1.0 - pow(static_cast<double>(beta), static_cast<double>(t)));
}

/* What every block of a step shares: the lr, the bias corrections, the clipping factor. */
struct StepScalars {
  float lr, bc1, bc2, clip;
};

/* The scalars of step t = *device_step + 1 (or host_step), and the counter advanced once per
 * step, by the step's last launch, without a second launch:
 * - thread 0 of every block reads *device_step and computes the scalars into shared memory; the
 *   barrier makes them visible to the block's threads (and finishes the read);
 * - then thread 0 fences (__threadfence: its read is complete before what follows is seen) and
 *   counts its block in *arrivals. The block that draws gridDim.x - 1 is the last: every block
 *   of the grid has read t by then, so it can store *device_step = t (nobody reads it again in
 *   this launch) and zero *arrivals for the next launch. A later launch (stream order, or the
 *   next replay of a graph) sees both stores.
 * Launches of the same step before the last (more than kMaxTensors tensors) only read. The
 * uniform branch and one barrier keep every thread of the block together. */
template <bool ADAM> __device__ __forceinline__ StepScalars step_scalars(const OptimParams &p) {
  __shared__ float sh[4];
  int64_t t = p.host_step;
  if (threadIdx.x == 0) {
    if (p.device_step) t = *static_cast<volatile const int64_t *>(p.device_step) + 1;
    sh[0] = lutra_lr_at(&p.schedule, p.base_lr, t);
    sh[1] = ADAM ? bias_correction(p.adam.b1, t) : 1.0f;
    sh[2] = ADAM ? bias_correction(p.adam.b2, t) : 1.0f;
    sh[3] = p.sumsq ? lutra_clip_factor(*p.sumsq, p.max_norm) : 1.0f;
  }
  __syncthreads();
  if (threadIdx.x == 0 && p.device_step && p.advance) {
    __threadfence();
    if (atomicAdd(p.arrivals, 1u) == gridDim.x - 1) {
      *p.device_step = t;
      *p.arrivals = 0u;
    }
  }
  return StepScalars{sh[0], sh[1], sh[2], sh[3]};
}

template <bool ADAM>
__global__ void __launch_bounds__(kThreads) optim_kernel(const __grid_constant__ OptimParams p) {
  const StepScalars s = step_scalars<ADAM>(p); /* uniform: the same for every block */
  if (p.count == 0) return;                    /* a launch that only advances the counter */
  const int32_t b = static_cast<int32_t>(blockIdx.x);
  const int t = find_tensor(p.chunk_start, p.count, b);
  const int64_t begin = static_cast<int64_t>(b - p.chunk_start[t]) * kChunk;
  const int64_t end = imin<int64_t>(p.numel[t], begin + kChunk);
  const bool decays = p.decays[t] != 0;
  SgdHyper sgd = p.sgd;
  sgd.lr = s.lr;
  sgd.wd = decays ? p.weight_decay : 0.0f;
  AdamHyper adam = p.adam;
  adam.lr = s.lr;
  adam.decay = decays ? fmul(s.lr, p.weight_decay) : 0.0f;
  adam.bc1 = s.bc1;
  adam.bc2 = s.bc2;
  const int vdt = p.value_dtype[t], gdt = p.grad_dtype[t];
  if (vdt == LUTRA_F32)
    run_chunk<LUTRA_F32, LUTRA_F32, ADAM>(p, sgd, adam, s.clip, t, begin, end);
  else if (vdt == LUTRA_BF16)
    gdt == LUTRA_F32 ? run_chunk<LUTRA_BF16, LUTRA_F32, ADAM>(p, sgd, adam, s.clip, t, begin, end)
                     : run_chunk<LUTRA_BF16, LUTRA_BF16, ADAM>(p, sgd, adam, s.clip, t, begin, end);
  else
    gdt == LUTRA_F32 ? run_chunk<LUTRA_F16, LUTRA_F32, ADAM>(p, sgd, adam, s.clip, t, begin, end)
                     : run_chunk<LUTRA_F16, LUTRA_F16, ADAM>(p, sgd, adam, s.clip, t, begin, end);
}

/* ---- the gradient norm ------------------------------------------------------------------- */

/* this thread's sum of squares over [begin, end) of a gradient of dtype GDT, in double */
template <int GDT>
__device__ __forceinline__ double chunk_sumsq(const void *grad, bool vec, int64_t begin,
                                              int64_t end) {
  double acc = 0.0;
  int64_t scalar_begin = begin;
  if (vec) {
    const int64_t vec_end = begin + (end - begin) / kVec * kVec;
    for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * kVec; i < vec_end;
         i += kThreads * kVec) {
      float g[kVec];
      ldv<GDT, kVec>(grad, i, g);
#pragma unroll
      for (int k = 0; k < kVec; k++)
        acc += static_cast<double>(g[k]) * static_cast<double>(g[k]); /* exact product */
    }
    scalar_begin = vec_end;
  }
  for (int64_t i = scalar_begin + threadIdx.x; i < end; i += kThreads) {
    float g[1];
    ldv<GDT, 1>(grad, i, g);
    acc += static_cast<double>(g[0]) * static_cast<double>(g[0]);
  }
  return acc;
}

/* One launch of the norm (see the top of the file): block b takes chunks b, b + gridDim.x, ...
 * of this launch's tensors. clip: args.clip; first: the step's first launch; last: its last. */
__global__ void __launch_bounds__(kThreads)
    grad_sumsq_kernel(const __grid_constant__ OptimParams p, double *clip, int first, int last) {
  __shared__ double red[kThreads / 32];
  __shared__ int is_last;
  double acc = 0.0;
  const int32_t chunks = p.chunk_start[p.count];
  for (int32_t c = static_cast<int32_t>(blockIdx.x); c < chunks; c += gridDim.x) {
    const int t = find_tensor(p.chunk_start, p.count, c);
    const int64_t begin = static_cast<int64_t>(c - p.chunk_start[t]) * kChunk;
    const int64_t end = imin<int64_t>(p.numel[t], begin + kChunk);
    const int gdt = p.grad_dtype[t];
    const bool vec = p.vec[t] != 0;
    acc += gdt == LUTRA_F32    ? chunk_sumsq<LUTRA_F32>(p.grad[t], vec, begin, end)
           : gdt == LUTRA_BF16 ? chunk_sumsq<LUTRA_BF16>(p.grad[t], vec, begin, end)
                               : chunk_sumsq<LUTRA_F16>(p.grad[t], vec, begin, end);
  }
  const double block = block_sum<kThreads>(acc, red);
  uint32_t *arrivals = reinterpret_cast<uint32_t *>(clip + LUTRA_CLIP_SUMSQ + 1);
  if (threadIdx.x == 0) {
    clip[blockIdx.x] = first ? block : clip[blockIdx.x] + block;
    is_last = 0;
    if (last) {
      __threadfence(); /* the partial is visible before the arrival is counted */
      is_last = atomicAdd(arrivals, 1u) == gridDim.x - 1;
    }
  }
  __syncthreads();
  if (!is_last) return;
  /* every partial is written: add them in index order (thread j: j, j + kThreads, ...) */
  __threadfence();
  double total = 0.0;
  for (int j = threadIdx.x; j < kNormBlocks; j += kThreads)
    total += static_cast<volatile const double *>(clip)[j];
  total = block_sum<kThreads>(total, red);
  if (threadIdx.x == 0) {
    clip[LUTRA_CLIP_SUMSQ] = total;
    *arrivals = 0u;
  }
}

size_t dtype_bytes(int dt) {
  return dt == LUTRA_F32 ? 4 : 2;
}

/* Refuses the whole step (touching nothing) on arguments the CPU backend refuses. */
bool args_ok(const lutra_optim_args *a, bool need_m, bool need_v) {
  if (!a || a->count < 0) return false;
  if (a->count == 0) return true;
  if (!a->value || !a->value_dtype || !a->grad || !a->grad_dtype || !a->numel) return false;
  if ((need_m && !a->m) || (need_v && !a->v)) return false;
  for (int32_t i = 0; i < a->count; i++) {
    const int vdt = a->value_dtype[i], gdt = a->grad_dtype[i];
    if (a->numel[i] < 0 || !is_float_dtype(vdt) || (gdt != LUTRA_F32 && gdt != vdt)) return false;
    if (a->numel[i] == 0) continue;
    if (cdiv<int64_t>(a->numel[i], kChunk) > kMaxChunksPerLaunch) return false;
    if (!a->value[i] || !a->grad[i]) return false;
    if ((need_m && !a->m[i]) || (need_v && !a->v[i])) return false;
  }
  return true;
}

/* Packs the step's tensors into launches of at most kMaxTensors tensors (and
 * kMaxChunksPerLaunch chunks) and calls launch(p, chunks, first, last) for each; with
 * launch_empty, a step without elements still gets one (empty) launch. */
template <class Launch>
cudaError_t for_each_launch(const lutra_optim_args *a, bool adam, bool need_m, OptimParams &p,
                            bool launch_empty, Launch launch) {
  int k = 0, launches = 0;
  int64_t chunks = 0;
  auto flush = [&](bool last) -> cudaError_t {
    if (k == 0 && !(last && launch_empty && launches == 0)) return cudaSuccess;
    p.count = k;
    p.chunk_start[k] = static_cast<int32_t>(chunks);
    const cudaError_t e = launch(p, chunks, launches == 0, last);
    launches++;
    k = 0;
    chunks = 0;
    return e != cudaSuccess ? e : cudaGetLastError();
  };
  for (int32_t t = 0; t < a->count; t++) {
    const int64_t n = a->numel[t];
    if (n == 0) continue;
    const int64_t c = cdiv<int64_t>(n, kChunk);
    if (k == kMaxTensors || chunks + c > kMaxChunksPerLaunch) {
      const cudaError_t e = flush(false);
      if (e != cudaSuccess) return e;
    }
    const int vdt = a->value_dtype[t], gdt = a->grad_dtype[t];
    p.value[k] = a->value[t];
    p.grad[k] = a->grad[t];
    p.master[k] = a->master ? a->master[t] : nullptr;
    p.m[k] = need_m ? a->m[t] : nullptr;
    p.v[k] = adam ? a->v[t] : nullptr;
    p.numel[k] = n;
    p.value_dtype[k] = static_cast<uint8_t>(vdt);
    p.grad_dtype[k] = static_cast<uint8_t>(gdt);
    p.vec[k] = aligned(p.value[k], kVec * dtype_bytes(vdt)) &&
               aligned(p.grad[k], kVec * dtype_bytes(gdt)) && aligned(p.master[k], 16) &&
               aligned(p.m[k], 16) && aligned(p.v[k], 16);
    p.decays[k] = !a->decays || a->decays[t];
    p.chunk_start[k] = static_cast<int32_t>(chunks);
    chunks += c;
    k++;
  }
  /* the last launch is never skipped where it has work to do (a counter to advance, a norm) */
  return flush(true);
}

/* The step: the norm launches (clipping), then the update launches. */
cudaError_t optim_launch(const lutra_optim_args *a, bool adam, bool need_m, OptimParams &p,
                         cudaStream_t s) {
  if (a->max_grad_norm > 0.0f) {
    p.sumsq = a->clip + LUTRA_CLIP_SUMSQ;
    p.max_norm = a->max_grad_norm;
    const cudaError_t e = for_each_launch(
        a, adam, need_m, p, true, [&](OptimParams &q, int64_t, bool first, bool last) {
          grad_sumsq_kernel<<<kNormBlocks, kThreads, 0, s>>>(q, a->clip, first, last);
          return cudaSuccess;
        });
    if (e != cudaSuccess) return e;
  }
  return for_each_launch(a, adam, need_m, p, p.device_step != nullptr,
                         [&](OptimParams &q, int64_t chunks, bool, bool last) {
                           q.advance = last ? 1 : 0;
                           const unsigned grid = chunks ? static_cast<unsigned>(chunks) : 1u;
                           if (adam)
                             optim_kernel<true><<<grid, kThreads, 0, s>>>(q);
                           else
                             optim_kernel<false><<<grid, kThreads, 0, s>>>(q);
                           return cudaSuccess;
                         });
}

/* The arguments both steps share: refused as the CPU refuses them, then the scalars. */
bool step_params(const lutra_optim_args *a, bool need_m, bool need_v, OptimParams &p) {
  if (!args_ok(a, need_m, need_v)) return false;
  const bool counter = a->device_step != nullptr;
  if (counter && !a->arrivals) return false;
  if (a->max_grad_norm > 0.0f && !a->clip) return false;
  memset(&p, 0, sizeof p);
  p.schedule = a->schedule;
  p.base_lr = a->lr;
  p.weight_decay = a->weight_decay;
  p.host_step = a->step >= 1 ? a->step : 1;
  p.device_step = a->device_step;
  p.arrivals = a->arrivals;
  return true;
}

} // namespace

extern "C" cudaError_t lk_sgd_step(const lutra_optim_args *a, cudaStream_t s) {
  const bool momentum = a && a->momentum != 0.0f;
  OptimParams p;
  if (!step_params(a, momentum, false, p)) return cudaErrorInvalidValue;
  p.sgd = SgdHyper{a->lr, a->momentum, a->weight_decay};
  return optim_launch(a, false, momentum, p, s);
}

extern "C" cudaError_t lk_adamw_step(const lutra_optim_args *a, cudaStream_t s) {
  OptimParams p;
  if (!step_params(a, true, true, p)) return cudaErrorInvalidValue;
  if (!(a->beta1 >= 0.0f && a->beta1 < 1.0f && a->beta2 >= 0.0f && a->beta2 < 1.0f))
    return cudaErrorInvalidValue;
  if (!a->device_step && a->step < 1) return cudaErrorInvalidValue;
  const float b1 = a->beta1, b2 = a->beta2;
  p.adam.b1 = b1;
  p.adam.b2 = b2;
  p.adam.omb1 = 1.0f - b1;
  p.adam.omb2 = 1.0f - b2;
  p.adam.eps = a->eps;
  return optim_launch(a, true, true, p, s);
}
