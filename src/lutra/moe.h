/* lutra/moe.h: mixture-of-experts routing around GroupedLinear (TransformerEngine's fused
 * top-k router, moe_permute and moe_unpermute), all on the backend's device: nothing is read
 * back by the host, buffers keep their size while the shapes stay, so a router + permute +
 * experts + unpermute step is captured as one CUDA graph and replayed with new routing.
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_MOE_H
#define LUTRA_MOE_H

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the fused softmax + top-k router ---------------------------------------------------
 * forward(logits [tokens, experts] f32/bf16/f16; more dims: tokens are the leading ones) ->
 * probs [tokens, k] f32 and indices [tokens, k] i32: per token the k largest logits, best first (ties to the lower expert index;
 * NaN counts as -inf), and their softmax probabilities, computed in double and rounded once:
 *   renormalize (default)  softmax over the k selected logits (TE's use_pre_softmax = False)
 *   otherwise              the full softmax over all experts at the k selected
 *                          (use_pre_softmax = True; the k probabilities sum to <= 1)
 * both times scaling_factor. backward(dprobs [tokens, k] f32) -> dlogits (logits' shape and
 * dtype) for the logits of the last forward, which the router holds until the next one. */
typedef struct lutra_moe_router lutra_moe_router;
typedef struct lutra_moe_router_desc {
  int32_t experts;      /* 1..LUTRA_MOE_MAX_EXPERTS */
  int32_t k;            /* 1..8, <= experts */
  int32_t renormalize;  /* default 1 */
  float scaling_factor; /* default 1; finite and > 0 */
  int32_t device;       /* LUTRA_CPU (default) */
} lutra_moe_router_desc;
enum { LUTRA_MOE_MAX_EXPERTS = 4096 };

LUTRA_API void lutra_moe_router_defaults(lutra_moe_router_desc *d);
LUTRA_API int lutra_moe_router_new(const lutra_moe_router_desc *d, lutra_moe_router **out);
LUTRA_API int lutra_moe_router_unref(lutra_moe_router *r);
LUTRA_API int lutra_moe_router_destroy(lutra_moe_router *r);
LUTRA_API int lutra_moe_router_forward(lutra_moe_router *r, const lutra_tensor *logits,
                                       lutra_tensor **probs, lutra_tensor **indices);
LUTRA_API int lutra_moe_router_backward(lutra_moe_router *r, const lutra_tensor *dprobs,
                                        lutra_tensor **dlogits);

/* ---- permute / unpermute (a dispatcher: the row map of the last permute is shared) -------
 * permute(x [tokens, hidden], or [.., hidden] with tokens the leading dims, indices [tokens, k]
 * i32) -> permuted [tokens * k, hidden] (x's dtype) and m_splits [experts] i32 on x's device (GroupedLinear's splits, never read by the
 * host): token t's i-th choice (slot s = t k + i) goes to row row_map[s] = the start of its
 * expert's rows + the number of earlier slots (in s order) routed to the same expert, so each
 * expert's rows are contiguous and in token order (a stable counting sort; deterministic).
 * unpermute(expert_out [tokens * k, out], probs [tokens, k]) -> y [tokens, out] (in the leading
 * dims of the last permute's x, as dx of permute_backward and dy of unpermute_backward):
 * y[t] = sum_{i = 0..k-1} probs[t, i] * expert_out[row_map[t k + i]], in f32 in that order,
 * rounded once into expert_out's dtype (deterministic: the same bits on every backend).
 * permute_backward(dpermuted) -> dx [tokens, hidden] = sum_i dpermuted[row_map[t k + i]].
 * unpermute_backward(dy [tokens, out]) -> dexpert_out [tokens * k, out] = probs * dy at each
 * slot's row, and dprobs [tokens, k] (probs' dtype) = dy[t] . expert_out[row_map[s]] (exact
 * products summed in double), for the expert_out and probs of the last unpermute, which the
 * dispatcher holds until the next one.
 * Indices outside [0, experts): the CPU refuses them at permute. On a device the check would
 * cost a host synchronization per step, so the kernels set a device flag instead (the slot
 * goes nowhere: it is counted in no split, its rows are skipped and its dprobs is 0), which
 * lutra_moe_dispatch_check reads (and clears), returning LUTRA_EINVAL when it was set. */
typedef struct lutra_moe_dispatch lutra_moe_dispatch;
LUTRA_API int lutra_moe_dispatch_new(int experts, int device, lutra_moe_dispatch **out);
LUTRA_API int lutra_moe_dispatch_unref(lutra_moe_dispatch *d);
LUTRA_API int lutra_moe_dispatch_destroy(lutra_moe_dispatch *d);
LUTRA_API int lutra_moe_permute(lutra_moe_dispatch *d, const lutra_tensor *x,
                                const lutra_tensor *indices, lutra_tensor **permuted,
                                lutra_tensor **m_splits);
LUTRA_API int lutra_moe_permute_backward(lutra_moe_dispatch *d, const lutra_tensor *dpermuted,
                                         lutra_tensor **dx);
LUTRA_API int lutra_moe_unpermute(lutra_moe_dispatch *d, const lutra_tensor *expert_out,
                                  const lutra_tensor *probs, lutra_tensor **y);
LUTRA_API int lutra_moe_unpermute_backward(lutra_moe_dispatch *d, const lutra_tensor *dy,
                                           lutra_tensor **dexpert_out, lutra_tensor **dprobs);
/* the row map of the last permute: i32 [tokens, k] (-1: a slot with a bad index, device only) */
LUTRA_API int lutra_moe_row_map(const lutra_moe_dispatch *d, lutra_tensor **row_map);
/* host read of the device's bad-index flag (a synchronization); LUTRA_OK on the CPU */
LUTRA_API int lutra_moe_dispatch_check(lutra_moe_dispatch *d);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_MOE_H */
