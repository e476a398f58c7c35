/* The backend interface: everything that touches tensor memory goes through one of these
 * tables, so recipes, quantizers and modules never know which device runs them.
 *
 * Rules for implementations
 * - Pointers to tensor data, scales and amaxes are backend memory (device memory on CUDA).
 * - Every function returns LUTRA_OK or a status after setting the error with lutra_error();
 *   none exits, aborts or leaves a partially written output visible to the caller except the
 *   output buffers named in the arguments.
 * - The CPU backend is the reference: bit-exact FP8 emulation through lutra_encode/decode.
 * The entries' argument structs are in backend/args_*.h, one header per family. */
#ifndef LUTRA_BACKEND_H
#define LUTRA_BACKEND_H

#include "backend/args_activation.h"
#include "backend/args_attention.h"
#include "backend/args_embedding.h"
#include "backend/args_gemm.h"
#include "backend/args_grouped.h"
#include "backend/args_loss.h"
#include "backend/args_moe.h"
#include "backend/args_norm.h"
#include "backend/args_optim.h"
#include "backend/args_quantize.h"
#include "backend/args_rope.h"

typedef struct lutra_backend {
  const char *name;
  int32_t device;

  int (*alloc)(size_t bytes, void **out); /* 256-byte aligned */
  void (*free)(void *p);
  int (*from_host)(void *dst, const void *src, size_t bytes);
  int (*to_host)(void *dst, const void *src, size_t bytes);
  int (*copy)(void *dst, const void *src, size_t bytes);
  int (*memset)(void *dst, int value, size_t bytes);

  /* element-wise conversion between F32, BF16, F16 (RNE) */
  int (*convert)(const void *src, int src_dtype, void *dst, int dst_dtype, int64_t n);
  int (*fill)(void *dst, int dtype, int64_t n, float value);
  /* *amax = max(*amax, max|x|); NaNs are ignored as fmaxf does */
  int (*amax)(const void *x, int dtype, int64_t n, float *amax);
  /* current scaling's amax and scale in one call (lutra_current_scale_args) */
  int (*current_scale)(const lutra_current_scale_args *a);
  int (*cast)(const lutra_quant_args *a);           /* per-tensor scaling */
  int (*quantize_mxfp8)(const lutra_quant_args *a); /* 1x32 E8M0 blocks */
  int (*quantize_block)(const lutra_quant_args *a); /* 1x128 or 128x128 f32 blocks */
  int (*dequantize)(const lutra_dequant_args *a);
  /* roll the amax histories and update scale/scale_inv of all n metas in one call */
  int (*delayed_update)(lutra_scale_meta *const *metas, int n);

  int (*gemm_plan)(lutra_gemm_plan *p); /* fills workspace_bytes and backend_plan from p->key */
  void (*gemm_plan_free)(lutra_gemm_plan *p);
  int (*gemm)(const lutra_gemm_args *g);
  /* The GEMM workspace of the calling thread's stream, grown to bytes (0: as it is). NULL: the
   * GEMM front keeps one per thread (a thread is the CPU analogue of a stream). A backend with
   * streams keeps one per stream: a workspace used on two streams is written by two GEMMs (or
   * dequantizations into it) at once. */
  int (*gemm_workspace)(size_t bytes, void **ptr, size_t *have);

  int (*activation_forward)(const lutra_act_args *a);
  int (*activation_backward)(const lutra_act_args *a);
  int (*bias_grad)(const lutra_bias_grad_args *a);
  int (*mse)(const lutra_loss_args *a);
  int (*softmax_xent)(const lutra_loss_args *a);
  int (*sgd_step)(const lutra_optim_args *a);
  int (*adamw_step)(const lutra_optim_args *a);
  /* norms (lutra_norm_args) */
  int (*layernorm_forward)(const lutra_norm_args *a);
  int (*layernorm_backward)(const lutra_norm_args *a);
  /* MoE routing (lutra_topk_args, lutra_permute_args) */
  int (*moe_topk_forward)(const lutra_topk_args *a);
  int (*moe_topk_backward)(const lutra_topk_args *a);
  int (*moe_permute)(const lutra_permute_args *a);
  int (*moe_permute_backward)(const lutra_permute_args *a);
  int (*moe_unpermute)(const lutra_permute_args *a);
  int (*moe_unpermute_backward)(const lutra_permute_args *a);
  /* waits for the device's queued work (NULL: nothing is ever queued) */
  int (*synchronize)(void);

  /* CUDA graphs (NULL where the backend has none): capture the work this thread issues on the
   * backend's stream, instantiate it (*nodes: the graph's node count), launch, destroy. */
  int (*capture_begin)(void);
  int (*capture_end)(void **exec, int64_t *nodes);
  void (*capture_abort)(void);
  int (*graph_launch)(void *exec);
  void (*graph_destroy)(void *exec);
  /* the norm writing its output FP8 (lutra_norm_quant_args); NULL where the backend has none */
  int (*norm_quantize)(const lutra_norm_quant_args *a);
  /* out[i] = a[i] + b[i] over n elements of dtype (F32/BF16/F16), the sum in f32 rounded once;
   * out may be a or b (a residual connection's forward and backward) */
  int (*add)(const void *a, const void *b, void *out, int dtype, int64_t n);
  /* ---- tensor operations (lutra/tensor_ops.h; the front checked every argument) ----
   * axpby: out[i] = alpha * x[i] + beta * y[i] over n elements of dtype (F32/BF16/F16), f32 math
   * (each product rounded to f32, never contracted into an FMA) rounded once into dtype; y NULL:
   * alpha * x[i]; out may be x or y. copy_2d: height rows of width bytes, src rows spitch bytes
   * apart, dst rows dpitch apart. The rows_* entries read x as [rows, cols] of dtype: argmax and
   * sample write one i32 id per row, softmax writes out of out_dtype (lutra/tensor_ops.h says
   * what each computes; the sample's uniform draw for row r is lutra_sample_uniform(seed, r)). */
  int (*axpby)(const void *x, float alpha, const void *y, float beta, void *out, int dtype,
               int64_t n);
  int (*copy_2d)(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                 int64_t height);
  int (*rows_argmax)(const void *x, int dtype, int64_t rows, int64_t cols, int32_t *ids);
  int (*rows_softmax)(const void *x, int dtype, int64_t rows, int64_t cols, float temperature,
                      void *out, int out_dtype);
  int (*rows_sample)(const void *x, int dtype, int64_t rows, int64_t cols, float temperature,
                     int top_k, uint64_t seed, int32_t *ids);

  /* grouped operations (NULL where the backend has none: GroupedLinear refuses then) */
  int (*grouped_quantize)(const lutra_grouped_quant_args *a);
  int (*grouped_gemm)(const lutra_grouped_gemm_args *g);
  /* frees what grouped_gemm cached in a module's call_graphs slot (NULL: nothing is cached) */
  void (*call_graphs_free)(void *graphs);

  /* Current scaling of a cast with an activation inside (lutra_current_scale_act_args): the
   * amax pass and the cast then each read the activation's input instead of a stored output.
   * NULL where a backend has none. */
  int (*current_scale_act)(const lutra_current_scale_act_args *a);
  /* External scaling rules (fp8/rules.c). rules_gather copies every meta's scale and history
   * to host memory in one transfer, host[off_j] = *scale, host[off_j + 1 ..] = the history
   * before the roll (off_j: the sum of 1 + history_len over the metas before j), then rolls the
   * histories as delayed_update does (new[i] = h[i + 1], new[len - 1] = h[0], then h[0] = 0).
   * rules_apply writes scale = scales[j] and scale_inv = 1 / scales[j] (scales: host memory). */
  int (*rules_gather)(lutra_scale_meta *const *metas, int n, float *host);
  int (*rules_apply)(lutra_scale_meta *const *metas, int n, const float *scales);
  /* rowwise scaling (lutra/formats.h): one f32 scale_inv per row of each copy (NULL: none) */
  int (*quantize_rowwise)(const lutra_quant_args *a);
  /* NVFP4 (lutra/nvfp4.h): E2M1 codes, E4M3 block scales and the per-copy f32 decode scale;
   * dequantize takes LUTRA_SCALING_NVFP4 */
  int (*quantize_nvfp4)(const lutra_quant_args *a);
  /* A small host-to-device copy in stream order that does not wait for the device: src is
   * staged (in pinned memory) before this returns and may be reused at once. GroupedLinear's
   * host splits. NULL where from_host does not wait anyway (the CPU). */
  int (*from_host_async)(void *dst, const void *src, size_t bytes);
  /* embedding lookup and its deterministic weight gradient (lutra_embedding_args);
   * embedding_scratch: the backward's scratch bytes for n ids below vocab (NULL: none needed) */
  int (*embedding_forward)(const lutra_embedding_args *a);
  int (*embedding_backward)(const lutra_embedding_args *a);
  int (*embedding_scratch)(int64_t n, int64_t vocab, size_t *bytes);
  /* rotary position embedding (lutra_rope_args): forward, or inverse (the backward) by its flag;
   * in place or out of place. NULL where a backend has none (nn.RotaryEmbedding refuses). */
  int (*rope)(const lutra_rope_args *a);
  /* scaled dot-product attention (lutra_attention_args). attention_plan builds what a shape
   * needs once (cuDNN: the forward and backward graphs, their plans and workspace size) and
   * says whether its backward is deterministic; a module caches plans per shape and frees them
   * with attention_plan_free. forward and backward then build nothing. NULL where a backend has
   * no attention (the module refuses). */
  int (*attention_plan)(const lutra_attention_args *a, void **plan, size_t *workspace_bytes,
                        int *deterministic);
  void (*attention_plan_free)(void *plan);
  int (*attention_forward)(const lutra_attention_args *a);
  int (*attention_backward)(const lutra_attention_args *a);
  /* the calling thread's current stream, as a key for buffers kept per stream (the attention
   * workspace, nn/attention_workspace.h); NULL where a backend has no streams (a thread is one) */
  const void *(*stream)(void);
} lutra_backend;

#endif
