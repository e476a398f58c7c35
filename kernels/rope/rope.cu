/* Rotary position embedding (kernels/rope/rope.h; lutra_rope_args). Semantics:
 * lutra_cpu_rope (src/backend/cpu/rope_cpu.c), bit for bit: the products and the sum of each
 * rotated element are common/f32.cuh's fmul / fsub / fadd (__fmul_rn ... on the device), so nvcc
 * contracts nothing into a fused multiply-add (the CPU's C11 does not either), and the result is
 * rounded once to the dtype by the same round-to-nearest-even store. spec/native/sim_rope.cpp
 * runs this file on the CPU against lutra_cpu_rope.
 *
 * A block per (batch, sequence) token (a grid-stride loop over tokens), its threads over the
 * token's (head, unit) items: a unit is one rotated pair, or one pass-through element when out
 * is not in. Consecutive threads take consecutive pairs of a head, so the loads of x_i and of
 * x_{i + r/2} are each coalesced (interleaved: each thread reads two neighbours); the token's
 * (cos, sin) row is read by every head from L1. The QKV call of lutra/rope.h is this one launch
 * over the q and k heads of the packed buffer (h = num_heads + num_gqa_groups). */
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"
#include "rope/rope.h"

using namespace lkc;

namespace {

constexpr int kMaxThreads = 128; /* per block; fewer (whole warps) when a token has fewer items */
constexpr int64_t kMaxBlocks = 1 << 20;

struct shape {
  int64_t s, h, d, half;
  int64_t in_stride[4], out_stride[4];
  int64_t offset;
  int units; /* per head: the pairs, then the pass-through elements when out is not in */
  bool interleaved;
};

/* the raw bits of one element (pass-through: copied as they are, NaN payloads too) */
template <int DT> __device__ void copy_elem(void *out, int64_t o, const void *in, int64_t i) {
  if constexpr (DT == LUTRA_F32)
    static_cast<uint32_t *>(out)[o] = static_cast<const uint32_t *>(in)[i];
  else
    static_cast<uint16_t *>(out)[o] = static_cast<const uint16_t *>(in)[i];
}

template <int DT, bool kInverse>
__global__ void rope_kernel(const void *__restrict__ in, void *out,
                            const float2 *__restrict__ table, int64_t tokens, shape sh) {
  const int items = static_cast<int>(sh.h) * sh.units;
  for (int64_t tok = blockIdx.x; tok < tokens; tok += gridDim.x) {
    const int64_t b = tok / sh.s, t = tok - b * sh.s;
    const float2 *cs = table + (sh.offset + t) * sh.half;
    const int64_t in_tok = b * sh.in_stride[0] + t * sh.in_stride[1];
    const int64_t out_tok = b * sh.out_stride[0] + t * sh.out_stride[1];
    for (int j = threadIdx.x; j < items; j += blockDim.x) {
      const int head = j / sh.units, k = j - head * sh.units;
      const int64_t in_row = in_tok + head * sh.in_stride[2];
      const int64_t out_row = out_tok + head * sh.out_stride[2];
      if (k >= sh.half) { /* pass-through (out is not in) */
        const int64_t e = sh.half * 2 + (k - sh.half);
        copy_elem<DT>(out, out_row + e * sh.out_stride[3], in, in_row + e * sh.in_stride[3]);
        continue;
      }
      const int64_t j0 = sh.interleaved ? 2 * k : k, j1 = sh.interleaved ? 2 * k + 1 : k + sh.half;
      const float x0 = ld<DT>(in, in_row + j0 * sh.in_stride[3]);
      const float x1 = ld<DT>(in, in_row + j1 * sh.in_stride[3]);
      const float2 w = cs[k];
      const float c = w.x, s = kInverse ? -w.y : w.y;
      st<DT>(out, out_row + j0 * sh.out_stride[3], fsub(fmul(x0, c), fmul(x1, s)));
      st<DT>(out, out_row + j1 * sh.out_stride[3], fadd(fmul(x1, c), fmul(x0, s)));
    }
  }
}

} // namespace

extern "C" cudaError_t lk_rope(const lutra_rope_args *a, cudaStream_t s) {
  if (!a || lutra_rope_args_problem(a)) return cudaErrorInvalidValue;
  const int64_t tokens = a->b * a->s, half = a->rotary_dim / 2;
  const bool in_place = a->in == a->out;
  const int64_t units = half + (in_place ? 0 : a->d - a->rotary_dim);
  if (tokens == 0 || a->h == 0) return cudaSuccess;
  if (a->h * units > INT32_MAX) return cudaErrorInvalidValue;
  shape sh = {};
  sh.s = a->s;
  sh.h = a->h;
  sh.d = a->d;
  sh.half = half;
  for (int i = 0; i < 4; i++) {
    sh.in_stride[i] = a->in_stride[i];
    sh.out_stride[i] = a->out_stride[i];
  }
  sh.offset = a->position_offset;
  sh.units = static_cast<int>(units);
  sh.interleaved = a->interleaved != 0;
  const unsigned blocks = grid_for(tokens, 1, kMaxBlocks);
  const int threads =
      static_cast<int>(imin<int64_t>(cdiv<int64_t>(a->h * units, 32) * 32, kMaxThreads));
  const float2 *table = reinterpret_cast<const float2 *>(a->table);
  return with_float_dtype(a->dtype, [&](auto tag) {
    constexpr int DT = decltype(tag)::value;
    return with_bool(a->inverse != 0, [&](auto inv) {
      LKC_LAUNCH((rope_kernel<DT, decltype(inv)::value>), blocks, threads, 0, s, a->in, a->out,
                 table, tokens, sh);
      return cudaGetLastError();
    });
  });
}
