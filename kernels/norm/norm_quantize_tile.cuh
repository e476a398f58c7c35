/* The fused norm + FP8 cast's tile kernel (k_norm_quantize) and what every kernel of
 * norm_quantize.cu shares (Params, the code and scale helpers). Included by norm_quantize.cu
 * before norm_quantize_rows.cuh; no include guard (spec/native/sim_norm.cpp includes the .cu
 * inside a namespace of its own). The tile kernel:
 * one block of 512 threads per tile of TR rows, in one launch from x to the codes:
 *   1. the row statistics: for block scaling with mean and rstd kept for backward, from
 *      k_row_stats (kernels/norm/norm_rows.cuh) launched first, which the tile kernel reads; else
 * one warp per row (row_stats: norm_fwd's 256-thread split, vector width, per-thread order and
 *      block_sum tree, emulated by the warp's lanes); the same mean and rstd bits as
 *      lk_layernorm_forward either way;
 *   2. per chunk of CW columns: y for the TR x CW sub-tile (16-byte loads, 8 rows x 4 vectors
 *      per warp), with norm_fwd's f32 formula, rounded into the activation dtype as the stored y
 *      would be (and stored when a high-precision output is asked for), into shared memory; from
 *      there the rowwise codes and the columnwise (transposed) codes with their scales, each in
 *      the CPU quantizer's f32 order of operations, so the codes equal lk_layernorm_forward +
 *      the quantizer's bit for bit.
 * Tiles: per-tensor 32 x 256; MXFP8 32 x 256 (a columnwise block is the tile's 32 rows, a
 * rowwise block 32 of its columns); 1x128 blocks 128 x 128 (one block along each direction).
 * x is read twice (statistics, then values); the second time from L2 while the resident tiles
 * (one 32-row tile per SM at 128 registers a thread) fit there.
 * Current scaling runs this kernel twice: first for max|y| (and mean, rstd, y), whose last
 * block writes amax and scale (k_current_scale's arrival count), then the cast with that scale;
 * one launch cannot do both without a grid-wide barrier, since every code needs the amax of
 * every row. */
#include "common/codec.cuh"
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/reduce.cuh"
#include "common/scale.cuh"

