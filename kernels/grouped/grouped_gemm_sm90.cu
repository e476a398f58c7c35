/* GroupedLinear's GEMMs on Hopper: CUTLASS's pointer-array grouped GEMM (TMA loads, warp-
 * specialized cooperative kernel, persistent group tile scheduler), with the problem sizes in
 * device memory, so the host never learns the splits. Built for sm_90a only (the wgmma and
 * TMA-descriptor-modification instructions need it); the CUTLASS headers come from PyPI's
 * nvidia-cutlass (Makefile: CUTLASS_VERSION).
 *
 * Per pass, in lutra's row-major terms (CUTLASS: D [M, N] = A [M, K] B [K, N]):
 *   FPROP  y_e  [s_e, out] = x_e  [s_e, in] . W_e^T             M = s_e, N = out, K = in
 *   DGRAD  dx_e [s_e, in]  = dy_e [s_e, out] . W_e               M = s_e, N = in,  K = out
 *   WGRAD  dW_e [out, in]  = dy_e^T . x_e                        M = out, N = in,  K = s_e
 * FP8 operands are the packed copies of backend/grouped_layout.h used TN (DGRAD reads W's
 * columnwise copy, WGRAD the columnwise copies of dy and x, K = the padded rows), with
 * alpha_e = scale_inv(A_e) scale_inv(B_e) per expert. An expert without rows is an empty
 * problem (M = 0) in FPROP and DGRAD; in WGRAD it reads K = 16 zero rows from the scratch's
 * zero region (the kernel needs one K step to clear its accumulators), so dW_e = 0 (+ dW_e).
 *
 * The instantiations (each costs minutes of compile time; nothing else is instantiated):
 *   Bf16Tn      bf16 x bf16 -> bf16, A K-major, B K-major        FPROP (+ bias, BiasEpilogue)
 *   Bf16Nn      bf16 x bf16 -> bf16, A K-major, B N-major        DGRAD
 *   Bf16Nt      bf16 x bf16 -> bf16, A M-major, B N-major        WGRAD into the gradient
 *   Bf16NtF32   as Bf16Nt -> f32, beta = 1                       WGRAD into main_grad
 *   Fp8Fprop    e4m3 x e4m3 -> bf16, TN, fast accumulation       FPROP (+ bias); DGRAD/WGRAD
 *                                                                of an E4M3 grad_output (bias 0)
 *   Fp8Grad     e5m2 x e4m3 -> bf16, TN, promoted accumulation   DGRAD, WGRAD (HYBRID)
 *   Fp8GradF32  e5m2 x e4m3 -> f32, TN, beta = 1                 WGRAD into main_grad (HYBRID)
 * Tiles 128x256x64 in 2x1 clusters (bf16), 128x256x128 in 2x1 clusters (Fp8Fprop) and
 * 128x128x128, cluster 1x1 (the other FP8 ones). f32 modules are
 * cudaErrorNotSupported (an f32 GroupedLinear runs per-expert cuBLASLt GEMMs from host splits).
 *
 * FP8 operands the FP8 instantiations do not take (MXFP8: Hopper has no MXFP8 tensor cores;
 * 1x128 / 128x128 blocks: CUTLASS's Hopper grouped kernels take per-tensor scales only; an E4M3
 * grad_output into main_grad) run as Linear runs them on Hopper (backend/cuda/gemm_cuda.c): each
 * operand dequantized to bf16 by one launch for all experts (kernels/grouped/grouped_dequant.cu,
 * into the workspace after the CUTLASS kernels' own, in the bf16 path's orientation), then the bf16
 * instantiation of the pass, with K = the padded rows in WGRAD as the FP8 kernels.
 *
 * A GEMM object is initialized once per instantiation, scratch, workspace and expert count
 * (its arguments point at the scratch arrays, whose contents change, not at the values), and
 * then only launched: no descriptor, heuristic or allocation per call. The kernels write their
 * TMA descriptors into the workspace as they start, so sharing the stream's GEMM workspace with
 * cuBLASLt between calls is safe. */
#include "grouped_kernels.h"

#include "backend/grouped_layout.h"

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include <cub/block/block_scan.cuh>

