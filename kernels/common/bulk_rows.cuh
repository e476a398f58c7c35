/* Rows staged in shared memory by Hopper's bulk copy engine (cp.async.bulk, sm_90), for the
 * row kernels whose memory latency is not hidden by the loads one row ahead that registers can
 * hold (kernels/norm/norm.cu's backward): a block keeps several rows in flight in shared memory
 * stages, each completing on an mbarrier, at no register cost.
 *
 * Protocol (one block, stages s = 0 .. S - 1, row i of the block's loop in stage i % S):
 *   - thread 0 inits the barriers (stage_init), then everyone passes a __syncthreads;
 *   - thread 0 issues a row's copies into its stage (stage_expect, then stage_copy for each
 *     tensor, the bytes adding up to the expected count), and where the barrier was made for two
 *     arrivals, 4-byte copies of values that are not 16-byte aligned (stage_copy4, a row's
 *     statistics) followed by stage_arrive_copies, whose arrival comes when they have landed;
 *   - every thread waits for row i with stage_wait(bar, (i / S) & 1) and reads the stage;
 *   - a stage is issued again only after a __syncthreads that follows every thread's reads of
 *     it (the row's block reduction), thread 0 then fencing the async proxy (stage_reuse_fence).
 * Sizes and global addresses are multiples of 16 bytes (the copy engine's rule).
 *
 * Under the CPU simulation (spec/native/sim_harness.h, LKC_SIM), and in the code built for devices
 * older than sm_90 (which the launchers never pick: bulk_copies()), a copy is a memcpy done at
 * issue and a wait does nothing: the protocol puts a block barrier between every issue and the
 * first read. The simulation checks the protocol's indexing that way, not the mbarriers. */
#ifndef LUTRA_KERNELS_COMMON_BULK_ROWS_CUH
#define LUTRA_KERNELS_COMMON_BULK_ROWS_CUH

#include "common/launch.cuh"

#include <atomic>
#include <cstdint>
#include <cstring>

namespace lkc {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(LKC_SIM)
LKC_D uint32_t smem_addr(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/* arrivals: 1 (the bulk copies alone) or 2 (with stage_arrive_copies) a phase */
LKC_D void stage_init(uint64_t *bar, uint32_t arrivals = 1) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrivals)
               : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/* one arrival (thread 0's) and the bytes the stage's copies will bring */
LKC_D void stage_expect(uint64_t *bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

LKC_D void stage_copy(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
               "[%3];" ::"r"(smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

LKC_D void stage_copy4(void *dst, const void *src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst)), "l"(src)
               : "memory");
}

/* the barrier's second arrival of the phase once this thread's stage_copy4s have landed */
LKC_D void stage_arrive_copies(uint64_t *bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar))
               : "memory");
}

LKC_D void stage_wait(uint64_t *bar, uint32_t parity) {
  asm volatile("{\n"
               ".reg .pred done;\n"
               "WAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra WAIT;\n"
               "}" ::"r"(smem_addr(bar)),
               "r"(parity)
               : "memory");
}

/* the generic-proxy reads of a stage ordered before the copy engine's next writes into it */
LKC_D void stage_reuse_fence() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
#else
LKC_D void stage_init(uint64_t *, uint32_t = 1) {}
LKC_D void stage_expect(uint64_t *, uint32_t) {}
LKC_D void stage_copy(void *dst, const void *src, uint32_t bytes, uint64_t *) {
  memcpy(dst, src, bytes);
}
LKC_D void stage_copy4(void *dst, const void *src) {
  memcpy(dst, src, 4);
}
LKC_D void stage_arrive_copies(uint64_t *) {}
LKC_D void stage_wait(uint64_t *, uint32_t) {}
LKC_D void stage_reuse_fence() {}
#endif

#ifndef LKC_SIM
/* whether the current device has the bulk copy engine (compute capability 9.0 or later) */
inline bool bulk_copies() {
  return device_attr<cudaDevAttrComputeCapabilityMajor>(1) >= 9;
}

/* the most dynamic shared memory a block of the current device may take */
inline int smem_optin() {
  return device_attr<cudaDevAttrMaxSharedMemoryPerBlockOptin>(48 * 1024);
}
#else
/* the simulation takes the staged and the register-loads path in turn, call by call, so that
 * spec/native/sim_norm.cpp checks both against the CPU */
inline bool bulk_copies() {
  static std::atomic<unsigned> calls{0};
  return (calls.fetch_add(1, std::memory_order_relaxed) & 1) == 0;
}
inline int smem_optin() {
  return 227 * 1024;
}
#endif

} // namespace lkc

#endif
