/* Element-wise conversion, fill, amax, current-scaling scale, per-tensor FP8 cast (rowwise; the
 * transposed output is in cast_transpose.cu and cast_transpose_16bit.cu), dequantization and the
 * delayed-scaling update. Each matches its lutra_cpu_* namesake in src/backend/cpu/quantize_cpu.c
 * bit for bit (see kernels/common/base.cuh).
 *
 * The element-wise kernels work on units of 16 consecutive elements (16-byte loads and stores:
 * 4 x 16 B of f32, 2 x 16 B of bf16/f16, 16 B of FP8) over a grid-stride loop; the last n % 16
 * elements, and whole arrays whose pointers are not 16-byte aligned, take a scalar path. */
#include "cast_transpose.cuh"
#include "common/codec.cuh"
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"
#include "common/reduce.cuh"
#include "common/scale.cuh"

#include <math.h>

using namespace lkc;

namespace {

constexpr int THREADS = 256;
constexpr int UNIT = 16;

/* blocks for n elements: one thread per 16-element unit (vector path) or per element */
inline int64_t flat_blocks(int64_t n, bool vec) {
  const int64_t items = vec ? (n + UNIT - 1) / UNIT : n;
  return (items + THREADS - 1) / THREADS;
}

__device__ __forceinline__ int64_t thread_id() {
  return (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t thread_count() {
  return (int64_t)gridDim.x * blockDim.x;
}

/* ---- convert --------------------------------------------------------------------------------- */

template <int SD, int DD, bool VEC>
__global__ void __launch_bounds__(THREADS) k_convert(const void *src, void *dst, int64_t n) {
  const int64_t tid = thread_id(), nt = thread_count();
  int64_t done = 0;
  if (VEC) {
    const int64_t units = n / UNIT;
    for (int64_t u = tid; u < units; u += nt) {
      float v[UNIT];
      ldv<SD, 16>(src, u * UNIT, v);
      stv<DD, 16>(dst, u * UNIT, v);
    }
    done = units * UNIT;
  }
  for (int64_t i = done + tid; i < n; i += nt)
    st<DD>(dst, i, ld<SD>(src, i));
}

/* ---- fill ------------------------------------------------------------------------------------ */

/* n elements of ESZ bytes, each the low ESZ bytes of `pattern` (16-bit patterns repeated twice) */
template <int ESZ, bool VEC>
__global__ void __launch_bounds__(THREADS) k_fill(void *dst, int64_t n, uint32_t pattern) {
  const int64_t tid = thread_id(), nt = thread_count();
  int64_t done = 0;
  if (VEC) {
    const int64_t units = n * ESZ / 16;
    uint4 *d = static_cast<uint4 *>(dst);
    const uint4 p = make_uint4(pattern, pattern, pattern, pattern);
    for (int64_t u = tid; u < units; u += nt)
      d[u] = p;
    done = units * 16 / ESZ;
  }
  for (int64_t i = done + tid; i < n; i += nt) {
    if (ESZ == 4)
      static_cast<uint32_t *>(dst)[i] = pattern;
    else
      static_cast<uint16_t *>(dst)[i] = (uint16_t)pattern;
  }
}

/* ---- amax ------------------------------------------------------------------------------------ */

/* m = fmaxf(m, |x|) over this thread's elements; -inf when it saw no non-NaN element */
template <int DT, bool VEC>
__device__ __forceinline__ float thread_amax(const void *x, int64_t n, int64_t tid, int64_t nt) {
  float m = -INFINITY;
  int64_t done = 0;
  if (VEC) {
    const int64_t units = n / UNIT;
    for (int64_t u = tid; u < units; u += nt) {
      float v[UNIT];
      ldv<DT, 16>(x, u * UNIT, v);
#pragma unroll
      for (int k = 0; k < UNIT; k++)
        m = fmaxf(m, fabsf(v[k]));
    }
    done = units * UNIT;
  }
  for (int64_t i = done + tid; i < n; i += nt)
    m = fmaxf(m, fabsf(ld<DT>(x, i)));
  return m;
}

/* max-accumulates a block's amax into *amax (nothing when the block saw only NaNs) */
__device__ __forceinline__ void commit_amax(float m, float *amax) {
  __shared__ float red[32];
  m = block_max(m, red);
  if (threadIdx.x == 0 && m >= 0.0f) atomic_fmax(amax, m);
}

template <int DT, bool VEC>
__global__ void __launch_bounds__(THREADS) k_amax(const void *x, int64_t n, float *amax) {
  commit_amax(thread_amax<DT, VEC>(x, n, thread_id(), thread_count()), amax);
}

/* ---- current scaling: amax and scale in one launch ------------------------------------------- */

/* *amax = max|x| (as memset 0 + k_amax), *scale = scale_rule(*amax), without a memset before and
 * without a second launch after. The blocks max-accumulate into work[0] (an f32, zero on entry),
 * then count themselves in work[1]: thread 0 of each block makes its atomic_fmax visible
 * (__threadfence) before its atomicAdd on the counter, so the block that draws gridDim.x - 1 is
 * the last to arrive and work[0] holds every block's maximum. That block takes the maximum
 * (atomicExch leaves work[0] zero), writes amax and scale, and zeroes the counter: the next call
 * finds both words zero again. With skip set nothing is touched (the flag is uniform, so whole
 * blocks return before their barriers). */
template <int DT, bool VEC>
__global__ void __launch_bounds__(THREADS)
    k_current_scale(const void *x, int64_t n, float fp8_max, int power_2_scale, float epsilon,
                    float *amax, float *scale, uint32_t *work, const int32_t *skip) {
  if (skip && *skip) return;
  __shared__ float red[32];
  const float m = block_max(thread_amax<DT, VEC>(x, n, thread_id(), thread_count()), red);
  if (threadIdx.x != 0) return;
  float *acc = reinterpret_cast<float *>(work);
  if (m >= 0.0f) atomic_fmax(acc, m); /* nothing when the block saw only NaNs (or nothing) */
  __threadfence();
  if (atomicAdd(work + 1, 1u) != gridDim.x - 1) return;
  __threadfence();
  const float a = bits_f32(atomicExch(work, 0u));
  *amax = a;
  *scale = scale_rule(a, fp8_max, power_2_scale, epsilon);
  work[1] = 0u;
}

/* ---- per-tensor cast, rowwise output and/or amax --------------------------------------------- */

struct CastArgs {
  const void *x;
  uint8_t *data; /* NULL: amax only */
  float *scale_inv, *col_scale_inv;
  const float *scale;
  float *amax;
  const int32_t *skip; /* lutra_quant_args.skip */
  int64_t n;
};

template <int XD, int OD, bool VEC> __global__ void __launch_bounds__(THREADS) k_cast(CastArgs a) {
  if (a.skip && *a.skip) return; /* uniform: before commit_amax's barriers */
  const float s = *a.scale;
  const int64_t tid = thread_id(), nt = thread_count();
  float m = -INFINITY;
  int64_t done = 0;
  if (VEC) {
    const int64_t units = a.n / UNIT;
    for (int64_t u = tid; u < units; u += nt) {
      float v[UNIT];
      ldv<XD, 16>(a.x, u * UNIT, v);
      if (a.amax) {
#pragma unroll
        for (int k = 0; k < UNIT; k++)
          m = fmaxf(m, fabsf(v[k]));
      }
      if (a.data) *reinterpret_cast<uint4 *>(a.data + u * UNIT) = encode16<OD>(v, s);
    }
    done = units * UNIT;
  }
  for (int64_t i = done + tid; i < a.n; i += nt) {
    const float v = ld<XD>(a.x, i);
    m = fmaxf(m, fabsf(v));
    if (a.data) a.data[i] = (uint8_t)encode1<OD>(v, s);
  }
  if (a.amax) commit_amax(m, a.amax);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const float inv = div_x86(1.0f, s);
    if (a.scale_inv) *a.scale_inv = inv;
    if (a.col_scale_inv) *a.col_scale_inv = inv;
  }
}

/* ---- dequantize ------------------------------------------------------------------------------ */

struct DequantArgs {
  const uint8_t *data;
  const void *scale_inv;
  int64_t n, cols;
  int64_t ld; /* block scales' row stride: roundup(rows, 4) (1D), roundup(ceil(cols/128), 4) (2D) */
  void *out;
  int scaling;
};

/* the scale inverse of element i (the first of its unit on the vector path) */
__device__ __forceinline__ float dequant_factor(const DequantArgs &a, int64_t i) {
  switch (a.scaling) {
  case LUTRA_SCALING_TENSOR:
    return *static_cast<const float *>(a.scale_inv);
  case LUTRA_SCALING_MXFP8: /* cols % 32 == 0: r * (cols / 32) + c / 32 == i / 32 */
    return e8m0_value(static_cast<const uint8_t *>(a.scale_inv)[i / 32]);
  case LUTRA_SCALING_ROWWISE: /* one per row of the copy (lutra/formats.h) */
    return static_cast<const float *>(a.scale_inv)[i / a.cols];
  default: {
    /* lutra.h's layout: 1D [ceil(cols/128)][ld], block j of row r at j * ld + r; 2D
     * [ceil(rows/128)][ld], tile (i, j) at i * ld + j */
    const int64_t r = i / a.cols, c = i - r * a.cols;
    const int64_t idx =
        a.scaling == LUTRA_SCALING_BLOCK_2D ? r / 128 * a.ld + c / 128 : c / 128 * a.ld + r;
    return static_cast<const float *>(a.scale_inv)[idx];
  }
  }
}

template <int DT, int OD, bool VEC>
__global__ void __launch_bounds__(THREADS) k_dequant(DequantArgs a) {
  const int64_t tid = thread_id(), nt = thread_count();
  int64_t done = 0;
  if (VEC) {
    const int64_t units = a.n / UNIT;
    for (int64_t u = tid; u < units; u += nt) {
      const uint4 q = *reinterpret_cast<const uint4 *>(a.data + u * UNIT);
      const float f = dequant_factor(a, u * UNIT);
      const uint32_t w[4] = {q.x, q.y, q.z, q.w};
      float v[UNIT];
      float c[UNIT];
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const float2 lo = fp8x2_values<DT>(w[j]), hi = fp8x2_values<DT>(w[j] >> 16);
        c[4 * j] = lo.x;
        c[4 * j + 1] = lo.y;
        c[4 * j + 2] = hi.x;
        c[4 * j + 3] = hi.y;
      }
#pragma unroll
      for (int k = 0; k < UNIT; k++)
        v[k] = c[k] * f;
      /* an f32 output keeps a NaN product's bits, which are x86's on the CPU (the NaN scale
       * inverse's sign, or inf * 0's default NaN); a bf16 / f16 output has one NaN */
      if (OD == LUTRA_F32) {
        bool any_nan = false;
#pragma unroll
        for (int k = 0; k < UNIT; k++)
          any_nan |= is_nan(v[k]);
        if (any_nan) {
#pragma unroll
          for (int k = 0; k < UNIT; k++)
            if (is_nan(v[k])) v[k] = mul_x86(c[k], f);
        }
      }
      stv<OD, 16>(a.out, u * UNIT, v);
    }
    done = units * UNIT;
  }
  for (int64_t i = done + tid; i < a.n; i += nt) {
    const float c = fp8_value<DT>(a.data[i]), f = dequant_factor(a, i);
    st<OD>(a.out, i, OD == LUTRA_F32 ? mul_x86(c, f) : c * f);
  }
}

/* ---- delayed scaling update ------------------------------------------------------------------ */

/* what the launch reads of a meta (src/backend/cuda/backend_cuda.c keys a cached update by
 * the same fields: keep the two alike) */
struct DelayedMeta {
  float *scale, *scale_inv, *history;
  int32_t history_len, algo;
  float fp8_max;
  int32_t margin;
};

template <int K> struct DelayedParams {
  int32_t n, pad;
  DelayedMeta m[K];
};

constexpr int DELAYED_THREADS = 256;
constexpr int DELAYED_PER_THREAD = 4;

/* One block per meta, as lutra_cpu_delayed_update: the history rolls left by one (the value
 * leaving at [0] re-enters at [len-1]), [0] is zeroed, and scale/scale_inv follow from the
 * max over the rolled history or from the most recent amax. The roll goes in chunks: every
 * thread reads its old values h[i+1] of a chunk, the block synchronizes, then writes h[i];
 * chunk k+1 reads only indices above those chunk k writes, and writes only after its own
 * barrier, which every thread passes after finishing its chunk-k reads. */
template <int K>
__global__ void __launch_bounds__(DELAYED_THREADS)
    k_delayed(const __grid_constant__ DelayedParams<K> p) {
  if ((int)blockIdx.x >= p.n) return;
  const DelayedMeta &m = p.m[blockIdx.x];
  float *h = m.history;
  const int64_t len = m.history_len;
  const float last = h[0];
  float mx = 0.0f;
  constexpr int64_t CHUNK = (int64_t)DELAYED_THREADS * DELAYED_PER_THREAD;
  for (int64_t base = 0; base < len - 1; base += CHUNK) {
    float val[DELAYED_PER_THREAD];
#pragma unroll
    for (int e = 0; e < DELAYED_PER_THREAD; e++) {
      const int64_t i = base + e * DELAYED_THREADS + threadIdx.x;
      val[e] = i < len - 1 ? h[i + 1] : 0.0f;
      mx = fmaxf(mx, val[e]);
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < DELAYED_PER_THREAD; e++) {
      const int64_t i = base + e * DELAYED_THREADS + threadIdx.x;
      if (i >= 1 && i < len - 1) h[i] = val[e];
    }
  }
  __shared__ float red[32];
  mx = block_max(mx, red); /* its barriers also order the roll before the writes below */
  if (threadIdx.x == 0) {
    if (len > 1) h[len - 1] = last;
    h[0] = 0.0f;
    mx = fmaxf(mx, last);
    const float amax = m.algo == LUTRA_AMAX_MOST_RECENT ? last : mx;
    float scale;
    if (is_finite(amax) && amax > 0.0f)
      scale = div_x86(div_x86(m.fp8_max, exp2_int(m.margin)), amax);
    else
      scale = *m.scale;
    if (is_inf(scale)) scale = FLT_MAX_F;
    *m.scale = scale;
    *m.scale_inv = div_x86(1.0f, scale);
  }
}

template <int K> cudaError_t launch_delayed(lutra_scale_meta *const *metas, int n, cudaStream_t s) {
  DelayedParams<K> p;
  memset(&p, 0, sizeof p);
  p.n = n;
  for (int j = 0; j < n; j++) {
    const lutra_scale_meta *m = metas[j];
    p.m[j] =
        DelayedMeta{m->scale,   m->scale_inv, m->amax_history, m->history_len, m->amax_compute_algo,
                    m->fp8_max, m->margin};
  }
  LKC_LAUNCH(k_delayed<K>, n, DELAYED_THREADS, 0, s, p);
  return cudaGetLastError();
}

static_assert(sizeof(DelayedParams<768>) <= 32764, "kernel parameters of at most 32764 bytes");

} // namespace