#include <stdint.h>

/* The file's own code lives in a named namespace, not an anonymous one: for a __global__
 * template instantiated with types from an anonymous namespace that also does `using namespace
 * cute`, the host-side launch functions nvcc generates name those types ambiguously and the
 * build fails. */
namespace lk_grouped_sm90 {

using namespace cute;
using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using Problem = ProblemShape::UnderlyingProblemShape;
using RowMajor = cutlass::layout::RowMajor;
using ColMajor = cutlass::layout::ColumnMajor;
using bf16 = cutlass::bfloat16_t;
using e4m3 = cutlass::float_e4m3_t;
using e5m2 = cutlass::float_e5m2_t;

#if defined(CUTLASS_ARCH_MMA_MODIFIABLE_TMA_SM90_SUPPORTED)
constexpr bool kBuilt = true;
#else
constexpr bool kBuilt = false;
#endif

/* FPROP's epilogue: D = alpha_e acc + bias_e[n] in f32 (the bias row broadcast over the
 * expert's rows from a pointer per expert; a NULL array reads 0), rounded once into D */
template <class ED, class Tile>
using BiasEpilogue = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<cutlass::homogeneous_multiply_add, ED, float,
                                           cutlass::FloatRoundStyle::round_to_nearest>,
    cutlass::epilogue::fusion::Sm90ScalarBroadcastPtrArray<float, Stride<_0, _0, int64_t>>,
    cutlass::epilogue::fusion::Sm90AccFetch,
    cutlass::epilogue::fusion::Sm90RowBroadcast<0, Tile, bf16 *, float, Stride<_0, _1, _0>>>;

template <class EA, class LA, class EB, class LB, class ED, class Tile, class Schedule,
          class ClusterShape = Shape<_1, _1, _1>, bool Bias = false>
struct Config {
  static constexpr bool kBias = Bias;
  using ElementA = EA;
  using ElementB = EB;
  using ElementD = ED;
  static constexpr int kAlignA = 16 / sizeof(EA), kAlignB = 16 / sizeof(EB),
                       kAlignD = 16 / sizeof(ED);
  using Cluster = ClusterShape;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ED, RowMajor *, kAlignD, ED,
      RowMajor *, kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cute::conditional_t<Bias, BiasEpilogue<ED, Tile>,
                          cutlass::epilogue::fusion::LinearCombination<ED, float>>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, EA, LA *, kAlignA, EB, LB *, kAlignB,
      float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      Schedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideC;
  using StrideD = typename Kernel::InternalStrideD;
};

/* bf16: 128 x 256 tiles in clusters of two along M (each B tile multicast to both CTAs) */
using TileBf16 = Shape<_128, _256, _64>;
using ClusterBf16 = Shape<_2, _1, _1>;
using TileFp8 = Shape<_128, _128, _128>;
/* e4m3 x e4m3: 128 x 256 tiles in clusters of two along M, as bf16 */
using TileFp8Fprop = Shape<_128, _256, _128>;
using Coop = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
using CoopFast = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum;

using Bf16Tn = Config<bf16, RowMajor, bf16, ColMajor, bf16, TileBf16, Coop, ClusterBf16, true>;
using Bf16Nn = Config<bf16, RowMajor, bf16, RowMajor, bf16, TileBf16, Coop, ClusterBf16>;
using Bf16Nt = Config<bf16, ColMajor, bf16, RowMajor, bf16, TileBf16, Coop, ClusterBf16>;
using Bf16NtF32 = Config<bf16, ColMajor, bf16, RowMajor, float, TileBf16, Coop, ClusterBf16>;
using Fp8Fprop =
    Config<e4m3, RowMajor, e4m3, ColMajor, bf16, TileFp8Fprop, CoopFast, ClusterBf16, true>;
using Fp8Grad = Config<e5m2, RowMajor, e4m3, ColMajor, bf16, TileFp8, Coop>;
using Fp8GradF32 = Config<e5m2, RowMajor, e4m3, ColMajor, float, TileFp8, Coop>;

/* The argument arrays in scratch (after the row offsets), num entries each. */
template <class C> struct Arrays {
  Problem *problems;
  const typename C::ElementA **a;
  const typename C::ElementB **b;
  const typename C::ElementD **c;
  typename C::ElementD **d;
  typename C::StrideA *sa;
  typename C::StrideB *sb;
  typename C::StrideC *sc;
  typename C::StrideD *sd;
  float *alpha;
  const float **alpha_ptr;
  const char *zeros;
};

template <class T> T *carve(char *&p, int num) {
  T *r = reinterpret_cast<T *>(p);
  p += ((size_t)num * sizeof(T) + 15) / 16 * 16;
  return r;
}

template <class C> Arrays<C> arrays_of(void *scratch, int num, int64_t in, int64_t out) {
  char *p = lk_grouped_gemm_arrays(scratch, num);
  Arrays<C> a;
  a.problems = carve<Problem>(p, num);
  a.a = carve<const typename C::ElementA *>(p, num);
  a.b = carve<const typename C::ElementB *>(p, num);
  a.c = carve<const typename C::ElementD *>(p, num);
  a.d = carve<typename C::ElementD *>(p, num);
  a.sa = carve<typename C::StrideA>(p, num);
  a.sb = carve<typename C::StrideB>(p, num);
  a.sc = carve<typename C::StrideC>(p, num);
  a.sd = carve<typename C::StrideD>(p, num);
  a.alpha = carve<float>(p, num);
  a.alpha_ptr = carve<const float *>(p, num);
  a.zeros = static_cast<const char *>(scratch) + lutra_grouped_scratch_bytes(num, in, out) -
            lutra_grouped_zero_bytes(in, out);
  return a;
}

/* What the setup kernel reads, by value. */
struct Setup {
  int pass, num, fp8, align;
  const int32_t *splits;
  int32_t *bad_split;
  int32_t *save_splits; /* FPROP: the splits copied here as read (lutra_grouped_gemm_args) */
  int64_t total_rows, in, out;
  const char *x, *dy;      /* bf16 token operands */
  const void *const *w;    /* bf16 weights */
  const void *const *bias; /* FPROP: bf16 biases, or NULL */
  void *y, *dx;            /* bf16 outputs */
  void *const *dw;         /* WGRAD outputs */
  lutra_grouped_fp8 xq, dyq, wq;
  int64_t *R, *P, *ok;
  /* dequantized FP8 (lk_grouped_gemm_dequantizes): the bf16 token operand ah ([padded rows,
   * K-side cols] at the padded offsets) and the other one bh (FPROP, DGRAD: the experts'
   * weights, pw padded rows each; WGRAD: x at the padded offsets) */
  int deq;
  const char *ah, *bh;
  int64_t pw;
};

__device__ __forceinline__ float scale16(const void *p, int e) {
  return static_cast<const float *>(p)[16 * e];
}

constexpr int kSetupThreads = 256;

/* The row offsets R (token rows) and P (rows padded to align) of every expert: each thread sums
 * a run of consecutive experts, one block-wide scan places the runs (a single thread walking 64
 * experts waits on 64 dependent global round trips before the GEMM may start). */
template <class C> __global__ void k_setup(Setup s, Arrays<C> a) {
  using EA = typename C::ElementA;
  using EB = typename C::ElementB;
  using ED = typename C::ElementD;
  using Scan = cub::BlockScan<long long, kSetupThreads>;
  __shared__ typename Scan::TempStorage scan;
  const int per = (s.num + kSetupThreads - 1) / kSetupThreads;
  const int e0 = min((int)threadIdx.x * per, s.num), e1 = min(e0 + per, s.num);
  long long r = 0, p = 0;
  int negative = 0;
  for (int e = e0; e < e1; e++) {
    const long long n = s.splits[e];
    if (s.save_splits) s.save_splits[e] = static_cast<int32_t>(n);
    negative |= n < 0;
    r += n < 0 ? 0 : n;
    p += n < 0 ? 0 : (n + s.align - 1) / s.align * s.align;
  }
  long long r_total;
  Scan(scan).ExclusiveSum(r, r, r_total);
  __syncthreads(); /* the scan's storage is reused */
  Scan(scan).ExclusiveSum(p, p);
  for (int e = e0; e < e1; e++) {
    const long long n = s.splits[e] < 0 ? 0 : s.splits[e];
    r += n;
    p += (n + s.align - 1) / s.align * s.align;
    s.R[e + 1] = r;
    s.P[e + 1] = p;
  }
  if (threadIdx.x == 0) s.R[0] = s.P[0] = 0;
  const int ok = !__syncthreads_or(negative) && r_total == s.total_rows;
  if (threadIdx.x == 0) {
    *s.ok = ok;
    if (!ok && s.bad_split) *s.bad_split = 1;
  }
  const int64_t in = s.in, out = s.out;
  for (int e = threadIdx.x; e < s.num; e += blockDim.x) {
    const int64_t R = s.R[e], P = s.P[e], n = s.R[e + 1] - R;
    int M, N, K;
    const void *pa, *pb;
    void *pd;
    float alpha = 1.0f;
    if (s.pass == LUTRA_GROUPED_FPROP) {
      M = (int)n, N = (int)out, K = (int)in;
      pd = static_cast<char *>(s.y) + R * out * (int64_t)sizeof(ED);
      if (s.deq) {
        pa = s.ah + P * in * 2;
        pb = s.bh + (int64_t)e * s.pw * in * 2;
      } else if (s.fp8) {
        pa = static_cast<const uint8_t *>(s.xq.data) + P * in;
        pb = static_cast<const uint8_t *>(s.wq.data) + (int64_t)e * out * in;
        alpha = scale16(s.xq.scale_inv, e) * scale16(s.wq.scale_inv, e);
      } else {
        pa = s.x + R * in * 2;
        pb = s.w[e];
      }
    } else if (s.pass == LUTRA_GROUPED_DGRAD) {
      M = (int)n, N = (int)in, K = (int)out;
      pd = static_cast<char *>(s.dx) + R * in * (int64_t)sizeof(ED);
      if (s.deq) { /* the weights' columnwise copies, transposed back to [out, in] */
        pa = s.ah + P * out * 2;
        pb = s.bh + (int64_t)e * s.pw * in * 2;
      } else if (s.fp8) {
        pa = static_cast<const uint8_t *>(s.dyq.data) + P * out;
        pb = static_cast<const uint8_t *>(s.wq.col_data) + (int64_t)e * out * in;
        alpha = scale16(s.dyq.scale_inv, e) * scale16(s.wq.col_scale_inv, e);
      } else {
        pa = s.dy + R * out * 2;
        pb = s.w[e];
      }
    } else {
      const int64_t p = s.P[e + 1] - P;
      M = (int)out, N = (int)in, K = (int)(s.fp8 || s.deq ? p : n);
      pd = s.dw[e];
      if (s.deq) { /* the columnwise copies of dy and x, transposed back ([p, out], [p, in]) */
        pa = s.ah + P * out * 2;
        pb = s.bh + P * in * 2;
      } else if (s.fp8) {
        pa = static_cast<const uint8_t *>(s.dyq.col_data) + P * out;
        pb = static_cast<const uint8_t *>(s.xq.col_data) + P * in;
        alpha = scale16(s.dyq.col_scale_inv, e) * scale16(s.xq.col_scale_inv, e);
      } else {
        pa = s.dy + R * out * 2;
        pb = s.x + R * in * 2;
      }
      if (K == 0) { /* an empty expert: 16 zero rows, so the kernel clears its accumulators */
        K = 16;
        pa = pb = a.zeros;
        alpha = 0.0f;
      }
    }
    if (!ok) M = 0; /* bad splits: nothing is written */
    a.problems[e] = Problem(M, N, K);
    a.a[e] = static_cast<const EA *>(pa);
    a.b[e] = static_cast<const EB *>(pb);
    a.d[e] = static_cast<ED *>(pd);
    a.c[e] = static_cast<const ED *>(pd);
    a.sa[e] = cutlass::make_cute_packed_stride(typename C::StrideA{}, {M, K, 1});
    a.sb[e] = cutlass::make_cute_packed_stride(typename C::StrideB{}, {N, K, 1});
    a.sc[e] = cutlass::make_cute_packed_stride(typename C::StrideC{}, {M, N, 1});
    a.sd[e] = cutlass::make_cute_packed_stride(typename C::StrideD{}, {M, N, 1});
    a.alpha[e] = alpha;
    a.alpha_ptr[e] = a.alpha + e;
  }
}

int sm_count() {
  static thread_local int n = 0;
  if (n <= 0) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0)
      n = 132;
  }
  return n;
}

