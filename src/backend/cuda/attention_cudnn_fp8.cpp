/* FP8 attention's cuDNN graphs (attention_cudnn.h; lutra_attention_args with fp8 = 1), as
 * TransformerEngine's fused_attn_fp8 builds them for delayed scaling: sdpa_fp8 over E4M3 q, k,
 * v writing E4M3 O, the softmax statistics and the amaxes of S and O; sdpa_fp8_backward over
 * those, dO and the gradients in the grad dtype (E5M2 under HYBRID), writing the amaxes of dQ,
 * dK, dV and dP. On Hopper cuDNN writes neither a BF16 O nor BF16 gradients from FP8 attention
 * (sdpa_support_surface.h: Blackwell and cuDNN 9.13 only), hence the FP8 outputs that the module
 * dequantizes. Every scale is a [1, 1, 1, 1] f32 tensor in device memory: the module's state
 * (backend/args_attention.h's layout), bound per call, so that a replayed CUDA graph reads the
 * scales of each step's update. */
/* GCC 12 at -O2 sees a memset of 2^64 - 8 bytes in cudnn-frontend's ReshapeNode (inlined through
 * the FP8 backward's reshape of S) on a path where the rank is never 0, a false positive of
 * -Wstringop-overflow; silenced for this file only */
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#include "backend/cuda/attention_cudnn.h"

#include <cuda_runtime.h>

