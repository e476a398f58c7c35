/* lutra/transformer.h: MultiheadAttention and TransformerLayer (TransformerEngine's, options
 * named after TE's where they mean the same), built from lutra's modules:
 *   MultiheadAttention  [LayerNorm/RMSNorm +] fused QKV Linear -> [RoPE on q and k, in place:
 *                       lutra_rope_apply_qkv, one launch, no copy; its inverse on dqkv]
 *                       -> DotProductAttention (q, k, v read in place from the QKV output)
 *                       -> output projection Linear
 *   TransformerLayer    x + MultiheadAttention(x), then h + LayerNormMLP(h) (pre-norm), or
 *                       h + the MoE feed-forward (lutra/moe_mlp.h) when given experts
 * Both are modules (lutra_module_* entries): forward(x {B, T, hidden}, or {T, B, hidden} with
 * qkv_format SBHD) returns the same shape, backward(dy) returns dx. Inside an autocast scope the
 * Linears compute in the recipe's FP8; the attention stays in the module's dtype.
 * Parameters, in order (checkpoint names in brackets):
 *   MultiheadAttention  the QKV LayerNormLinear's [layernorm_qkv.norm.weight, .norm.bias,
 *                       .weight, .bias] (a plain Linear [qkv.weight, qkv.bias] without
 *                       input_layernorm), then [proj.weight, proj.bias]
 *   TransformerLayer    self_attention.*, then the LayerNormMLP's [layernorm_mlp.*] (the MoE
 *                       feed-forward's [moe_mlp.norm.weight, ..., moe_mlp.router.weight,
 *                       moe_mlp.fc1.weight0, ...])
 * The QKV projection's output is [q heads | k heads | v heads] along its last dim,
 * (num_heads + 2 num_gqa_groups) head_dim features. Weights: uniform(-1/sqrt(in), 1/sqrt(in))
 * as Linear's, from seed, seed + 1, ... in the order above (the feed-forward's from seed + 3).
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_TRANSFORMER_H
#define LUTRA_TRANSFORMER_H

#include "attention.h"
#include "fused.h"
#include "moe_mlp.h"
#include "rope.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lutra_mha_desc {
  int64_t hidden;
  int64_t num_heads;
  int64_t num_gqa_groups;      /* key/value heads; 0 (default): num_heads */
  int64_t head_dim;            /* TE's kv_channels; 0 (default): hidden / num_heads */
  int32_t input_layernorm;     /* the norm before the QKV projection; default 1 */
  int32_t normalization;       /* LUTRA_NORM_LAYERNORM (default) or LUTRA_NORM_RMSNORM */
  int32_t zero_centered_gamma; /* default 0 */
  int32_t bias;                /* the QKV and output projections' biases; default 1 */
  int32_t causal;              /* TE's attn_mask_type "causal" (default 1) or "no_mask" (0) */
  int32_t qkv_format;          /* LUTRA_QKV_BSHD (default) or LUTRA_QKV_SBHD */
  int32_t rope;                /* rotary position embedding on q and k; default 0 */
  float rope_base;             /* default 10000 */
  int64_t rope_max_seq;        /* the longest sequence RoPE takes; 0 (default): 4096 */
  float eps;                   /* the norm's; default 1e-5 */
  float softmax_scale;         /* default 0: 1 / sqrt(head_dim) */
  float attention_dropout;     /* default 0 */
  int32_t dtype;               /* F32 (default; the CPU only), BF16 */
  int32_t device;              /* LUTRA_CPU (default) */
  int32_t accumulate_main_grad;
  int32_t fp8_attention; /* the DotProductAttention's fp8 (lutra/attention.h: FP8 inside a
                          * delayed-scaling autocast scope, head_dim 128); default 0 */
  uint64_t seed;         /* default: the next seed of the global generator */
} lutra_mha_desc;

LUTRA_API void lutra_mha_defaults(lutra_mha_desc *d);
LUTRA_API int lutra_mha_new(const lutra_mha_desc *d, lutra_module **out);

typedef struct lutra_transformer_desc {
  lutra_mha_desc attention; /* hidden, heads, norm, bias, dtype, device, seed: the layer's */
  int64_t ffn_hidden;
  int32_t activation; /* LUTRA_ACTIVATION_* (default GELU_TANH) */
  int32_t pad;
  /* the feed-forward: 0 experts (default) a LayerNormMLP; experts >= 1 the MoE feed-forward
   * (lutra/moe_mlp.h) of that many experts, each token routed to moe_top_k of them, with the
   * layer's norm, activation, bias (the experts'), dtype and device, ffn_hidden per expert */
  int32_t moe_experts;
  int32_t moe_top_k;
} lutra_transformer_desc;

LUTRA_API void lutra_transformer_defaults(lutra_transformer_desc *d);
LUTRA_API int lutra_transformer_new(const lutra_transformer_desc *d, lutra_module **out);

/* A MultiheadAttention's or TransformerLayer's part, with a reference of its own (drop it with
 * lutra_module_unref):
 * LUTRA_PART_QKV the QKV projection, _ATTENTION the DotProductAttention, _PROJ the output
 * projection, _MLP the TransformerLayer's LayerNormMLP or MoE feed-forward (NULL in a
 * MultiheadAttention). */
enum { LUTRA_PART_QKV = 0, LUTRA_PART_ATTENTION = 1, LUTRA_PART_PROJ = 2, LUTRA_PART_MLP = 3 };
LUTRA_API int lutra_transformer_part(const lutra_module *m, int part, lutra_module **out);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_TRANSFORMER_H */
