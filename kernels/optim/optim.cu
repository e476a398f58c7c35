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
 * replayed (a step passed by value would be frozen into the graph). See device_step() below. */
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"

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
  float decay;      /* lr * weight_decay, f32 */
  float b1, b2;     /* betas */
  float omb1, omb2; /* 1 - beta, f32 */
  float bc1, bc2;   /* (float)(1 - pow(beta, step)), computed in double on the host */
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
  uint8_t vec[kMaxTensors]; /* every pointer of the tensor is aligned for kVec accesses */
  int32_t count;
  SgdHyper sgd;
  AdamHyper adam;       /* bc1, bc2 unused with a device counter */
  int64_t *device_step; /* AdamW: steps taken so far, or NULL (bc1, bc2 given) */
  uint32_t *arrivals;   /* blocks of this launch past their read of *device_step */
  int32_t advance;      /* the step's last launch: it advances *device_step */
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

/* N elements from index i of tensor t */
template <int VDT, int GDT, bool ADAM, int N>
__device__ __forceinline__ void update(const OptimParams &p, const AdamHyper &adam, void *value,
                                       const void *grad, float *master, float *m, float *v,
                                       int64_t i) {
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
    if constexpr (ADAM)
      w[k] = adamw_update(w[k], g[k], mm[k], vv[k], adam);
    else
      w[k] = sgd_update(w[k], g[k], m != nullptr, mm[k], p.sgd);
  }
  if (master) stv<LUTRA_F32, N>(master, i, w);
  stv<VDT, N>(value, i, w);
  if (m) stv<LUTRA_F32, N>(m, i, mm);
  if constexpr (ADAM) stv<LUTRA_F32, N>(v, i, vv);
}

template <int VDT, int GDT, bool ADAM>
__device__ __forceinline__ void run_chunk(const OptimParams &p, const AdamHyper &adam, int t,
                                          int64_t begin, int64_t end) {
  void *value = p.value[t];
  const void *grad = p.grad[t];
  float *master = p.master[t], *m = p.m[t], *v = p.v[t];
  int64_t scalar_begin = begin;
  if (p.vec[t]) {
    const int64_t vec_end = begin + (end - begin) / kVec * kVec;
    for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * kVec; i < vec_end;
         i += kThreads * kVec)
      update<VDT, GDT, ADAM, kVec>(p, adam, value, grad, master, m, v, i);
    scalar_begin = vec_end;
  }
  for (int64_t i = scalar_begin + threadIdx.x; i < end; i += kThreads)
    update<VDT, GDT, ADAM, 1>(p, adam, value, grad, master, m, v, i);
}

/* (float)(1 - beta^t) as the host computes it (lk_adamw_step): pow in double, then rounded */
__device__ __forceinline__ float bias_correction(float beta, int64_t t) {
  return static_cast<float>(1.0 - pow(static_cast<double>(beta), static_cast<double>(t)));
}

/* AdamW's hyperparameters for this launch with the bias corrections of step t =
 * *device_step + 1, and the counter advanced once per step, by the step's last launch, without a
 * second launch:
 * - thread 0 of every block reads *device_step and computes bc1, bc2 into shared memory; the
 *   barrier makes them visible to the block's threads (and finishes the read);
 * - then thread 0 fences (__threadfence: its read is complete before what follows is seen) and
 *   counts its block in *arrivals. The block that draws gridDim.x - 1 is the last: every block
 *   of the grid has read t by then, so it can store *device_step = t (nobody reads it again in
 *   this launch) and zero *arrivals for the next launch. A later launch (stream order, or the
 *   next replay of a graph) sees both stores.
 * Launches of the same step before the last (more than kMaxTensors tensors) only read. The
 * uniform branch and one barrier keep every thread of the block together. */
__device__ __forceinline__ AdamHyper device_step(const OptimParams &p) {
  __shared__ float bc[2];
  int64_t t = 0;
  if (threadIdx.x == 0) {
    t = *static_cast<volatile const int64_t *>(p.device_step) + 1;
    bc[0] = bias_correction(p.adam.b1, t);
    bc[1] = bias_correction(p.adam.b2, t);
  }
  __syncthreads();
  if (threadIdx.x == 0 && p.advance) {
    __threadfence();
    if (atomicAdd(p.arrivals, 1u) == gridDim.x - 1) {
      *p.device_step = t;
      *p.arrivals = 0u;
    }
  }
  AdamHyper h = p.adam;
  h.bc1 = bc[0];
  h.bc2 = bc[1];
  return h;
}