namespace lutra_cudnn {

namespace {

constexpr fe::DataType_t f32 = fe::DataType_t::FLOAT;

fe::DataType_t fp8_type(int32_t dtype) {
  return dtype == LUTRA_E5M2 ? fe::DataType_t::FP8_E5M2 : fe::DataType_t::FP8_E4M3;
}

/* an amax cuDNN writes: one f32 */
void amax_output(const tensor &t, int64_t id) {
  t->set_output(true).set_uid(id).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(f32);
}

tensor scale_input(fe::graph::Graph &g, const char *name, int64_t id) {
  return scalar(g, name, id, f32);
}

} // namespace

int fp8_check(const lutra_attention_args *a, const char *fn) {
  CHECK_ARG(a->dropout == 0.0f, "FP8 attention runs without dropout (got %g)", (double)a->dropout);
  CHECK_ARG(a->grad_dtype == LUTRA_E4M3 || a->grad_dtype == LUTRA_E5M2,
            "the FP8 grad dtype %d is not e4m3 or e5m2", (int)a->grad_dtype);
  if (a->d != 128)
    return lutra_error(LUTRA_EUNSUPPORTED, fn,
                       "FP8 attention takes head_dim 128 (cuDNN's FP8 backward on Hopper), not "
                       "%lld",
                       (long long)a->d);
  int device = 0, major = 0, minor = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (e != cudaSuccess) return lutra_cuda_status(e, fn, "reading the compute capability");
  if (major < 9)
    return lutra_error(LUTRA_EUNSUPPORTED, fn,
                       "cuDNN's FP8 attention needs Hopper (sm_90) or newer; device %d is "
                       "sm_%d%d (run the module without fp8)",
                       device, major, minor);
  return LUTRA_OK;
}

std::shared_ptr<fe::graph::Graph> fp8_forward_graph(const lutra_attention_args *a) {
  auto g = graph_of(fe::DataType_t::FP8_E4M3);
  auto q = input(*g, "Q", Q, bhsd(a->b, a->h, a->s_q, a->d), a->q_stride);
  auto k = input(*g, "K", K, bhsd(a->b, a->h_kv, a->s_kv, a->d), a->k_stride);
  auto v = input(*g, "V", V, bhsd(a->b, a->h_kv, a->s_kv, a->d), a->v_stride);
  auto options =
      fe::graph::SDPA_fp8_attributes().set_name("lutra_attention_fp8").set_generate_stats(true);
  common_options(options, a, *g);
  auto [o, stats, amax_s, amax_o] = g->sdpa_fp8(
      q, k, v, scale_input(*g, "Descale_Q", DESCALE_Q), scale_input(*g, "Descale_K", DESCALE_K),
      scale_input(*g, "Descale_V", DESCALE_V), scale_input(*g, "Descale_S", DESCALE_S),
      scale_input(*g, "Scale_S", SCALE_S), scale_input(*g, "Scale_O", SCALE_O), options);
  output(o, O, bhsd(a->b, a->h, a->s_q, a->d), a->o_stride);
  o->set_data_type(fe::DataType_t::FP8_E4M3);
  stats_layout(*stats, a).set_output(true);
  amax_output(amax_s, AMAX_S);
  amax_output(amax_o, AMAX_O);
  return g;
}

std::shared_ptr<fe::graph::Graph> fp8_backward_graph(const lutra_attention_args *a) {
  auto g = graph_of(fe::DataType_t::FP8_E4M3);
  const fe::DataType_t grad = fp8_type(a->grad_dtype);
  auto q = input(*g, "Q", Q, bhsd(a->b, a->h, a->s_q, a->d), a->q_stride);
  auto k = input(*g, "K", K, bhsd(a->b, a->h_kv, a->s_kv, a->d), a->k_stride);
  auto v = input(*g, "V", V, bhsd(a->b, a->h_kv, a->s_kv, a->d), a->v_stride);
  auto o = input(*g, "O", O, bhsd(a->b, a->h, a->s_q, a->d), a->o_stride);
  auto dout = input(*g, "dO", DO, bhsd(a->b, a->h, a->s_q, a->d), a->o_stride);
  dout->set_data_type(grad);
  fe::graph::Tensor_attributes stats_in;
  auto stats = g->tensor(stats_layout(stats_in, a));
  /* cuDNN's default unless the determinism switch asks for its deterministic algorithm */
  auto options = fe::graph::SDPA_fp8_backward_attributes()
                     .set_name("lutra_attention_fp8_backward")
                     .set_deterministic_algorithm(a->deterministic != 0);
  common_options(options, a, *g);
  auto [dq, dk, dv, amax_dq, amax_dk, amax_dv, amax_dp] = g->sdpa_fp8_backward(
      q, k, v, o, dout, stats, scale_input(*g, "Descale_Q", DESCALE_Q),
      scale_input(*g, "Descale_K", DESCALE_K), scale_input(*g, "Descale_V", DESCALE_V),
      scale_input(*g, "Descale_O", DESCALE_O), scale_input(*g, "Descale_dO", DESCALE_DO),
      scale_input(*g, "Descale_S", DESCALE_S), scale_input(*g, "Descale_dP", DESCALE_DP),
      scale_input(*g, "Scale_S", SCALE_S), scale_input(*g, "Scale_dQ", SCALE_DQ),
      scale_input(*g, "Scale_dK", SCALE_DK), scale_input(*g, "Scale_dV", SCALE_DV),
      scale_input(*g, "Scale_dP", SCALE_DP), options);
  output(dq, DQ, bhsd(a->b, a->h, a->s_q, a->d), a->q_stride);
  output(dk, DK, bhsd(a->b, a->h_kv, a->s_kv, a->d), a->k_stride);
  output(dv, DV, bhsd(a->b, a->h_kv, a->s_kv, a->d), a->v_stride);
  for (const tensor *t : {&dq, &dk, &dv})
    (*t)->set_data_type(grad);
  amax_output(amax_dq, AMAX_DQ);
  amax_output(amax_dk, AMAX_DK);
  amax_output(amax_dv, AMAX_DV);
  amax_output(amax_dp, AMAX_DP);
  return g;
}

void fp8_bind(attention_plan &p) {
  p.fwd_pack.bind({DESCALE_Q, DESCALE_K, DESCALE_V, DESCALE_S, SCALE_S, SCALE_O, AMAX_S, AMAX_O});
  if (p.bwd)
    p.bwd_pack.bind({DESCALE_Q, DESCALE_K, DESCALE_V, DESCALE_O, DESCALE_DO, DESCALE_S, DESCALE_DP,
                     SCALE_S, SCALE_DQ, SCALE_DK, SCALE_DV, SCALE_DP, AMAX_DQ, AMAX_DK, AMAX_DV,
                     AMAX_DP});
}

/* The forward reads the live scales; the backward reads those the forward used for what it
 * wrote (q, k, v, O: saved after it) and for S (the forward's choice, as TE keeps it), and the
 * live ones of its own tensors. */
void fp8_set(pack &k, float *state, bool backward) {
  const int saved = backward ? 1 : 0;
  const float *qkv_inv = lutra_attention_scale_inv(state, LUTRA_ATTENTION_FP8_QKV, saved);
  k.set(DESCALE_Q, qkv_inv);
  k.set(DESCALE_K, qkv_inv);
  k.set(DESCALE_V, qkv_inv);
  k.set(DESCALE_S, lutra_attention_scale_inv(state, LUTRA_ATTENTION_FP8_S, saved));
  k.set(SCALE_S, lutra_attention_scale(state, LUTRA_ATTENTION_FP8_S, saved));
  if (!backward) {
    k.set(SCALE_O, lutra_attention_scale(state, LUTRA_ATTENTION_FP8_O, 0));
    k.set(AMAX_S, lutra_attention_amax(state, LUTRA_ATTN_AMAX_S));
    k.set(AMAX_O, lutra_attention_amax(state, LUTRA_ATTN_AMAX_O));
    return;
  }
  k.set(DESCALE_O, lutra_attention_scale_inv(state, LUTRA_ATTENTION_FP8_O, 1));
  k.set(DESCALE_DO, lutra_attention_scale_inv(state, LUTRA_ATTENTION_FP8_DO, 0));
  k.set(DESCALE_DP, lutra_attention_scale_inv(state, LUTRA_ATTENTION_FP8_DP, 0));
  k.set(SCALE_DP, lutra_attention_scale(state, LUTRA_ATTENTION_FP8_DP, 0));
  const float *dqkv = lutra_attention_scale(state, LUTRA_ATTENTION_FP8_DQKV, 0);
  k.set(SCALE_DQ, dqkv);
  k.set(SCALE_DK, dqkv);
  k.set(SCALE_DV, dqkv);
  k.set(AMAX_DQ, lutra_attention_amax(state, LUTRA_ATTN_AMAX_DQ));
  k.set(AMAX_DK, lutra_attention_amax(state, LUTRA_ATTN_AMAX_DK));
  k.set(AMAX_DV, lutra_attention_amax(state, LUTRA_ATTN_AMAX_DV));
  k.set(AMAX_DP, lutra_attention_amax(state, LUTRA_ATTN_AMAX_DP));
}

} // namespace lutra_cudnn
