/* The CUDA device model the kernel emulators share (spec/native/sim_*.cpp): each includes this,
 * then the kernels' .cu files, and runs them on the CPU against the CPU backend, one std::thread
 * per CUDA thread. A grid runs block after block; a block's threads run concurrently, with real
 * barriers for __syncthreads and per-warp barriers for the shuffles, votes and matches, so that a
 * missing barrier or a wrong lane shows as a wrong byte or a hang. Atomics take one mutex. The
 * runtime calls the launchers make see a small device (3 SMs, 2 blocks each), so that
 * persistent kernels loop over several tiles per block. Conversions take common/codec.cuh's integer
 * path here (the host has no cvt instruction): the hardware conversions are the GPU specs' job.
 *
 * A sim points its kernels' launch hook at SIM_LAUNCH (LKC_LAUNCH, LKM_LAUNCH) before including
 * them. Needs the CUDA headers and a C++20 compiler, not a GPU. */
#ifndef LUTRA_SIM_HARNESS_H
#define LUTRA_SIM_HARNESS_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

extern "C" {
#include "backend/backend.h"
}

#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__      static
#define __launch_bounds__(...)

struct SimBlock {
  std::barrier<> *block_bar;
  std::vector<std::barrier<> *> warp_bar;
  std::vector<uint64_t> slots; /* one per thread, for shuffles, votes and matches */
  std::vector<unsigned char> smem;
};

static thread_local uint3 sim_tid, sim_bid;
static thread_local int sim_lin; /* the thread's linear index in its block */
static thread_local SimBlock *sim_blk;
static dim3 sim_grid, sim_block;
#define threadIdx sim_tid
#define blockIdx  sim_bid
#define gridDim   sim_grid
#define blockDim  sim_block

/* the block's dynamic shared memory (common/reduce.cuh leaves lkc::dyn_smem to the sim) */
namespace lkc {
static inline unsigned char *dyn_smem() {
  return sim_blk->smem.data();
}
} // namespace lkc
using lkc::dyn_smem;

static inline void __syncthreads() {
  sim_blk->block_bar->arrive_and_wait();
}
static inline void __syncwarp() {
  sim_blk->warp_bar[sim_lin >> 5]->arrive_and_wait();
}

template <typename T> static T __shfl_xor_sync(unsigned, T v, int m) {
  static_assert(sizeof(T) <= 8, "shuffle of a wide type");
  const int t = sim_lin, lane = t & 31, w = t >> 5;
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof v);
  sim_blk->slots[t] = bits;
  sim_blk->warp_bar[w]->arrive_and_wait();
  bits = sim_blk->slots[32 * w + (lane ^ m)];
  sim_blk->warp_bar[w]->arrive_and_wait();
  T r;
  memcpy(&r, &bits, sizeof r);
  return r;
}

static inline int __any_sync(unsigned, int p) {
  const int t = sim_lin, w = t >> 5;
  sim_blk->slots[t] = p != 0;
  sim_blk->warp_bar[w]->arrive_and_wait();
  int any = 0;
  for (int l = 0; l < 32; l++)
    any |= (int)sim_blk->slots[32 * w + l];
  sim_blk->warp_bar[w]->arrive_and_wait();
  return any;
}

static inline unsigned __match_any_sync(unsigned, int v) {
  const int t = sim_lin, w = t >> 5;
  sim_blk->slots[t] = (uint64_t)(uint32_t)v;
  sim_blk->warp_bar[w]->arrive_and_wait();
  unsigned mask = 0;
  for (int l = 0; l < 32; l++)
    if (sim_blk->slots[32 * w + l] == (uint64_t)(uint32_t)v) mask |= 1u << l;
  sim_blk->warp_bar[w]->arrive_and_wait();
  return mask;
}

static inline int __popc(unsigned x) {
  return __builtin_popcount(x);
}
static inline int __ffs(unsigned x) {
  return __builtin_ffs((int)x);
}
static inline unsigned __vmaxu2(unsigned a, unsigned b) {
  const unsigned lo = std::max(a & 0xFFFFu, b & 0xFFFFu), hi = std::max(a >> 16, b >> 16);
  return lo | hi << 16;
}
static inline unsigned __byte_perm(unsigned a, unsigned b, unsigned s) {
  const uint64_t v = (uint64_t)b << 32 | a;
  unsigned r = 0;
  for (int i = 0; i < 4; i++)
    r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
}
static inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
template <typename T> static T __ldg(const T *p) {
  return *p;
}
template <typename T> static T __ldcg(const T *p) {
  return *p;
}

