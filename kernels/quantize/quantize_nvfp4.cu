/* NVFP4 quantization and dequantization (lutra/nvfp4.h), the CPU's src/backend/cpu/nvfp4_cpu.c
 * byte for byte: the per-thread work is kernels/quantize/nvfp4_math.cuh's. Per copy: a launch
 * zeroes the copy's amax word (the second f32 behind its block scales), a launch takes the amax (of
 * the RHT'd values for an RHT copy) into it with atomicMax on the bits (non-negative floats order
 * as their bits; fmaxf drops NaN as the CPU's does), and a launch writes one 1x16 block per thread
 * (or one 16x16 tile per thread for 2D roles), the decode scale by thread 0. Every launch reads
 * the skip flag first. A thread's columnwise block reads 16 values a row apart: correct first,
 * not tuned (Hopper has no FP4 GEMM to feed, so these casts are not on a fast path yet). */
#include "common/launch.cuh"
#include "nvfp4_math.cuh"

using namespace lknv;

namespace {

constexpr int THREADS = 256;

__device__ __forceinline__ bool skipped(const Args &a) {
  return a.skip && *a.skip;
}

__device__ __forceinline__ float *tail(const Args &a, int copy) {
  return reinterpret_cast<float *>(a.scales[copy] +
                                   tail_offset(lines_of(a, copy), len_of(a, copy)));
}

__global__ void k_zero(Args a) {
  if (skipped(a)) return;
  const int copy = threadIdx.x;
  if (copy < 2 && a.scales[copy]) tail(a, copy)[1] = 0.0f;
}

/* the amax of the blocks of copy `copy` into the amax word of every copy in `into` (a bit mask;
 * tiles: x read as rows, into both copies) */
__global__ void __launch_bounds__(THREADS) k_amax(Args a, int copy, int into) {
  if (skipped(a)) return;
  const int64_t nb = len_of(a, copy) / B, n = lines_of(a, copy) * nb;
  float m = 0.0f, v[B];
  for (int64_t i = blockIdx.x * (int64_t)THREADS + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * THREADS) {
    read_block(a, copy, i / nb, i % nb, v);
    m = fmaxf(m, amax16(v));
  }
  for (int o = 16; o > 0; o >>= 1)
    m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  if ((threadIdx.x & 31) == 0)
    for (int c = 0; c < 2; c++)
      if ((into >> c & 1) && a.scales[c])
        atomicMax(reinterpret_cast<unsigned *>(tail(a, c)) + 1, __float_as_uint(m));
}

__global__ void __launch_bounds__(THREADS) k_quantize(Args a, int copy) {
  if (skipped(a)) return;
  float *t = tail(a, copy);
  const float ge = fp4_global_encode(t[1]);
  const int64_t nb = len_of(a, copy) / B, n = lines_of(a, copy) * nb;
  const int64_t i0 = blockIdx.x * (int64_t)THREADS + threadIdx.x;
  for (int64_t i = i0; i < n; i += (int64_t)gridDim.x * THREADS)
    quantize_block(a, copy, i / nb, i % nb, ge);
  if (i0 == 0) t[0] = fdiv(1.0f, ge);
}

__global__ void __launch_bounds__(THREADS) k_tiles(Args a) {
  if (skipped(a)) return;
  const int copy = a.scales[0] ? 0 : 1;
  float *t = tail(a, copy);
  const float ge = fp4_global_encode(t[1]);
  const int64_t cb = a.cols / B, n = a.rows / B * cb;
  const int64_t i0 = blockIdx.x * (int64_t)THREADS + threadIdx.x;
  for (int64_t i = i0; i < n; i += (int64_t)gridDim.x * THREADS)
    quantize_tile(a, i / cb, i % cb, ge);
  if (i0 == 0) {
    for (int c = 0; c < 2; c++)
      if (a.scales[c]) tail(a, c)[0] = fdiv(1.0f, ge);
  }
}

__global__ void __launch_bounds__(THREADS)
    k_dequant(const uint8_t *data, const uint8_t *scales, int64_t rows, int64_t cols, void *out,
              int out_dtype) {
  const int64_t nb = cols / B, n = rows * nb;
  for (int64_t i = blockIdx.x * (int64_t)THREADS + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * THREADS)
    dequant_block(data, scales, rows, cols, i / nb, i % nb, out, out_dtype);
}

unsigned grid_for(int64_t n) {
  return (unsigned)lkc::imax<int64_t>(1, lkc::imin<int64_t>((n + THREADS - 1) / THREADS, 1 << 20));
}

} // namespace

extern "C" cudaError_t lk_quantize_nvfp4(const lutra_quant_args *q, cudaStream_t s) {
  if (!q || !lkc::is_float_dtype(q->x_dtype) || q->out_dtype != LUTRA_E2M1 || q->rows < 0 ||
      q->cols < 0 || q->rows % B || q->cols % B || (q->nvfp4 & ~LUTRA_NVFP4_OPTION_MASK) ||
      ((q->nvfp4 & LUTRA_NVFP4_2D) && (q->nvfp4 & LUTRA_NVFP4_RHT)) || q->dbias || q->act ||
      (q->data && !q->scale_inv) || (q->col_data && !q->col_scale_inv))
    return cudaErrorInvalidValue;
  const Args a = args_of(*q);
  if (q->rows == 0 || q->cols == 0 || (!a.data[0] && !a.data[1])) return cudaSuccess;
  k_zero<<<1, 32, 0, s>>>(a);
  if (q->nvfp4 & LUTRA_NVFP4_2D) {
    /* the amax of x, read as rows (copy 0's blocks), into every copy present */
    k_amax<<<grid_for(q->rows * (q->cols / B)), THREADS, 0, s>>>(a, 0, 3);
    k_tiles<<<grid_for(q->rows / B * (q->cols / B)), THREADS, 0, s>>>(a);
    return cudaGetLastError();
  }
  for (int copy = 0; copy < 2; copy++) {
    if (!a.data[copy]) continue;
    const int64_t n = lines_of(a, copy) * (len_of(a, copy) / B);
    k_amax<<<grid_for(n), THREADS, 0, s>>>(a, copy, 1 << copy);
    k_quantize<<<grid_for(n), THREADS, 0, s>>>(a, copy);
  }
  return cudaGetLastError();
}

extern "C" cudaError_t lk_dequantize_nvfp4(const lutra_dequant_args *d, cudaStream_t s) {
  if (!d || d->dtype != LUTRA_E2M1 || !lkc::is_float_dtype(d->out_dtype) || d->rows < 0 ||
      d->cols < 0 || d->cols % B || !d->data || !d->scale_inv || !d->out)
    return cudaErrorInvalidValue;
  const int64_t n = d->rows * (d->cols / B);
  if (n == 0) return cudaSuccess;
  k_dequant<<<grid_for(n), THREADS, 0, s>>>(static_cast<const uint8_t *>(d->data),
                                            static_cast<const uint8_t *>(d->scale_inv), d->rows,
                                            d->cols, d->out, d->out_dtype);
  return cudaGetLastError();
}