/* ---- launchers ------------------------------------------------------------------------------- */

extern "C" cudaError_t lk_convert(const void *src, int src_dtype, void *dst, int dst_dtype,
                                  int64_t n, cudaStream_t s) {
  if (!is_float_dtype(src_dtype) || !is_float_dtype(dst_dtype) || n < 0)
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (!src || !dst) return cudaErrorInvalidValue;
  if (src_dtype == dst_dtype) {
    if (src == dst) return cudaSuccess;
    const size_t bytes = (size_t)n * (src_dtype == LUTRA_F32 ? 4 : 2);
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
  }
  const bool vec = aligned(src, 16) && aligned(dst, 16);
  return with_float_dtype(src_dtype, [&](auto sd) {
    return with_float_dtype(dst_dtype, [&](auto dd) {
      return with_bool(vec, [&](auto v) {
        constexpr int SD = decltype(sd)::value, DD = decltype(dd)::value;
        if constexpr (SD == DD) {
          return cudaErrorInvalidValue; /* handled above */
        } else {
          constexpr auto K = k_convert<SD, DD, decltype(v)::value>;
          LKC_LAUNCH(K, persistent_grid<K>(flat_blocks(n, vec), THREADS, 0), THREADS, 0, s, src,
                     dst, n);
          return cudaGetLastError();
        }
      });
    });
  });
}