static std::mutex sim_atomic;
static inline int atomicMax(int *p, int v) {
  std::lock_guard<std::mutex> g(sim_atomic);
  const int o = *p;
  *p = std::max(o, v);
  return o;
}
static inline int atomicCAS(int *p, int c, int v) {
  std::lock_guard<std::mutex> g(sim_atomic);
  const int o = *p;
  if (o == c) *p = v;
  return o;
}
template <typename T> static T atomicAdd(T *p, T v) {
  std::lock_guard<std::mutex> g(sim_atomic);
  const T o = *p;
  *p = o + v;
  return o;
}
static inline unsigned atomicExch(unsigned *p, unsigned v) {
  std::lock_guard<std::mutex> g(sim_atomic);
  const unsigned o = *p;
  *p = v;
  return o;
}
static inline void __nanosleep(unsigned) {
  std::this_thread::yield();
}
static inline void __threadfence() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

/* The runtime's rule for dynamic shared memory past 48 KB: a launch asking for more than the
 * kernel's cudaFuncAttributeMaxDynamicSharedMemorySize fails (cudaErrorInvalidValue, at the next
 * cudaGetLastError) and runs nothing, as on the device, where an allowance set for one launch's
 * size and cached (lkc::allow_smem) made a later, larger launch of the same kernel fail. */
static std::map<const void *, int> sim_smem_allowed;
static cudaError_t sim_last_error = cudaSuccess;
constexpr size_t kSimSmemDefault = 48 * 1024, kSimSmemOptin = 227 * 1024;

template <typename K, typename... A>
static void sim_launch(K kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t, A... args) {
  if (smem > kSimSmemDefault) {
    const auto it = sim_smem_allowed.find(reinterpret_cast<const void *>(kernel));
    if (it == sim_smem_allowed.end() || smem > static_cast<size_t>(it->second)) {
      sim_last_error = cudaErrorInvalidValue;
      return;
    }
  }
  sim_grid = grid;
  sim_block = block;
  const unsigned nt = block.x * block.y * block.z;
  for (unsigned bz = 0; bz < grid.z; bz++)
    for (unsigned by = 0; by < grid.y; by++)
      for (unsigned bx = 0; bx < grid.x; bx++) {
        SimBlock blk;
        std::barrier<> bar((std::ptrdiff_t)nt);
        blk.block_bar = &bar;
        std::vector<std::unique_ptr<std::barrier<>>> wb;
        for (unsigned w = 0; w < (nt + 31) / 32; w++) { /* a last partial warp waits for fewer */
          wb.emplace_back(new std::barrier<>(std::min(32u, nt - 32 * w)));
          blk.warp_bar.push_back(wb.back().get());
        }
        blk.slots.assign(nt, 0);
        blk.smem.assign(smem ? smem : 16, 0xA5); /* not zero: reads of unwritten bytes show */
        std::vector<std::thread> th;
        for (unsigned t = 0; t < nt; t++)
          th.emplace_back([&, t] {
            sim_lin = (int)t;
            sim_tid = make_uint3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
            sim_bid = make_uint3(bx, by, bz);
            sim_blk = &blk;
            kernel(args...);
          });
        for (auto &x : th)
          x.join();
      }
}
#define SIM_LAUNCH(kernel, grid, block, smem, stream, ...)                                         \
  sim_launch(kernel, dim3(grid), dim3(block), (smem), (stream), __VA_ARGS__)
#define LKC_SIM 1

extern "C" {
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = sim_last_error;
  sim_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaGetDevice(int *d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr, int) {
  *v = 3;
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *, int, size_t) {
  *n = 2;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void *f, cudaFuncAttribute attr, int v) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (v < 0 || static_cast<size_t>(v) > kSimSmemOptin) return cudaErrorInvalidValue;
  sim_smem_allowed[f] = v;
  return cudaSuccess;
}
}

/* ---- for the checks ------------------------------------------------------------------------- */

static inline int sim_esize(int dt) {
  return dt == LUTRA_F32 ? 4 : 2;
}

/* element i of a buffer of dtype dt (F32, BF16 or F16) set to f, rounded to nearest even */
static inline void sim_put(std::vector<unsigned char> &b, int dt, int64_t i, float f) {
  if (dt == LUTRA_F32)
    memcpy(&b[(size_t)i * 4], &f, 4);
  else {
    const uint16_t h = dt == LUTRA_BF16 ? __bfloat16_as_ushort(__float2bfloat16_rn(f))
                                        : __half_as_ushort(__float2half_rn(f));
    memcpy(&b[(size_t)i * 2], &h, 2);
  }
}

#endif
