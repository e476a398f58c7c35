/* lutra/attention.h: nn.DotProductAttention, scaled dot-product attention
 * softmax(q k^T * softmax_scale [+ causal mask]) v (TransformerEngine's DotProductAttention,
 * torch's F.scaled_dot_product_attention). No parameters. Two ways to call it:
 *   - lutra_attention_forward(m, q, k, v): q [B, T, H, D], k and v [B, T_kv, Hkv, D] (sbhd:
 *     [T, B, ...]) -> out [B, T, H, D]; lutra_attention_backward(m, dout) -> dq, dk, dv.
 *   - the module protocol (lutra_module_forward / _backward, so it sits in a Sequential after a
 *     fused QKV projection): x packed [B, T, (H + 2 Hkv) D] (sbhd: [T, B, ...]), its last dim
 *     laid out [q heads | k heads | v heads], read in place through strides (no copy) -> out
 *     [B, T, H D]; backward(dy [B, T, H D]) -> dx packed as x (dq, dk, dv written in place into
 *     one buffer). A backward takes the kind of the last forward; the other kind is refused.
 * Outputs and gradients are owned by the module and kept per shape. GQA: query head j reads
 * key/value head j / (H / Hkv); causal: query i sees keys 0 .. i, and needs T == T_kv.
 * Dropout drops attention weights with probability p in forwards with grad (an inference
 * forward, lutra_forward_args.grad = 0, runs without it, as torch's eval mode does), the kept
 * ones scaled by 1 / (1 - p); each such forward draws a fresh mask from (seed, offset), the
 * offset advancing by LUTRA_ATTENTION_OFFSET_STEP (TransformerEngine's Philox increment for
 * cuDNN's attention, BACKEND_F16arb_ELTS_PER_THREADS); the backward redraws the forward's. The
 * CPU's mask is its own counter-based hash (src/backend/cpu/attention_cpu.c); cuDNN's differs.
 * Checkpoints carry the generator of a module with dropout (<m>.rng_state, lutra/checkpoint.h).
 * On cuda the offset lives in device memory and advances there before each forward, so a
 * captured step replayed K times draws the masks of K eager steps (a capture right after the
 * state was set on the host is refused: run a step eagerly first).
 * FP8 (desc.fp8 = 1, opt-in per module; TransformerEngine's fp8_dpa with delayed scaling): a
 * forward inside an enabled autocast scope whose recipe scales its input and grad_output roles
 * by delayed scaling (per tensor) runs in FP8, as TE does it on Hopper: q, k and v are cast to
 * the input role's format (E4M3) with one QKV scale, cuDNN's sdpa_fp8 quantizes the softmax
 * probabilities S with their own scale before S V and writes O in E4M3 (on Hopper cuDNN writes
 * no BF16 output from FP8 attention), which is dequantized into the module's output; the
 * backward casts dout to the grad_output format (E5M2 under HYBRID) and cuDNN's
 * sdpa_fp8_backward writes dq, dk, dv in that format (with dP = dS quantized on the way),
 * dequantized into the module's gradients. Six delayed-scaling metas (QKV, S, O forward; dO, dP,
 * dQKV backward; LUTRA_ATTENTION_FP8_*) with the recipe's margin, history and algorithm join the
 * scope's one update, as a Linear's quantizers do; the amaxes cuDNN writes are max-accumulated
 * into them. S's scale follows its history too (TE's choice): a step whose largest probability
 * exceeds what the history saw is clipped to it (a causal mask's row 0 weighs 1 every step).
 * Outside such a scope (or calibrating) an fp8 module runs its dtype's path. Refused at
 * lutra_attention_new: head_dim other than 128 (what cuDNN's FP8 backward takes on Hopper),
 * dropout (not yet); at a forward: a scope whose recipe is not delayed scaling; on CUDA, a device
 * below sm_90 or a cuDNN that cannot. The CPU backend emulates it (the reference: codes
 * decoded, f64 sums, S, O, dP and the gradients rounded where cudnn-frontend's reference graphs
 * round them). Checkpoints carry the FP8 state (<m>.fp8.qkv.scale, ...; lutra/checkpoint.h).
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_ATTENTION_H
#define LUTRA_ATTENTION_H

#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { LUTRA_QKV_BSHD = 0, LUTRA_QKV_SBHD = 1 };
enum { LUTRA_ATTENTION_OFFSET_STEP = 16 };

typedef struct lutra_attention_desc {
  int64_t num_heads, head_dim;
  int64_t num_gqa_groups; /* key/value heads; default (0) = num_heads; must divide num_heads */
  int32_t causal;         /* 1: "causal" (default), 0: "no_mask" */
  int32_t qkv_format;     /* LUTRA_QKV_BSHD (default) or LUTRA_QKV_SBHD */
  float softmax_scale;    /* default 0: 1 / sqrt(head_dim) */
  float dropout;          /* 0 (default) .. 1 (exclusive) */
  int32_t dtype;          /* F32 (the CPU only; default), BF16, F16 */
  int32_t device;         /* LUTRA_CPU (default) */
  uint64_t seed;          /* dropout's; default: the next seed of the global generator */
  int32_t fp8;            /* 1: FP8 inside a delayed-scaling autocast scope (above); default 0 */
  int32_t reserved;       /* 0 */
} lutra_attention_desc;