extern "C" cudaError_t lk_fill(void *dst, int dtype, int64_t n, float value, cudaStream_t s) {
  uint32_t pattern;
  int esz;
  switch (dtype) {
  case LUTRA_F32:
    pattern = f32_bits(value);
    esz = 4;
    break;
  case LUTRA_BF16:
  case LUTRA_F16: {
    const uint32_t h = dtype == LUTRA_BF16 ? bf16_bits(value) : f16_bits(value);
    pattern = h | (h << 16);
    esz = 2;
    break;
  }
  case LUTRA_I32: {
    /* labels: truncated toward zero, NaN to 0, clamped to the int32 range */
    int32_t k;
    if (value != value)
      k = 0;
    else if (value >= 2147483648.0f)
      k = INT32_MAX;
    else if (value <= -2147483648.0f)
      k = INT32_MIN;
    else
      k = (int32_t)value;
    pattern = (uint32_t)k;
    esz = 4;
    break;
  }
  default:
    return cudaErrorInvalidValue;
  }
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (!dst) return cudaErrorInvalidValue;
  const bool vec = aligned(dst, 16);
  const int64_t blocks = flat_blocks(vec ? n * esz / 16 + 1 : n, false);
  return with_bool(vec, [&](auto v) {
    constexpr auto K4 = k_fill<4, decltype(v)::value>;
    constexpr auto K2 = k_fill<2, decltype(v)::value>;
    if (esz == 4)
      LKC_LAUNCH(K4, persistent_grid<K4>(blocks, THREADS, 0), THREADS, 0, s, dst, n, pattern);
    else
      LKC_LAUNCH(K2, persistent_grid<K2>(blocks, THREADS, 0), THREADS, 0, s, dst, n, pattern);
    return cudaGetLastError();
  });
}

