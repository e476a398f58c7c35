/* What the cuDNN attention shim's two C++ files share (attention_cudnn.cpp: loading cuDNN,
 * handles, plans and calls; attention_cudnn_fp8.cpp: the FP8 graphs): the graphs' tensor uids,
 * the variant pack made once per plan, the plan, and the helpers that lay tensors out. Internal
 * to src/backend/cuda; C++ only. */
#ifndef LUTRA_BACKEND_CUDA_ATTENTION_CUDNN_H
#define LUTRA_BACKEND_CUDA_ATTENTION_CUDNN_H

#include <cublasLt.h> /* before the extern "C" block below, whose header includes it too */
#include <cuda_runtime.h>
#include <cudnn_frontend.h>
#include <initializer_list>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>
/* lutra's headers are C11: the two C11 keywords they use, spelled in C++ while they are read */
#define _Thread_local thread_local
#define _Static_assert static_assert
extern "C" {
#include "backend/cuda/cuda_backend.h"
}
#undef _Thread_local
#undef _Static_assert

namespace lutra_cudnn {

namespace fe = cudnn_frontend;

/* the graphs' tensors; the FP8 graphs' scales and amaxes (attention_cudnn_fp8.cpp) follow */
enum uid : int64_t {
  Q = 1,
  K,
  V,
  O,
  STATS,
  SEED,
  OFFSET,
  DO,
  DQ,
  DK,
  DV,
  DESCALE_Q,
  DESCALE_K,
  DESCALE_V,
  DESCALE_S,
  SCALE_S,
  SCALE_O,
  AMAX_S,
  AMAX_O,
  DESCALE_O,
  DESCALE_DO,
  DESCALE_DP,
  SCALE_DQ,
  SCALE_DK,
  SCALE_DV,
  SCALE_DP,
  AMAX_DQ,
  AMAX_DK,
  AMAX_DV,
  AMAX_DP,
  UIDS
};

/* A variant pack made once: the map execute reads, and where each uid's pointer sits in it (an
 * unordered_map's elements stay where they are as it grows) */
struct pack {
  std::unordered_map<int64_t, void *> map;
  void **slot[UIDS] = {};
  void bind(std::initializer_list<int64_t> uids) {
    for (int64_t u : uids)
      slot[u] = &map[u];
  }
  void set(int64_t u, const void *p) { *slot[u] = const_cast<void *>(p); }
};

struct attention_plan {
  std::shared_ptr<fe::graph::Graph> fwd, bwd;
  pack fwd_pack, bwd_pack;
  /* s_q = s_kv = 1 has a forward but no backward: a backward is refused with cuDNN's reason */
  std::string bwd_error;
  int64_t workspace = 0;
  bool deterministic = false;
  bool dropout = false;
  bool fp8 = false; /* the FP8 graphs (attention_cudnn_fp8.cpp) */
  /* the forward's and the backward's calls replayed as graphs (freed before the graphs, whose
   * execution plans the captures retain) */
  lutra_call_graphs *fwd_calls = nullptr, *bwd_calls = nullptr;
  ~attention_plan() {
    lutra_call_graphs_free(fwd_calls);
    lutra_call_graphs_free(bwd_calls);
  }
};

using tensor = std::shared_ptr<fe::graph::Tensor_attributes>;

/* lutra's strides are (batch, seq, head, dim); cuDNN's dims and strides are (b, h, s, d) */
inline std::vector<int64_t> bhsd(int64_t b, int64_t h, int64_t s, int64_t d) {
  return {b, h, s, d};
}
inline std::vector<int64_t> bhsd_strides(const int64_t st[4]) {
  return {st[0], st[2], st[1], st[3]};
}

inline tensor input(fe::graph::Graph &g, const char *name, int64_t id, std::vector<int64_t> dim,
                    const int64_t st[4]) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(id)
                      .set_dim(std::move(dim))
                      .set_stride(bhsd_strides(st)));
}

inline void output(const tensor &t, int64_t id, std::vector<int64_t> dim, const int64_t st[4]) {
  t->set_output(true).set_uid(id).set_dim(std::move(dim)).set_stride(bhsd_strides(st));
}

/* stats [b, h, s_q] f32 contiguous, cuDNN's [b, h, s_q, 1] */
inline fe::graph::Tensor_attributes &stats_layout(fe::graph::Tensor_attributes &t,
                                                  const lutra_attention_args *a) {
  return t.set_name("Stats")
      .set_uid(STATS)
      .set_dim({a->b, a->h, a->s_q, 1})
      .set_stride({a->h * a->s_q, a->s_q, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT);
}

/* a [1, 1, 1, 1] tensor in device memory: a dropout seed, an FP8 scale */
inline tensor scalar(fe::graph::Graph &g, const char *name, int64_t id, fe::DataType_t type) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(id)
                      .set_dim({1, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(type));
}

/* a graph whose inputs and outputs are io unless they say otherwise, computing in f32 */
inline std::shared_ptr<fe::graph::Graph> graph_of(fe::DataType_t io) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(io)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

/* What forward and backward share: the scale, the causal mask (top-left: query i sees keys
 * 0 .. i), dropout from the device seed and offset */
template <class Attributes>
void common_options(Attributes &o, const lutra_attention_args *a, fe::graph::Graph &g) {
  o.set_attn_scale(a->scale);
  if (a->causal)
    o.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
  if (a->dropout > 0)
    o.set_dropout(a->dropout, scalar(g, "Seed", SEED, fe::DataType_t::INT64),
                  scalar(g, "Offset", OFFSET, fe::DataType_t::INT64));
}

/* ---- FP8 (attention_cudnn_fp8.cpp) --------------------------------------------------------- */

/* what cuDNN's FP8 attention cannot take on this device, refused in lutra's words */
int fp8_check(const lutra_attention_args *a, const char *fn);
std::shared_ptr<fe::graph::Graph> fp8_forward_graph(const lutra_attention_args *a);
std::shared_ptr<fe::graph::Graph> fp8_backward_graph(const lutra_attention_args *a);
/* the scale and amax uids in the plan's packs (once), and their pointers into fp8_state (per
 * call: the module's state may move when it is rebuilt for another recipe) */
void fp8_bind(attention_plan &p);
void fp8_set(pack &k, float *state, bool backward);

} // namespace lutra_cudnn

#endif