/* How a module's last forward ran (lutra_attention_info). */
enum { LUTRA_ATTENTION_NONE = 0, LUTRA_ATTENTION_QKV = 1, LUTRA_ATTENTION_PACKED = 2 };

LUTRA_API void lutra_attention_defaults(lutra_attention_desc *d);
LUTRA_API int lutra_attention_new(const lutra_attention_desc *d, lutra_module **out);
/* q [B,T,H,D], k and v [B,T,Hkv,D] (sbhd: [T,B,...]); out owned by the module, [B,T,H,D] */
LUTRA_API int lutra_attention_forward(lutra_module *m, const lutra_tensor *q, const lutra_tensor *k,
                                      const lutra_tensor *v, lutra_tensor **out);
/* the same with lutra_forward_args (grad = 0: an inference forward, no dropout, no backward) */
LUTRA_API int lutra_attention_forward_ex(lutra_module *m, const lutra_tensor *q,
                                         const lutra_tensor *k, const lutra_tensor *v,
                                         const lutra_forward_args *a, lutra_tensor **out);
/* dq, dk, dv owned by the module; any may be passed NULL if unwanted */
LUTRA_API int lutra_attention_backward(lutra_module *m, const lutra_tensor *dout, lutra_tensor **dq,
                                       lutra_tensor **dk, lutra_tensor **dv);
/* The desc the module was made with (its defaults filled in; seed: the dropout's current) and,
 * if last_forward is not NULL, how its last forward ran (LUTRA_ATTENTION_*; NONE after an
 * inference forward, which keeps nothing for a backward). Either pointer may be NULL. */
LUTRA_API int lutra_attention_info(const lutra_module *m, lutra_attention_desc *d,
                                   int32_t *last_forward);
/* The dropout generator's state: the seed and the offset the next forward draws its mask from
 * (on cuda read back from the device: a synchronization, refused inside a capture). Setting it
 * makes the next forward draw a chosen mask (a resumed run, a gradient check). */
LUTRA_API int lutra_attention_rng_state(const lutra_module *m, uint64_t *seed, uint64_t *offset);
LUTRA_API int lutra_attention_set_rng_state(lutra_module *m, uint64_t seed, uint64_t offset);
/* The plans the module has built and keeps (at most LUTRA_ATTENTION_PLANS, the least recently
 * used evicted), and whether the last forward's backward is deterministic on its backend. */
enum { LUTRA_ATTENTION_PLANS = 4 };
LUTRA_API int lutra_attention_plans(const lutra_module *m, int *count, int *deterministic);
/* FP8 attention's delayed-scaling metas, in this order */
enum {
  LUTRA_ATTENTION_FP8_QKV = 0, /* q, k, v (one scale, as TE's) */
  LUTRA_ATTENTION_FP8_S = 1,   /* the softmax probabilities before S V */
  LUTRA_ATTENTION_FP8_O = 2,
  LUTRA_ATTENTION_FP8_DO = 3,
  LUTRA_ATTENTION_FP8_DP = 4, /* dS = P (dP - D) before dS K and dS^T Q */
  LUTRA_ATTENTION_FP8_DQKV = 5,
  LUTRA_ATTENTION_FP8_TENSORS = 6
};
/* The FP8 state, copied to the host: scales[LUTRA_ATTENTION_FP8_TENSORS] and the amax
 * histories [LUTRA_ATTENTION_FP8_TENSORS][*history_len] (most recent update last; [0] collects
 * the current step's), each may be NULL; *history_len 0 before the first FP8 forward built them;
 * *last_fp8: whether the last forward ran in FP8 (any may be NULL). */
LUTRA_API int lutra_attention_fp8_state(const lutra_module *m, float *scales, float *history,
                                        int *history_len, int *last_fp8);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_ATTENTION_H */