/* D = alpha_e acc (+ beta C) */
template <class F, class A> void set_lincomb(F &fusion, const A &a, float beta) {
  fusion.alpha = 0.0f;
  fusion.beta = beta;
  fusion.alpha_ptr = nullptr;
  fusion.beta_ptr = nullptr;
  fusion.alpha_ptr_array = a.alpha_ptr;
  fusion.beta_ptr_array = nullptr;
  fusion.dAlpha = {cute::_0{}, cute::_0{}, 1};
  fusion.dBeta = {cute::_0{}, cute::_0{}, 0};
}

template <class C>
typename C::Gemm::Arguments arguments(const Arrays<C> &a, int num, float beta,
                                      const void *const *bias) {
  using Gemm = typename C::Gemm;
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = sm_count();
  typename Gemm::Arguments args;
  decltype(args.epilogue.thread) fusion;
  if constexpr (C::kBias) {
    /* the tree's leaves in order (alpha, acc, bias), then its node */
    fusion = {{{0.0f}, {nullptr}, {a.alpha_ptr}, {{cute::_0{}, cute::_0{}, 1}}},
              {},
              {reinterpret_cast<const bf16 *const *>(bias), bf16(0.0f), {}},
              {}};
    (void)beta;
  } else {
    set_lincomb(fusion, a, beta);
  }
  args = typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                                  {num, a.problems, nullptr},
                                  {a.a, a.sa, a.b, a.sb},
                                  {fusion, a.c, a.sc, a.d, a.sd},
                                  hw};
  return args;
}