namespace {

constexpr int kThreads = 512, kWarps = kThreads / 32;
enum Mode { kTensor = 0, kMx = 1, kBlock = 2 };

template <int MODE> struct TileShape {
  static constexpr int TR = MODE == kBlock ? 128 : 32;
  static constexpr int CW = MODE == kBlock ? 128 : 256;
};

template <int MODE> constexpr int smem_bytes() {
  using T = TileShape<MODE>;
  return T::TR * (T::CW + 1) * 4 + T::TR * 8;
}

struct Params {
  lutra_norm_args n;
  const int32_t *skip;
  uint8_t *data, *col_data;
  void *scale_inv, *col_scale_inv;
  const float *scale;
  float *amax; /* delayed: max-accumulated; current pass 1: the output */
  float fp8_max, max_rcp, amax_epsilon;
  int32_t power_2_scale;
  uint32_t *work;           /* current pass 1 */
  int32_t amax_pass;        /* current pass 1: no codes, amax and scale through work */
  int32_t write_tensor_inv; /* per-tensor: scale_inv outputs = 1 / scale */
  int32_t stats_ready;      /* n.mean / n.rstd hold the rows' statistics (k_row_stats ran) */
  int64_t pair_rows;        /* k_norm_quantize_rows: the rows a block does (an even number) */
};

template <int DT> __device__ __forceinline__ float round_to(float v) {
  if constexpr (DT == LUTRA_F32) {
    return v;
  } else if constexpr (DT == LUTRA_BF16) {
    return __bfloat162float(__float2bfloat16_rn(v));
  } else {
    return __half2float(__float2half_rn(v));
  }
}

template <int OD> __device__ __forceinline__ uint8_t code(float v, float s) {
  return static_cast<uint8_t>(lkc::encode1<OD>(v, s));
}

/* the f32 scale of a 1x128 block from its amax, and its inverse (quantize_cpu.c's order) */
__device__ __forceinline__ float block_scale(const Params &p, float amax) {
  return lkc::scale_rule(amax, p.fp8_max, p.power_2_scale, p.amax_epsilon);
}

/* current scaling's first pass: the block's max|y| into the running maximum; the last block to
 * arrive writes amax and the scale (k_current_scale's arrival protocol,
 * kernels/quantize/quantize.cu) */
__device__ __forceinline__ void tensor_amax_arrive(const Params &p, float m) {
  float *acc = reinterpret_cast<float *>(p.work);
  if (m >= 0.0f) lkc::atomic_fmax(acc, m);
  __threadfence();
  if (atomicAdd(p.work + 1, 1u) == gridDim.x - 1) {
    __threadfence();
    const float am = lkc::bits_f32(atomicExch(p.work, 0u));
    *p.amax = am;
    *const_cast<float *>(p.scale) = lkc::scale_rule(am, p.fp8_max, p.power_2_scale, p.amax_epsilon);
    p.work[1] = 0u;
  }
}

/* per-tensor: both copies' scale_inv = 1 / scale */
__device__ __forceinline__ void write_tensor_inv(const Params &p, float s) {
  const float inv = lkc::div_x86(1.0f, s);
  if (p.scale_inv) *static_cast<float *>(p.scale_inv) = inv;
  if (p.col_scale_inv) *static_cast<float *>(p.col_scale_inv) = inv;
}

template <int DT, int PDT, int OD, int V, int MODE>
__global__ void __launch_bounds__(kThreads, 2) k_norm_quantize(Params p) {
  if (p.skip && *p.skip) return; /* uniform: before any barrier */
  using T = TileShape<MODE>;
  constexpr int TR = T::TR, CW = T::CW, LD = CW + 1;
  float *tile = reinterpret_cast<float *>(lkc::dyn_smem());
  float *smean = tile + TR * LD, *srstd = smean + TR;
  __shared__ float fred[32];
  const lutra_norm_args &a = p.n;
  const int64_t rows = a.rows, h = a.hidden, r0 = static_cast<int64_t>(blockIdx.x) * TR;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  if (p.stats_ready) {
    for (int i = tid; i < TR && r0 + i < rows; i += kThreads) {
      smean[i] = a.rms ? 0.0f : a.mean[r0 + i];
      srstd[i] = a.rstd[r0 + i];
    }
  }
  for (int i = warp; i < TR && !p.stats_ready; i += kWarps) {
    const int64_t r = r0 + i;
    if (r >= rows) break;
    float mean, rstd;
    row_stats<DT, V>(a, r * h, lane, mean, rstd);
    if (lane == 0) {
      smean[i] = mean;
      srstd[i] = rstd;
      if (a.mean && !a.rms) a.mean[r] = mean;
      if (a.rstd) a.rstd[r] = rstd;
    }
  }
  __syncthreads();

  const bool codes = !p.amax_pass;
  const float s = MODE == kTensor && codes ? *p.scale : 1.0f;
  const bool pvec = V > 1 && (reinterpret_cast<uintptr_t>(a.gamma) & 15) == 0 &&
                    (a.rms || (reinterpret_cast<uintptr_t>(a.beta) & 15) == 0);
  float m = -INFINITY;
  for (int64_t c0 = 0; c0 < h; c0 += CW) {
    /* a warp fills 8 rows x 4 vectors: 16-byte loads in 64-byte runs, and for 16-bit inputs
     * its scalar stores (odd row pitch LD) hit 32 distinct banks */
    constexpr int GC = CW / (4 * V), UNITS = (TR / 8) * GC;
    for (int u = warp; u < UNITS; u += kWarps) {
      const int i = (u / GC) * 8 + lane / 4, j = ((u % GC) * 4 + lane % 4) * V;
      const int64_t r = r0 + i, c = c0 + j;
      float v[V];
      if (r < rows && c < h) {
        ldv<DT, V>(a.x, r * h + c, v);
        const float mean = smean[i], rstd = srstd[i];
        float gv[V], bv[V] = {};
        if (pvec) { /* 16-byte parameter loads, not one 2-byte load per element */
          ldv<PDT, V>(a.gamma, c, gv);
          if (!a.rms) ldv<PDT, V>(a.beta, c, bv);
        } else {
#pragma unroll
          for (int k = 0; k < V; k++) {
            gv[k] = ld<PDT>(a.gamma, c + k);
            if (!a.rms) bv[k] = ld<PDT>(a.beta, c + k);
          }
        }
#pragma unroll
        for (int k = 0; k < V; k++) {
          const float gk = a.zero_centered_gamma ? fadd(gv[k], 1.0f) : gv[k];
          float y = fmul(fmul(fsub(v[k], mean), rstd), gk);
          if (!a.rms) y = fadd(y, bv[k]);
          v[k] = y;
        }
        if (a.y) stv<DT, V>(a.y, r * h + c, v);
#pragma unroll
        for (int k = 0; k < V; k++) {
          v[k] = round_to<DT>(v[k]);
          m = fmaxf(m, fabsf(v[k]));
        }
      } else {
#pragma unroll
        for (int k = 0; k < V; k++)
          v[k] = 0.0f;
      }
#pragma unroll
      for (int k = 0; k < V; k++)
        tile[i * LD + j + k] = v[k];
    }
    __syncthreads();
    if (codes && MODE == kTensor) {
      /* four codes a thread, one 4-byte store where the row (column) pitch allows it; the
       * columnwise reads tile[(4 q + k) * LD + j] hit 32 distinct banks (LD odd) */
      if (p.data) {
        const bool w4 = h % 4 == 0 && (reinterpret_cast<uintptr_t>(p.data) & 3) == 0;
        for (int idx = tid; idx < TR * CW / 4; idx += kThreads) {
          const int i = idx / (CW / 4), j = idx % (CW / 4) * 4;
          const int64_t r = r0 + i, c = c0 + j;
          if (r >= rows || c >= h) continue;
          uint32_t q[4];
#pragma unroll
          for (int k = 0; k < 4; k++)
            q[k] = code<OD>(tile[i * LD + j + k], s);
          if (w4) {
            *reinterpret_cast<uint32_t *>(p.data + r * h + c) =
                q[0] | q[1] << 8 | q[2] << 16 | q[3] << 24;
          } else {
            for (int k = 0; k < 4 && c + k < h; k++)
              p.data[r * h + c + k] = static_cast<uint8_t>(q[k]);
          }
        }
      }
      if (p.col_data) {
        const bool w4 = rows % 4 == 0 && (reinterpret_cast<uintptr_t>(p.col_data) & 3) == 0;
        for (int idx = tid; idx < TR * CW / 4; idx += kThreads) {
          const int j = idx / (TR / 4), i = idx % (TR / 4) * 4;
          const int64_t r = r0 + i, c = c0 + j;
          if (r >= rows || c >= h) continue;
          uint32_t q[4];
#pragma unroll
          for (int k = 0; k < 4; k++)
            q[k] = code<OD>(tile[(i + k) * LD + j], s);
          if (w4) {
            *reinterpret_cast<uint32_t *>(p.col_data + c * rows + r) =
                q[0] | q[1] << 8 | q[2] << 16 | q[3] << 24;
          } else {
            for (int k = 0; k < 4 && r + k < rows; k++)
              p.col_data[c * rows + r + k] = static_cast<uint8_t>(q[k]);
          }
        }
      }
    } else if (codes && MODE == kMx) {
      /* rowwise: one warp per (row, 32-column block); columnwise: one warp per column */
      if (p.data) {
        uint8_t *sc = static_cast<uint8_t *>(p.scale_inv);
        for (int w = warp; w < TR * (CW / 32); w += kWarps) {
          const int i = w / (CW / 32), jb = w % (CW / 32);
          const int64_t r = r0 + i, c = c0 + jb * 32 + lane;
          if (r >= rows || c0 + jb * 32 >= h) continue; /* uniform over the warp */
          const float v = tile[i * LD + jb * 32 + lane];
          const float am = fmaxf(0.0f, lkc::warp_max(fabsf(v))); /* NaNs ignored, as fmaxf */
          const uint32_t e = lkc::e8m0_bits(am * p.max_rcp);
          p.data[r * h + c] = code<OD>(v, lkc::mx_scale_rcp(e));
          if (lane == 0) sc[r * (h / 32) + c / 32] = static_cast<uint8_t>(e);
        }
      }
      if (p.col_data) {
        uint8_t *sc = static_cast<uint8_t *>(p.col_scale_inv);
        for (int j = warp; j < CW; j += kWarps) {
          const int64_t c = c0 + j, r = r0 + lane;
          if (c >= h) continue;
          const float v = tile[lane * LD + j];
          const float am = fmaxf(0.0f, lkc::warp_max(fabsf(v)));
          const uint32_t e = lkc::e8m0_bits(am * p.max_rcp);
          p.col_data[c * rows + r] = code<OD>(v, lkc::mx_scale_rcp(e));
          if (lane == 0) sc[c * (rows / 32) + r0 / 32] = static_cast<uint8_t>(e);
        }
      }
    } else if (codes) {
      /* 1x128 blocks: rowwise one warp per row (the chunk is one block), columnwise one warp
       * per column (the tile's 128 rows are one block); padding entries of the tile are 0 */
      const int64_t r4 = (rows + 3) / 4 * 4, h4 = (h + 3) / 4 * 4;
      if (p.data) {
        float *sc = static_cast<float *>(p.scale_inv);
        for (int i = warp; i < TR; i += kWarps) {
          const int64_t r = r0 + i;
          if (r >= rows) break;
          float am = 0.0f;
#pragma unroll
          for (int k = 0; k < CW / 32; k++)
            am = fmaxf(am, fabsf(tile[i * LD + lane + 32 * k]));
          am = lkc::warp_max(am);
          const float bs = block_scale(p, am);
#pragma unroll
          for (int k = 0; k < CW / 32; k++) {
            const int64_t c = c0 + lane + 32 * k;
            if (c < h) p.data[r * h + c] = code<OD>(tile[i * LD + lane + 32 * k], bs);
          }
          if (lane == 0) sc[(c0 / 128) * r4 + r] = lkc::div_x86(1.0f, bs);
        }
      }
      if (p.col_data) {
        float *sc = static_cast<float *>(p.col_scale_inv);
        for (int j = warp; j < CW; j += kWarps) {
          const int64_t c = c0 + j;
          if (c >= h) break;
          float am = 0.0f;
#pragma unroll
          for (int k = 0; k < TR / 32; k++)
            am = fmaxf(am, fabsf(tile[(lane + 32 * k) * LD + j]));
          am = lkc::warp_max(am);
          const float bs = block_scale(p, am);
#pragma unroll
          for (int k = 0; k < TR / 32; k++) {
            const int64_t r = r0 + lane + 32 * k;
            if (r < rows) p.col_data[c * rows + r] = code<OD>(tile[(lane + 32 * k) * LD + j], bs);
          }
          if (lane == 0) sc[(r0 / 128) * h4 + c] = lkc::div_x86(1.0f, bs);
        }
      }
    }
    __syncthreads(); /* the tile is read before the next chunk overwrites it */
  }

  if (MODE != kTensor) return;
  if (p.amax) {
    m = lkc::block_max(m, fred);
    if (tid == 0) {
      if (!p.amax_pass) {
        if (m >= 0.0f) lkc::atomic_fmax(p.amax, m);
      } else {
        tensor_amax_arrive(p, m);
      }
    }
  }
  if (p.write_tensor_inv && blockIdx.x == 0 && tid == 0) write_tensor_inv(p, s);
}

} // namespace
