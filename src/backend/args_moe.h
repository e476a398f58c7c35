/* The backend's MoE routing arguments (backend/backend.h's moe_* entries). */
#ifndef LUTRA_BACKEND_ARGS_MOE_H
#define LUTRA_BACKEND_ARGS_MOE_H

#include "backend/args_common.h"

LUTRA_ARGS_NO_PADDING_BEGIN
/* ---- MoE routing (src/backend/cpu/moe_cpu.c, kernels/moe.cu) ----------------------------
 * Top-k of a softmax router (TransformerEngine's fused_topk_with_score_function, score function
 * softmax). Per token t of logits [tokens, experts]: the k experts with the largest logits, in
 * order (value descending, ties to the lower expert index; a NaN logit counts as -inf both in
 * the selection and in the softmax), then with mx the top logit and e_j = exp((double)(l_j - mx))
 * (the difference in f32):
 *   renormalize   probs[t, i] = e_i / sum_{selected} e * scaling_factor   (softmax over the k)
 *   otherwise     probs[t, i] = e_i / sum_{all experts} e * scaling_factor (TE's pre-softmax)
 * summed in double in index order, rounded once into f32. The backward recomputes the softmax
 * from the logits and the indices of that forward and writes every element of dlogits (zeros
 * where the gradient is zero), in double, rounded once into the logits' dtype. */
enum { LUTRA_MOE_MAX_K = 8, LUTRA_MOE_CHUNK = 1024 };
typedef struct lutra_topk_args {
  const void *logits; /* [tokens, experts], dtype */
  int32_t dtype;
  int32_t k; /* 1..LUTRA_MOE_MAX_K, <= experts */
  int64_t tokens, experts;
  int32_t renormalize;
  float scaling_factor;
  float *probs;        /* [tokens, k] f32: forward output */
  int32_t *indices;    /* [tokens, k]: forward output, backward input */
  const float *dprobs; /* backward: [tokens, k] f32 */
  void *dlogits;       /* backward: [tokens, experts], dtype */
} lutra_topk_args;

/* Token permutation into expert-contiguous order and back (TransformerEngine's moe_permute /
 * moe_unpermute). Slot s = t * k + i is token t's i-th choice, indices[s] its expert.
 *   permute            row_map[s] = offset[e] + #{s' < s : indices[s'] = e}, e = indices[s]
 *                      (a stable counting sort: within an expert, slots in token order),
 *                      m_splits[e] = #{s : indices[s] = e}, offset the exclusive prefix sum of
 *                      m_splits; then out[row_map[s]] = x[t] (bit copies; x NULL: the map only)
 *   permute_backward   out[t] = sum_i x[row_map[t k + i]] (x: the gradient of the permuted rows)
 *   unpermute          out[t] = sum_i probs[t, i] * x[row_map[t k + i]] (x: the experts' output)
 *   unpermute_backward out[row_map[s]] = probs[s] * dy[t]; dprobs[s] = sum_h dy[t, h] x[row_map[s],
 * h] The combines are f32, in the order i = 0..k-1, rounded once (deterministic, the same bits on
 * every backend); dprobs sums exact products in double, rounded once. rows: tokens * k.
 * An index outside [0, experts): the CPU refuses it (nothing written); a device kernel cannot
 * return an error, so it sets *bad_index = 1 (backend memory, never cleared by the backend),
 * counts the slot nowhere and gives it row_map -1, which the other entries skip (out rows
 * nobody maps to are left as they were, and such a slot's dprobs is 0). */
typedef struct lutra_permute_args {
  int64_t tokens;
  int32_t k;
  int32_t experts;
  int64_t hidden;         /* columns of x and out */
  int32_t dtype;          /* of x, out and dy: F32, BF16 or F16 */
  int32_t probs_dtype;    /* F32, BF16 or F16 */
  const int32_t *indices; /* [tokens * k] (permute) */
  int32_t *row_map;       /* [tokens * k]: written by permute, read by the others */
  int32_t *m_splits;      /* [experts] (permute) */
  /* permute on a device: lutra_moe_scratch_ints(tokens * k, experts) ints of backend memory
   * (per-chunk counts; any content on entry); the CPU uses its first experts ints */
  int32_t *scratch;
  int32_t *bad_index; /* device flag (see above); NULL on the CPU */
  const void *x;
  void *out;
  const void *probs; /* [tokens * k] */
  const void *dy;    /* unpermute_backward: [tokens, hidden] */
  void *dprobs;      /* unpermute_backward: [tokens * k], probs_dtype */
} lutra_permute_args;

static inline int64_t lutra_moe_scratch_ints(int64_t slots, int64_t experts) {
  return (slots + LUTRA_MOE_CHUNK - 1) / LUTRA_MOE_CHUNK * experts;
}
LUTRA_ARGS_NO_PADDING_END

#endif