template <bool ADAM>
__global__ void __launch_bounds__(kThreads) optim_kernel(const __grid_constant__ OptimParams p) {
  AdamHyper adam = p.adam;
  if constexpr (ADAM) {
    if (p.device_step) adam = device_step(p); /* uniform: the same for every block */
  }
  if (p.count == 0) return; /* a launch that only advances the counter */
  const int32_t b = static_cast<int32_t>(blockIdx.x);
  const int t = find_tensor(p.chunk_start, p.count, b);
  const int64_t begin = static_cast<int64_t>(b - p.chunk_start[t]) * kChunk;
  const int64_t end = imin<int64_t>(p.numel[t], begin + kChunk);
  const int vdt = p.value_dtype[t], gdt = p.grad_dtype[t];
  if (vdt == LUTRA_F32)
    run_chunk<LUTRA_F32, LUTRA_F32, ADAM>(p, adam, t, begin, end);
  else if (vdt == LUTRA_BF16)
    gdt == LUTRA_F32 ? run_chunk<LUTRA_BF16, LUTRA_F32, ADAM>(p, adam, t, begin, end)
                     : run_chunk<LUTRA_BF16, LUTRA_BF16, ADAM>(p, adam, t, begin, end);
  else
    gdt == LUTRA_F32 ? run_chunk<LUTRA_F16, LUTRA_F32, ADAM>(p, adam, t, begin, end)
                     : run_chunk<LUTRA_F16, LUTRA_F16, ADAM>(p, adam, t, begin, end);
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

cudaError_t optim_launch(const lutra_optim_args *a, bool adam, bool need_m, OptimParams &p,
                         cudaStream_t s) {
  int k = 0;
  int64_t chunks = 0;
  /* last: the step's final launch, which advances a device step counter (one block when no
   * tensor is left for it, so that the counter still advances once per step) */
  auto flush = [&](bool last) -> cudaError_t {
    if (k == 0 && !(last && p.device_step)) return cudaSuccess;
    p.count = k;
    p.chunk_start[k] = static_cast<int32_t>(chunks);
    p.advance = last ? 1 : 0;
    if (k == 0) chunks = 1;
    if (adam)
      optim_kernel<true><<<static_cast<unsigned>(chunks), kThreads, 0, s>>>(p);
    else
      optim_kernel<false><<<static_cast<unsigned>(chunks), kThreads, 0, s>>>(p);
    k = 0;
    chunks = 0;
    return cudaGetLastError();
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
    p.chunk_start[k] = static_cast<int32_t>(chunks);
    chunks += c;
    k++;
  }
  return flush(true);
}

} // namespace

extern "C" cudaError_t lk_sgd_step(const lutra_optim_args *a, cudaStream_t s) {
  const bool momentum = a && a->momentum != 0.0f;
  if (!args_ok(a, momentum, false)) return cudaErrorInvalidValue;
  if (a->count == 0) return cudaSuccess;
  OptimParams p;
  memset(&p, 0, sizeof p);
  p.sgd = SgdHyper{a->lr, a->momentum, a->weight_decay};
  return optim_launch(a, false, momentum, p, s);
}

extern "C" cudaError_t lk_adamw_step(const lutra_optim_args *a, cudaStream_t s) {
  if (!args_ok(a, true, true)) return cudaErrorInvalidValue;
  if (!(a->beta1 >= 0.0f && a->beta1 < 1.0f && a->beta2 >= 0.0f && a->beta2 < 1.0f))
    return cudaErrorInvalidValue;
  const bool counter = a->device_step != nullptr;
  if (counter ? !a->arrivals : a->step < 1) return cudaErrorInvalidValue;
  if (a->count == 0 && !counter) return cudaSuccess;
  OptimParams p;
  memset(&p, 0, sizeof p);
  const float lr = a->lr, wd = a->weight_decay, b1 = a->beta1, b2 = a->beta2;
  p.adam.lr = lr;
  p.adam.decay = lr * wd;
  p.adam.b1 = b1;
  p.adam.b2 = b2;
  p.adam.omb1 = 1.0f - b1;
  p.adam.omb2 = 1.0f - b2;
  if (counter) {
    p.device_step = a->device_step;
    p.arrivals = a->arrivals;
  } else {
    p.adam.bc1 =
        static_cast<float>(1.0 - pow(static_cast<double>(b1), static_cast<double>(a->step)));
    p.adam.bc2 =
        static_cast<float>(1.0 - pow(static_cast<double>(b2), static_cast<double>(a->step)));
  }
  p.adam.eps = a->eps;
  return optim_launch(a, true, true, p, s);
}
