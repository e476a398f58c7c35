/* Warp and block reductions (kernels/common/, see base.cuh): max (fmaxf: NaNs ignored) and sums
 * in fixed trees (the same inputs give the same bits every run), the block's dynamic shared
 * memory and an atomic maximum of non-negative floats. Device code (and the CPU emulations'
 * LKC_SIM). */
#ifndef LUTRA_KERNELS_COMMON_REDUCE_CUH
#define LUTRA_KERNELS_COMMON_REDUCE_CUH

#include "common/f32.cuh"

#if defined(__CUDACC__) || defined(LKC_SIM)
namespace lkc {

#ifndef LKC_SIM
/* the block's dynamic shared memory */
LKC_D unsigned char *dyn_smem() {
  extern __shared__ __align__(16) unsigned char lkc_dyn_smem[];
  return lkc_dyn_smem;
}
#endif

LKC_D float warp_max(float m) {
  LKC_UNROLL
  for (int o = 16; o > 0; o >>= 1)
    m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, o));
  return m;
}

/* max over the block (fmaxf: NaNs ignored); every thread gets it. red: >= 32 floats of shared
 * memory, not in use by anyone else until the next __syncthreads after this returns */
LKC_D float block_max(float m, float *red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  m = warp_max(m);
  __syncthreads(); /* red may still be read from an earlier call */
  if (lane == 0) red[warp] = m;
  __syncthreads();
  m = red[0];
  for (int k = 1; k < nw; k++)
    m = fmaxf(m, red[k]);
  return m;
}

/* *addr = fmaxf(*addr, v) for v >= 0 (not NaN), atomically. The integer maximum of the bit
 * patterns is the float maximum for non-negative values and replaces negative ones (a negative
 * NaN included, which fmaxf also drops); a positive NaN in *addr needs the CAS loop. */
LKC_D void atomic_fmax(float *addr, float v) {
  int old = atomicMax(reinterpret_cast<int *>(addr), (int)f32_bits(v));
  if (old > 0x7F800000) {
    int cur = old;
    for (;;) {
      const float nv = fmaxf(bits_f32((uint32_t)cur), v);
      const int nb = (int)f32_bits(nv);
      if (nb == cur) break;
      const int prev = atomicCAS(reinterpret_cast<int *>(addr), cur, nb);
      if (prev == cur) break;
      cur = prev;
    }
  }
}

LKC_D double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(FULL_MASK, v, o);
  return v;
}

LKC_D float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v = fadd(v, __shfl_xor_sync(FULL_MASK, v, o));
  return v;
}

/* Sum over a block of THREADS threads (1-D); the result is valid in every thread. smem holds
 * THREADS / 32 doubles. Starts with a barrier, so smem may be reused right after a previous
 * call returns. */
template <int THREADS> LKC_D double block_sum(double v, double *smem) {
  static_assert(THREADS % 32 == 0 && THREADS <= 1024, "block size");
  constexpr int W = THREADS / 32;
  v = warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = v;
  __syncthreads();
  double r = 0.0;
#pragma unroll
  for (int w = 0; w < W; w++)
    r += smem[w];
  return r;
}

/* Max over a block of THREADS threads, as block_max(m, red) above but for a block size known
 * at compile time (the loop over the warps unrolled) and starting from -inf: the two differ
 * only when every value is NaN (-inf here, NaN there). smem holds THREADS / 32 floats. */
template <int THREADS> LKC_D float block_max(float v, float *smem) {
  static_assert(THREADS % 32 == 0 && THREADS <= 1024, "block size");
  constexpr int W = THREADS / 32;
  v = warp_max(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = -INFINITY;
#pragma unroll
  for (int w = 0; w < W; w++)
    r = fmaxf(r, smem[w]);
  return r;
}

} // namespace lkc
#endif

#endif
