/* The backend's attention arguments (backend/backend.h's attention entries): scaled dot-product
 * attention, softmax(q k^T * scale [+ causal mask]) v, forward and backward. */
#ifndef LUTRA_BACKEND_ARGS_ATTENTION_H
#define LUTRA_BACKEND_ARGS_ATTENTION_H

#include "backend/args_common.h"

LUTRA_ARGS_NO_PADDING_BEGIN
/* Every tensor is addressed by four strides in elements, in the order (batch, sequence, head,
 * head_dim), so that one struct covers bshd, sbhd and q, k, v read in place from a fused QKV
 * projection's output (the module packs [q heads | k heads | v heads] along the last dim).
 *   q, dq       [b, s_q,  h,    d]  strides q_stride
 *   k, v, dk, dv [b, s_kv, h_kv, d]  strides k_stride, v_stride (dk, dv: the same as k, v)
 *   out, dout   [b, s_q,  h,    d]  strides o_stride
 *   stats       [b, h, s_q] f32 contiguous: the log-sum-exp of each row of scaled scores (the
 *               forward writes it, the backward reads it; cuDNN's "Stats")
 * GQA: h is a multiple of h_kv; query head j reads key/value head j / (h / h_kv).
 * causal: query position i sees key positions 0 .. i (top-left aligned, TE's "causal"); it needs
 * s_q == s_kv.
 * dropout: the probability of dropping an attention weight (the kept ones scaled by 1 / (1 - p)),
 * the mask drawn from (seed, offset) by the backend's own generator (the CPU's and cuDNN's masks
 * differ); the backward redraws the same mask from the same (seed, offset).
 * Deterministic: the backward gives the same bits every run where the backend can (the CPU
 * always; cuDNN says per plan, *deterministic of attention_plan). */
typedef struct lutra_attention_args {
  const void *q, *k, *v;
  void *out;        /* forward */
  float *stats;     /* forward writes, backward reads */
  const void *dout; /* backward */
  void *dq, *dk, *dv;
  int64_t b, s_q, s_kv, h, h_kv, d;
  int64_t q_stride[4], k_stride[4], v_stride[4], o_stride[4];
  float scale;   /* the softmax scale, usually 1 / sqrt(d) */
  float dropout; /* 0 .. 1 (exclusive) */
  uint64_t seed, offset;
  int32_t dtype; /* F32 (the CPU only), BF16, F16 */
  int32_t causal;
  /* from attention_plan with the same shape, strides, dtype, causal and dropout (NULL on the
   * CPU); workspace: at least the plan's workspace bytes of backend memory */
  void *plan;
  void *workspace;
  int64_t workspace_bytes;
} lutra_attention_args;
LUTRA_ARGS_NO_PADDING_END

#endif
