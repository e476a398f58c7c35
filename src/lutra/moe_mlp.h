/* lutra/moe_mlp.h: the mixture-of-experts feed-forward (Megatron's MoELayer on TE's
 * GroupedLinear experts, TransformerLayer's MLP when it is given experts), one module:
 *   x [.., hidden] (tokens: the product of the leading dims)
 *   -> norm (LayerNorm or RMSNorm)                                  xn
 *   -> router Linear (hidden -> experts, no bias) -> fused top-k     probs, indices [tokens, k]
 *   -> permute xn into expert-contiguous rows                        m_splits on the device
 *   -> GroupedLinear fc1 (hidden -> ffn_hidden; 2 ffn_hidden for the gated activations, whose
 *      module halves it) -> activation -> GroupedLinear fc2 (ffn_hidden -> hidden)
 *   -> unpermute (each token's k rows weighted by its probabilities)  y in x's shape
 * backward(dy) -> dx: the experts' gradient through permute's backward plus the router's path
 * (unpermute's dprobs -> top-k backward -> router Linear's dgrad), summed into the norm's
 * output gradient, then the norm's backward: what examples/train_moe.lua composes by hand, in
 * the same operations. Nothing is read back by the host and buffers keep their addresses while
 * the shapes stay, so a step with the module is captured as one CUDA graph.
 * Precision: inside an enabled autocast scope the experts compute in the recipe's FP8 (as a
 * GroupedLinear does); the router Linear always stays in the module's dtype (the module runs it
 * under a disabled scope of its own), as TE/Megatron keep the router in high precision: FP8
 * logits would flip the top-k. The norm and the top-k are never FP8.
 * No load-balancing loss: Megatron adds an auxiliary loss in its router (switch-style: experts
 * times the sum over experts of the fraction of tokens routed to each times its mean
 * probability, scaled by moe_aux_loss_coeff) and TE leaves it to the framework; here the
 * routing of the last forward is readable (lutra_moe_mlp_routing) to watch the experts' load,
 * but no gradient of a loss on it reaches the router (that would be the loss's entry point).
 * Parameters, in order (checkpoint names in brackets): the norm's [norm.weight, norm.bias (not
 * for RMSNorm)], the router's [router.weight], then fc1's and fc2's GroupedLinear parameters
 * [fc1.weight0, fc1.bias0, fc1.weight1, ..., fc2.weight0, ...] (biases when bias is set), and
 * the experts' FP8 state [fc1.fp8.input0.scale, ...]; the router (a child of kind moe_router)
 * has none.
 * Weights: the router's from seed, fc1's expert e from seed + 1 + e, fc2's from
 * seed + 1 + experts + e (Linear's uniform(-1/sqrt(in), 1/sqrt(in))).
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_MOE_MLP_H
#define LUTRA_MOE_MLP_H

#include "fused.h"
#include "moe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lutra_moe_mlp_desc {
  int64_t hidden;
  int64_t ffn_hidden;    /* each expert's inner width (after a gated activation) */
  int32_t experts;       /* 1..LUTRA_MOE_MAX_EXPERTS */
  int32_t top_k;         /* experts per token: 1..8 and <= experts */
  int32_t normalization; /* LUTRA_NORM_LAYERNORM (default) or LUTRA_NORM_RMSNORM */
  int32_t activation;    /* LUTRA_ACTIVATION_* (default GELU_TANH) */
  int32_t bias;          /* the experts' biases, default 1 (the router has none) */
  int32_t zero_centered_gamma;
  float eps;            /* the norm's; default 1e-5 */
  int32_t renormalize;  /* the top-k's (lutra_moe_router_desc); default 1 */
  float scaling_factor; /* the top-k's; default 1 */
  int32_t dtype;  /* F32 (default; the CPU only: the grouped GEMMs have no f32 kernels) or BF16 */
  int32_t device; /* LUTRA_CPU (default) */
  int32_t accumulate_main_grad;
  uint64_t seed; /* default: the next seed of the global generator */
} lutra_moe_mlp_desc;

LUTRA_API void lutra_moe_mlp_defaults(lutra_moe_mlp_desc *d);
LUTRA_API int lutra_moe_mlp_new(const lutra_moe_mlp_desc *d, lutra_module **out);
/* The desc the module was made with (its defaults resolved): for printing and for specs. */
LUTRA_API int lutra_moe_mlp_desc_of(const lutra_module *m, lutra_moe_mlp_desc *out);
/* The routing of the last forward, owned by the module (valid until its next forward): probs
 * [tokens, k] f32 and indices [tokens, k] i32 (lutra_moe_router_forward's), and m_splits
 * [experts] i32 on the module's device (the rows each expert got). Refused before a forward. */
LUTRA_API int lutra_moe_mlp_routing(const lutra_module *m, lutra_tensor **probs,
                                    lutra_tensor **indices, lutra_tensor **m_splits);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_MOE_MLP_H */
