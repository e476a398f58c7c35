/* Rotary position embedding (kernels/rope/rope.h; lutra_rope_args). Semantics:
 * lutra_cpu_rope (src/backend/cpu/rope_cpu.c), bit for bit: the products and the sum of each
 * rotated element are common/f32.cuh's fmul / fsub / fadd (__fmul_rn ... on the device), so nvcc
 * contracts nothing into a fused multiply-add (the CPU's C11 does not either), and the result is
 * rounded once to the dtype by the same round-to-nearest-even store. spec/native/sim_rope.cpp
 * runs this file on the CPU against lutra_cpu_rope.
 *
 * A block per (batch, sequence) token (a grid-stride loop over tokens), its threads over the
 * token's (head, unit) items: a unit is V rotated pairs, or V pass-through elements when out is
 * not in. Consecutive threads take consecutive units of a head, so the loads of x_i and of
 * x_{i + r/2} are each coalesced; the token's (cos, sin) row is read by every head from L1.
 * V = 4 (8-byte loads of 16-bit values, 16-byte loads of f32) where the layout allows it
 * (rotate-half pairs, contiguous head_dim, r/2, the pass-through count and every stride
 * multiples of 4, both pointers aligned: vec4_ok), else 1 (interleaved pairs, any strides). The QKV
 * call of lutra/rope.h is this one launch over the q and k heads of the packed buffer (h =
 * num_heads + num_gqa_groups). */
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"
#include "rope/rope.h"

using namespace lkc;

namespace {

constexpr int kMaxThreads = 128; /* per block; fewer (whole warps) when a token has fewer items */
constexpr int64_t kMaxBlocks = 1 << 20;

struct shape {
  int64_t s, half;
  int64_t in_stride[4], out_stride[4];
  int64_t offset;
  int units;      /* per head: the pair units, then the pass-through units when out is not in */
  int pair_units; /* half / V */
  bool interleaved;
};

/* the raw bits of N consecutive elements (pass-through: copied as they are, NaN payloads too);
 * N = 4 needs 4 * element-size alignment */
template <int DT, int N> __device__ void copy_raw(void *out, int64_t o, const void *in, int64_t i) {
  if constexpr (N == 1 && DT == LUTRA_F32)
    static_cast<uint32_t *>(out)[o] = static_cast<const uint32_t *>(in)[i];
  else if constexpr (N == 1)
    static_cast<uint16_t *>(out)[o] = static_cast<const uint16_t *>(in)[i];
  else if constexpr (DT == LUTRA_F32)
    *reinterpret_cast<uint4 *>(static_cast<float *>(out) + o) =
        *reinterpret_cast<const uint4 *>(static_cast<const float *>(in) + i);
  else
    *reinterpret_cast<uint2 *>(static_cast<uint16_t *>(out) + o) =
        *reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(in) + i);
}

/* (x0, x1) turned by the angle of (c, s): s negated for the inverse; the CPU's operations */
template <bool kInverse> __device__ void rotate(float &x0, float &x1, float2 w) {
  const float c = w.x, s = kInverse ? -w.y : w.y;
  const float y0 = fsub(fmul(x0, c), fmul(x1, s)), y1 = fadd(fmul(x1, c), fmul(x0, s));
  x0 = y0;
  x1 = y1;
}