/* the initialized GEMM objects of this thread, per instantiation, with their launch grid */
template <class C> struct Cached {
  void *scratch = nullptr, *workspace = nullptr;
  const void *const *bias = nullptr;
  int num = 0;
  float beta = 0.0f;
  typename C::Gemm gemm;
  dim3 grid;
};

/* The kernel of an initialized GEMM object, launched directly: GemmUniversalAdapter::run would
 * also set the kernel's non-portable-cluster attribute on every launch of a clustered kernel (a
 * driver call per GEMM that the 2-CTA clusters here do not need: portable cluster sizes go up
 * to 8), and recompute the grid, which depends only on what initialize saw. */
template <class C> cudaError_t launch(Cached<C> &c, cudaStream_t st) {
  using K = typename C::Kernel;
  using Cl = typename C::Cluster;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = c.grid;
  cfg.blockDim = K::get_block_shape();
  cfg.dynamicSmemBytes = K::SharedStorageSize;
  cfg.stream = st;
  cudaLaunchAttribute cluster[1];
  cluster[0].id = cudaLaunchAttributeClusterDimension;
  cluster[0].val.clusterDim.x = size<0>(Cl{});
  cluster[0].val.clusterDim.y = size<1>(Cl{});
  cluster[0].val.clusterDim.z = size<2>(Cl{});
  cfg.attrs = cluster;
  cfg.numAttrs = size(Cl{}) > 1 ? 1 : 0;
  /* the launch copies the parameters: the cached object's own are passed */
  void *params[] = {const_cast<typename K::Params *>(&c.gemm.params())};
  return cudaLaunchKernelExC(&cfg, reinterpret_cast<const void *>(cutlass::device_kernel<K>),
                             params);
}
constexpr int kCacheSlots = 8;

