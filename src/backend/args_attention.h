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
 * always; cuDNN says per plan, *deterministic of attention_plan). deterministic = 1 (the
 * determinism switch, lutra/determinism.h) makes it a requirement: a plan without a
 * deterministic backward refuses the backward.
 * rng (CUDA, dropout): the module's Philox (seed, offset) in backend memory, which the backend's
 * graphs read (so that a captured step replays with fresh masks): a forward first advances
 * rng[1] by LUTRA_ATTENTION_OFFSET_STEP on the device and draws its mask from the result, a
 * backward redraws from rng[1] as it is. seed and offset are then not read. NULL: the backend
 * draws from seed and offset (the CPU always does).
 * FP8 (fp8 = 1; no dropout, d 128): q, k, v and out are E4M3 codes, dout, dq, dk and dv codes of
 * grad_dtype (E5M2 or E4M3), in the strides above (1-byte elements); dtype is the module's (not
 * read). fp8_state is backend memory laid out as lutra_attention_fp8_slot says (lutra/attention.h
 * numbers the tensors): the forward reads the live scales of QKV, S and O, the backward the
 * saved ones the forward used (its q, k, v and out were quantized with them) and the live
 * scales of dO, dP and dQKV. Each call writes its amaxes (overwriting) into the amax slots:
 * forward max S (the probabilities before scale_S) and max |O|; backward max |dQ|, |dK|, |dV|
 * and max |dS| (dP's slot; dS = softmax_scale P (dP - D), the scale folded in as cuDNN's graph
 * does), each taken before its scale. Rounded to FP8 (RNE, saturating) on the
 * way, as cuDNN does: S * scale_S to E4M3 before S V; dS * scale_dP to grad_dtype before dS K
 * and dS^T Q; the outputs * their scale. */
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
  int32_t fp8;           /* 1: the FP8 path (above) */
  int32_t grad_dtype;    /* FP8: dout's, dP's and the gradients' (LUTRA_E5M2 or LUTRA_E4M3) */
  int32_t deterministic; /* 1: the backward must be deterministic (above) */
  int32_t reserved;      /* 0 */
  float *fp8_state;      /* FP8: the scaling state (lutra_attention_fp8_slot) */
  int64_t *rng;          /* dropout's device (seed, offset), or NULL (above) */
  /* from attention_plan with the same shape, strides, dtype, causal and dropout (NULL on the
   * CPU); workspace: at least the plan's workspace bytes of backend memory */
  void *plan;
  void *workspace;
  int64_t workspace_bytes;
} lutra_attention_args;
LUTRA_ARGS_NO_PADDING_END

/* Where FP8 attention's scaling state sits in fp8_state (floats, each slot 16-byte aligned):
 * tensor t's (LUTRA_ATTENTION_FP8_*) scale at [8 t] and scale_inv at [8 t + 4]; the amaxes a
 * call writes at LUTRA_ATTN_FP8_AMAX + 4 LUTRA_ATTN_AMAX_*; the forward's QKV, S and O scale and
 * scale_inv as the forward used them (copied after it) at LUTRA_ATTN_FP8_SAVED + the same
 * offsets; the amax histories from LUTRA_ATTN_FP8_HISTORY (the module's, not read here). */
enum {
  LUTRA_ATTN_FP8_AMAX = 48,
  LUTRA_ATTN_FP8_SAVED = 72, /* 24 floats: QKV, S, O scale/scale_inv */
  LUTRA_ATTN_FP8_HISTORY = 96
};
/* the amax slots' order (each 4 floats apart from LUTRA_ATTN_FP8_AMAX): the three of dQKV
 * adjacent, so that one max over 12 floats (the others stay 0) combines them */
enum {
  LUTRA_ATTN_AMAX_S = 0,
  LUTRA_ATTN_AMAX_O = 1,
  LUTRA_ATTN_AMAX_DQ = 2,
  LUTRA_ATTN_AMAX_DK = 3,
  LUTRA_ATTN_AMAX_DV = 4,
  LUTRA_ATTN_AMAX_DP = 5
};
static inline float *lutra_attention_scale(float *state, int t, int saved) {
  return state + (saved ? LUTRA_ATTN_FP8_SAVED : 0) + 8 * t;
}
static inline float *lutra_attention_scale_inv(float *state, int t, int saved) {
  return state + (saved ? LUTRA_ATTN_FP8_SAVED : 0) + 8 * t + 4;
}
static inline float *lutra_attention_amax(float *state, int slot) {
  return state + LUTRA_ATTN_FP8_AMAX + 4 * slot;
}

#endif
