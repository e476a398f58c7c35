/* An activation inside a cast (lutra_quant_args.act_kind, lutra_grouped_quant_args.act): element
 * (r, c) of the matrix quantized, from the formulas of kernels/activation/activation.cu (the same
 * operations in the same order as src/backend/cpu/activation_cpu.c), rounded once into x's dtype
 * as the activation's kernel stores it. The kind is a run-time switch (uniform across the grid)
 * so that one kernel per dtype pair serves all nine kinds. Loads are per element: a gated kind
 * reads both halves of the pre-activation and dy at half the width. Shared by the tile cast
 * (cast_transpose.cu) and the grouped split-quantize (grouped_quantize.cu). */
#ifndef LUTRA_KERNELS_ACT_CAST_CUH
#define LUTRA_KERNELS_ACT_CAST_CUH

#include "activation_math.cuh"
#include "common/elements.cuh"
#include "common/f32.cuh"

namespace lkact {

/* the activation of kind k (and its derivative); the callers have checked k, and an unknown one
 * would be taken as GELU (erf) */
__device__ __forceinline__ float act_f(int k, float x) {
  return lkc::act_dispatch(
      k, [&](auto kind) { return decltype(kind)::f(x); }, [&] { return lkc::ActGeluErf::f(x); });
}

__device__ __forceinline__ float act_df(int k, float x) {
  return lkc::act_dispatch(
      k, [&](auto kind) { return decltype(kind)::df(x); }, [&] { return lkc::ActGeluErf::df(x); });
}

template <int XD> __device__ __forceinline__ float round_to(float v) {
  if (XD == LUTRA_F32) return v;
  return lkc::half_value<XD>(lkc::half_bits<XD>(v));
}

/* a kind whose input is two halves, a gate and a linear part */
__device__ __forceinline__ bool act_gated(int k) {
  return k == LUTRA_ACT_SWIGLU || k == LUTRA_ACT_GEGLU || k == LUTRA_ACT_REGLU;
}

/* A: any args struct with act, x (dy, the backward's), cols (the matrix quantized), act_kind and
 * act_forward as lutra_quant_args has them; r is a row of the whole matrix. */
template <int XD, class A> __device__ float act_value(const A &a, int64_t r, int64_t c) {
  const int k = a.act_kind;
  float v;
  if (!act_gated(k)) {
    const float x = lkc::ld<XD>(a.act, r * a.cols + c);
    v = a.act_forward ? act_f(k, x) : lkc::fmul(lkc::ld<XD>(a.x, r * a.cols + c), act_df(k, x));
  } else if (a.act_forward) { /* act [rows, 2 cols]: gate, then linear half */
    const float g = lkc::ld<XD>(a.act, r * 2 * a.cols + c);
    const float b = lkc::ld<XD>(a.act, r * 2 * a.cols + a.cols + c);
    v = lkc::fmul(act_f(k, g), b);
  } else { /* act [rows, cols], x (dy) [rows, cols / 2] */
    const int64_t h = a.cols / 2, j = c < h ? c : c - h;
    const float g = lkc::ld<XD>(a.act, r * a.cols + j);
    const float d = lkc::ld<XD>(a.x, r * h + j);
    v = c < h ? lkc::fmul(lkc::fmul(d, lkc::ld<XD>(a.act, r * a.cols + h + j)), act_df(k, g))
              : lkc::fmul(d, act_f(k, g));
  }
  return round_to<XD>(v);
}

/* act_value of elements c .. c + 15 of row r for a kind without a gate, all inside the matrix
 * and 16-byte aligned: 16-byte loads and the kind switched on once, then act_value's operations
 * element by element (the same bits). Per element, loads and switch cost the cast most of its
 * bandwidth. */
template <int XD, class A>
__device__ __forceinline__ void act_values16(const A &a, int64_t r, int64_t c, float (&v)[16]) {
  float x[16], d[16] = {};
  lkc::ldv<XD, 16>(a.act, r * a.cols + c, x);
  if (!a.act_forward) lkc::ldv<XD, 16>(a.x, r * a.cols + c, d);
  auto each = [&](auto act) {
#pragma unroll
    for (int k = 0; k < 16; k++)
      v[k] = round_to<XD>(a.act_forward ? decltype(act)::f(x[k])
                                        : lkc::fmul(d[k], decltype(act)::df(x[k])));
    return 0;
  };
  lkc::act_dispatch(a.act_kind, each, [&] { return each(lkc::ActGeluErf()); });
}

} // namespace lkact

#endif