template <class C>
cudaError_t run(const Setup &s, void *scratch, float beta, void *workspace, size_t ws_bytes,
                cudaStream_t st) {
  if (!kBuilt) return cudaErrorNotSupported;
  if (C::kBias && beta != 0.0f) return cudaErrorNotSupported; /* its epilogue reads no C */
  const Arrays<C> a = arrays_of<C>(scratch, s.num, s.in, s.out);
  k_setup<C><<<1, kSetupThreads, 0, st>>>(s, a);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  static thread_local Cached<C> cache[kCacheSlots];
  static thread_local int next = 0;
  Cached<C> *hit = nullptr;
  for (auto &c : cache)
    if (c.scratch == scratch && c.workspace == workspace && c.num == s.num && c.beta == beta &&
        c.bias == s.bias)
      hit = &c;
  if (!hit) {
    auto args = arguments<C>(a, s.num, beta, s.bias);
    if (C::Gemm::get_workspace_size(args) > ws_bytes) return cudaErrorInvalidValue;
    Cached<C> &slot = cache[next];
    next = (next + 1) % kCacheSlots;
    if (slot.gemm.can_implement(args) != cutlass::Status::kSuccess ||
        slot.gemm.initialize(args, workspace, st) != cutlass::Status::kSuccess) {
      slot.scratch = nullptr;
      return cudaErrorNotSupported;
    }
    slot.grid = C::Kernel::get_grid_shape(slot.gemm.params());
    slot.scratch = scratch;
    slot.workspace = workspace;
    slot.num = s.num;
    slot.beta = beta;
    slot.bias = s.bias;
    hit = &slot;
  }
  err = launch<C>(*hit, st);
  return err != cudaSuccess ? err : cudaGetLastError();
}