template <int DT, bool kInverse, int V>
__global__ void rope_kernel(const void *__restrict__ in, void *out,
                            const float2 *__restrict__ table, int64_t tokens, int64_t heads,
                            shape sh) {
  const int items = static_cast<int>(heads) * sh.units;
  const int64_t is = sh.in_stride[3], os = sh.out_stride[3]; /* 1 when V > 1 */
  for (int64_t tok = blockIdx.x; tok < tokens; tok += gridDim.x) {
    const int64_t b = tok / sh.s, t = tok - b * sh.s;
    const float2 *cs = table + (sh.offset + t) * sh.half;
    const int64_t in_tok = b * sh.in_stride[0] + t * sh.in_stride[1];
    const int64_t out_tok = b * sh.out_stride[0] + t * sh.out_stride[1];
    for (int j = threadIdx.x; j < items; j += blockDim.x) {
      const int head = j / sh.units, k = j - head * sh.units;
      const int64_t in_row = in_tok + head * sh.in_stride[2];
      const int64_t out_row = out_tok + head * sh.out_stride[2];
      if (k >= sh.pair_units) { /* pass-through (out is not in) */
        const int64_t e = sh.half * 2 + static_cast<int64_t>(k - sh.pair_units) * V;
        copy_raw<DT, V>(out, out_row + e * os, in, in_row + e * is);
        continue;
      }
      const int64_t i = static_cast<int64_t>(k) * V;
      const int64_t j0 = sh.interleaved ? 2 * i : i, j1 = sh.interleaved ? 2 * i + 1 : i + sh.half;
      float x0[V], x1[V];
      ldv<DT, V>(in, in_row + j0 * is, x0);
      ldv<DT, V>(in, in_row + j1 * is, x1);
      LKC_UNROLL
      for (int v = 0; v < V; v++)
        rotate<kInverse>(x0[v], x1[v], cs[i + v]);
      stv<DT, V>(out, out_row + j0 * os, x0);
      stv<DT, V>(out, out_row + j1 * os, x1);
    }
  }
}

/* whether the 4-wide path can run a: rotate-half pairs, contiguous head_dim, r/2, the
 * pass-through count (out of place) and every stride multiples of 4, in and out aligned to 4
 * elements; then every access is 4 elements on a 4-element boundary */
bool vec4_ok(const lutra_rope_args *a) {
  if (a->interleaved || a->in_stride[3] != 1 || a->out_stride[3] != 1) return false;
  if ((a->rotary_dim / 2) % 4 || (a->in != a->out && (a->d - a->rotary_dim) % 4)) return false;
  for (int i = 0; i < 3; i++)
    if (a->in_stride[i] % 4 || a->out_stride[i] % 4) return false;
  const uintptr_t bytes = a->dtype == LUTRA_F32 ? 16 : 8;
  return aligned(a->in, bytes) && aligned(a->out, bytes);
}

} // namespace

extern "C" cudaError_t lk_rope(const lutra_rope_args *a, cudaStream_t s) {
  if (!a || lutra_rope_args_problem(a)) return cudaErrorInvalidValue;
  const int64_t tokens = a->b * a->s, half = a->rotary_dim / 2;
  if (tokens == 0 || a->h == 0) return cudaSuccess;
  const int V = vec4_ok(a) ? 4 : 1;
  const int64_t pass = a->in == a->out ? 0 : a->d - a->rotary_dim;
  const int64_t units = (half + pass) / V;
  if (a->h * units > INT32_MAX) return cudaErrorInvalidValue;
  shape sh = {};
  sh.s = a->s;
  sh.half = half;
  for (int i = 0; i < 4; i++) {
    sh.in_stride[i] = a->in_stride[i];
    sh.out_stride[i] = a->out_stride[i];
  }
  sh.offset = a->position_offset;
  sh.units = static_cast<int>(units);
  sh.pair_units = static_cast<int>(half / V);
  sh.interleaved = a->interleaved != 0;
  const unsigned blocks = grid_for(tokens, 1, kMaxBlocks);
  const int threads =
      static_cast<int>(imin<int64_t>(cdiv<int64_t>(a->h * units, 32) * 32, kMaxThreads));
  const float2 *table = reinterpret_cast<const float2 *>(a->table);
  return with_float_dtype(a->dtype, [&](auto tag) {
    constexpr int DT = decltype(tag)::value;
    return with_bool(a->inverse != 0, [&](auto inv) {
      constexpr bool kInverse = decltype(inv)::value;
      if (V == 4)
        LKC_LAUNCH((rope_kernel<DT, kInverse, 4>), blocks, threads, 0, s, a->in, a->out, table,
                   tokens, a->h, sh);
      else
        LKC_LAUNCH((rope_kernel<DT, kInverse, 1>), blocks, threads, 0, s, a->in, a->out, table,
                   tokens, a->h, sh);
      return cudaGetLastError();
    });
  });
}