extern "C" cudaError_t lk_amax(const void *x, int dtype, int64_t n, float *amax, cudaStream_t s) {
  if (!is_float_dtype(dtype) || !amax || n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (!x) return cudaErrorInvalidValue;
  const bool vec = aligned(x, 16);
  return with_float_dtype(dtype, [&](auto d) {
    return with_bool(vec, [&](auto v) {
      constexpr auto K = k_amax<decltype(d)::value, decltype(v)::value>;
      LKC_LAUNCH(K, persistent_grid<K>(flat_blocks(n, vec), THREADS, 0), THREADS, 0, s, x, n, amax);
      return cudaGetLastError();
    });
  });
}

extern "C" cudaError_t lk_current_scale(const void *x, int dtype, int64_t n, float fp8_max,
                                        int power_2_scale, float epsilon, float *amax, float *scale,
                                        uint32_t *work, const int32_t *skip, cudaStream_t s) {
  if (!is_float_dtype(dtype) || !amax || !scale || !work || n < 0 || (n > 0 && !x))
    return cudaErrorInvalidValue;
  /* n == 0 still launches (one block): amax 0 and its scale are written */
  const bool vec = aligned(x, 16);
  return with_float_dtype(dtype, [&](auto d) {
    return with_bool(vec, [&](auto v) {
      constexpr auto K = k_current_scale<decltype(d)::value, decltype(v)::value>;
      LKC_LAUNCH(K, persistent_grid<K>(flat_blocks(n, vec), THREADS, 0), THREADS, 0, s, x, n,
                 fp8_max, power_2_scale, epsilon, amax, scale, work, skip);
      return cudaGetLastError();
    });
  });
}

extern "C" cudaError_t lk_cast(const lutra_quant_args *a, cudaStream_t s) {
  if (!a || !is_float_dtype(a->x_dtype) || !is_fp8_dtype(a->out_dtype) || a->rows < 0 ||
      a->cols < 0 || !a->scale)
    return cudaErrorInvalidValue;
  const int64_t n = a->rows * a->cols;
  if (a->act && n > 0) {
    /* an activation inside the cast is formed in the tiled kernel (rowwise-only too) */
    if (a->act_kind < 0 || a->act_kind >= LUTRA_ACT_COUNT || (!a->act_forward && !a->x) ||
        (a->act_forward == 0 && a->act_kind != 0 && lutra_act_is_gated(a->act_kind) &&
         a->cols % 2 != 0))
      return cudaErrorInvalidValue;
    return cast_transpose(a, s);
  }
  if (a->col_data && n > 0) {
    if (!a->x) return cudaErrorInvalidValue;
    return cast_transpose(a, s);
  }
  CastArgs c;
  c.x = a->x;
  c.data = static_cast<uint8_t *>(a->data);
  c.scale_inv = static_cast<float *>(a->scale_inv);
  c.col_scale_inv = static_cast<float *>(a->col_scale_inv);
  c.scale = a->scale;
  c.amax = a->amax;
  c.skip = a->skip;
  /* the CPU reads x only for rowwise data or an amax; scale_inv is written even when empty */
  c.n = (c.data || c.amax) ? n : 0;
  if (c.n == 0 && !c.scale_inv && !c.col_scale_inv) return cudaSuccess;
  if (c.n > 0 && !c.x) return cudaErrorInvalidValue;
  const bool vec = aligned(c.x, 16) && aligned(c.data, 16);
  return with_float_dtype(a->x_dtype, [&](auto xd) {
    return with_fp8_dtype(a->out_dtype, [&](auto od) {
      return with_bool(vec, [&](auto v) {
        constexpr auto K = k_cast<decltype(xd)::value, decltype(od)::value, decltype(v)::value>;
        LKC_LAUNCH(K, persistent_grid<K>(flat_blocks(c.n, vec), THREADS, 0), THREADS, 0, s, c);
        return cudaGetLastError();
      });
    });
  });
}

extern "C" cudaError_t lk_dequantize(const lutra_dequant_args *a, cudaStream_t s) {
  if (a && a->scaling == LUTRA_SCALING_NVFP4) return lk_dequantize_nvfp4(a, s);
  if (!a || !is_fp8_dtype(a->dtype) || !is_float_dtype(a->out_dtype) || a->rows < 0 ||
      a->cols < 0 || !a->data || !a->scale_inv || !a->out)
    return cudaErrorInvalidValue;
  switch (a->scaling) {
  case LUTRA_SCALING_TENSOR:
  case LUTRA_SCALING_BLOCK_1D:
  case LUTRA_SCALING_BLOCK_2D:
  case LUTRA_SCALING_ROWWISE:
    break;
  case LUTRA_SCALING_MXFP8:
    if (a->cols % 32 != 0) return cudaErrorInvalidValue;
    break;
  default:
    return cudaErrorInvalidValue;
  }
  DequantArgs d;
  d.data = static_cast<const uint8_t *>(a->data);
  d.scale_inv = a->scale_inv;
  d.n = a->rows * a->cols;
  d.cols = a->cols;
  d.ld = a->scaling == LUTRA_SCALING_BLOCK_2D ? ((a->cols + 127) / 128 + 3) / 4 * 4
                                              : (a->rows + 3) / 4 * 4;
  d.out = a->out;
  d.scaling = a->scaling;
  if (d.n == 0) return cudaSuccess;
  /* a 16-element unit stays within one row and one scale block when cols % 16 == 0 */
  const bool vec = aligned(d.data, 16) && aligned(d.out, 16) && a->cols % UNIT == 0;
  return with_fp8_dtype(a->dtype, [&](auto dt) {
    return with_float_dtype(a->out_dtype, [&](auto od) {
      return with_bool(vec, [&](auto v) {
        constexpr auto K = k_dequant<decltype(dt)::value, decltype(od)::value, decltype(v)::value>;
        LKC_LAUNCH(K, persistent_grid<K>(flat_blocks(d.n, vec), THREADS, 0), THREADS, 0, s, d);
        return cudaGetLastError();
      });
    });
  });
}

extern "C" cudaError_t lk_delayed_update(lutra_scale_meta *const *metas, int n, cudaStream_t s) {
  if (n < 0 || (n > 0 && !metas)) return cudaErrorInvalidValue;
  /* check every meta before launching anything, as the CPU backend does */
  for (int j = 0; j < n; j++) {
    const lutra_scale_meta *m = metas[j];
    if (!m || !m->scale || !m->scale_inv || !m->amax_history || m->history_len < 1 ||
        (m->amax_compute_algo != LUTRA_AMAX_MAX && m->amax_compute_algo != LUTRA_AMAX_MOST_RECENT))
      return cudaErrorInvalidValue;
  }
  for (int j0 = 0; j0 < n;) {
    const int left = n - j0;
    cudaError_t e;
    int k;
    if (left <= 16) {
      k = left;
      e = launch_delayed<16>(metas + j0, k, s);
    } else if (left <= 128) {
      k = left;
      e = launch_delayed<128>(metas + j0, k, s);
    } else {
      k = left < 768 ? left : 768;
      e = launch_delayed<768>(metas + j0, k, s);
    }
    if (e != cudaSuccess) return e;
    j0 += k;
  }
  return cudaSuccess;
}