/* the bf16 instantiation of a pass (bf16 operands, or FP8 ones dequantized to bf16) */
cudaError_t run_bf16(const Setup &s, int pass, bool f32_out, float beta, void *scratch,
                     void *workspace, size_t ws_bytes, cudaStream_t st) {
  if (pass == LUTRA_GROUPED_FPROP) return run<Bf16Tn>(s, scratch, 0.0f, workspace, ws_bytes, st);
  if (pass == LUTRA_GROUPED_DGRAD) return run<Bf16Nn>(s, scratch, 0.0f, workspace, ws_bytes, st);
  if (f32_out) return run<Bf16NtF32>(s, scratch, beta, workspace, ws_bytes, st);
  return run<Bf16Nt>(s, scratch, beta, workspace, ws_bytes, st);
}

template <class C> size_t workspace_of(int num) {
  Arrays<C> a{};
  auto args = arguments<C>(a, num, 0.0f, nullptr);
  return C::Gemm::get_workspace_size(args);
}

} // namespace lk_grouped_sm90

using namespace lk_grouped_sm90;

extern "C" size_t lk_grouped_gemm_workspace(int num) {
  size_t w = 0;
  const size_t each[] = {workspace_of<Bf16Tn>(num),    workspace_of<Bf16Nn>(num),
                         workspace_of<Bf16Nt>(num),    workspace_of<Bf16NtF32>(num),
                         workspace_of<Fp8Fprop>(num),  workspace_of<Fp8Grad>(num),
                         workspace_of<Fp8GradF32>(num)};
  for (size_t v : each)
    w = v > w ? v : w;
  return w;
}

extern "C" cudaError_t lk_grouped_gemm(const lutra_grouped_gemm_args *g, void *workspace,
                                       size_t workspace_bytes, cudaStream_t st) {
  if (g->dtype != LUTRA_BF16 || g->in % 16 || g->out % 16) return cudaErrorNotSupported;
  if (g->pass == LUTRA_GROUPED_FPROP && g->bias && g->bias_dtype != LUTRA_BF16)
    return cudaErrorNotSupported;
  Setup s{};
  s.pass = g->pass;
  s.num = g->num;
  s.fp8 = g->fp8;
  s.align = g->fp8 ? (g->pass == LUTRA_GROUPED_FPROP ? g->xq.align : g->dyq.align) : 1;
  s.splits = g->splits;
  s.bad_split = g->bad_split;
  s.save_splits = g->pass == LUTRA_GROUPED_FPROP ? g->save_splits : nullptr;
  s.total_rows = g->total_rows;
  s.in = g->in;
  s.out = g->out;
  s.x = static_cast<const char *>(g->x);
  s.dy = static_cast<const char *>(g->dy);
  s.w = g->w;
  s.bias = g->pass == LUTRA_GROUPED_FPROP ? g->bias : nullptr;
  s.y = g->y;
  s.dx = g->dx;
  s.dw = g->dw;
  s.xq = g->xq;
  s.dyq = g->dyq;
  s.wq = g->wq;
  s.R = lk_grouped_row_offsets(g->scratch, g->num);
  s.P = s.R + (g->num + 1);
  s.ok = lk_grouped_splits_ok(g->scratch, g->num);
  const bool wgrad = g->pass == LUTRA_GROUPED_WGRAD;
  const bool f32_out = wgrad && g->dw_dtype == LUTRA_F32;
  if (wgrad && g->dw_dtype != LUTRA_F32 && g->dw_dtype != LUTRA_BF16) return cudaErrorNotSupported;
  const float beta = wgrad && g->accumulate ? 1.0f : 0.0f;
  cudaError_t err;
  if (g->fp8 && lk_grouped_gemm_dequantizes(g)) {
    /* the operands to bf16 in the workspace after the CUTLASS kernels' own, then the bf16
     * kernels on them */
    size_t ab, bb;
    lk_grouped_dequant_bytes(g, &ab, &bb);
    const size_t off = (lk_grouped_gemm_workspace(g->num) + 255) / 256 * 256;
    if (workspace_bytes < off + ab + bb) return cudaErrorInvalidValue;
    char *ah = static_cast<char *>(workspace) + off, *bh = ah + ab;
    const lutra_grouped_fp8 *tok = g->pass == LUTRA_GROUPED_FPROP ? &g->xq : &g->dyq;
    const int64_t tok_cap = g->total_rows + (int64_t)g->num * (tok->align - 1);
    const int64_t w_cap = (int64_t)g->num * lutra_grouped_roundup(g->out, g->wq.align);
    const int64_t tok_cols = g->pass == LUTRA_GROUPED_FPROP ? g->in : g->out;
    err = lk_grouped_dequantize(tok, wgrad, g->splits, 0, g->num, g->total_rows, tok_cols, tok_cap,
                                ah, st);
    if (err == cudaSuccess && wgrad)
      err = lk_grouped_dequantize(&g->xq, 1, g->splits, 0, g->num, g->total_rows, g->in, tok_cap,
                                  bh, st);
    else if (err == cudaSuccess)
      err = lk_grouped_dequantize(&g->wq, g->pass == LUTRA_GROUPED_DGRAD, nullptr, g->out, g->num,
                                  (int64_t)g->num * g->out, g->in, w_cap, bh, st);
    if (err != cudaSuccess) return err;
    s.fp8 = 0;
    s.deq = 1;
    s.ah = ah;
    s.bh = bh;
    s.pw = lutra_grouped_roundup(g->out, g->wq.align);
    err = run_bf16(s, g->pass, f32_out, beta, g->scratch, workspace, workspace_bytes, st);
  } else if (!g->fp8) {
    err = run_bf16(s, g->pass, f32_out, beta, g->scratch, workspace, workspace_bytes, st);
  } else {
    const int a_dtype = g->pass == LUTRA_GROUPED_FPROP ? g->xq.dtype : g->dyq.dtype;
    const int b_dtype = g->pass == LUTRA_GROUPED_WGRAD ? g->xq.dtype : g->wq.dtype;
    if (b_dtype != LUTRA_E4M3 || g->xq.scaling != LUTRA_SCALING_TENSOR ||
        g->wq.scaling != LUTRA_SCALING_TENSOR ||
        (g->pass != LUTRA_GROUPED_FPROP && g->dyq.scaling != LUTRA_SCALING_TENSOR))
      return cudaErrorNotSupported;
    if (a_dtype == LUTRA_E4M3 && !f32_out)
      err = run<Fp8Fprop>(s, g->scratch, beta, workspace, workspace_bytes, st);
    else if (a_dtype == LUTRA_E5M2 && !f32_out)
      err = run<Fp8Grad>(s, g->scratch, beta, workspace, workspace_bytes, st);
    else if (a_dtype == LUTRA_E5M2)
      err = run<Fp8GradF32>(s, g->scratch, beta, workspace, workspace_bytes, st);
    else
      return cudaErrorNotSupported;
  }
  return err;
}
