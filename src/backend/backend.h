/* The backend interface: everything that touches tensor memory goes through one of these
 * tables, so recipes, quantizers and modules never know which device runs them.
 *
 * Rules for implementations
 * - Pointers to tensor data, scales and amaxes are backend memory (device memory on CUDA).
 * - Every function returns LUTRA_OK or a status after setting the error with lutra_error();
 *   none exits, aborts or leaves a partially written output visible to the caller except the
 *   output buffers named in the arguments.
 * - The CPU backend is the reference: bit-exact FP8 emulation through lutra_encode/decode.
 */
#ifndef LUTRA_BACKEND_H
#define LUTRA_BACKEND_H

#include "lutra.h"

#include <stdbool.h>

/* Delayed-scaling state of one quantizer. The struct lives on the host; the pointers point at
 * backend memory. scale and scale_inv are 16-byte aligned (cuBLASLt needs that for FP8). */
typedef struct lutra_scale_meta {
  float *scale;        /* [1] */
  float *scale_inv;    /* [1] */
  float *amax_history; /* [history_len]; [0] collects this step's amax (max-accumulated) */
  int32_t history_len;
  int32_t amax_compute_algo; /* LUTRA_AMAX_MAX or LUTRA_AMAX_MOST_RECENT */
  float fp8_max;
  int32_t margin;
  /* bookkeeping owned by autocast.c: which update list this meta joined last */
  uint64_t epoch;
  /* an external scaling rule's id (fp8/rules.c; 0: the built-in update, delayed_update) */
  int32_t rule;
} lutra_scale_meta;

/* The argument structs below are compared as bytes (backend/cuda/call_graphs.c keys a cached
 * call by its struct): no padding, which -Wpadded checks; a spare word is a named pad, zeroed by
 * the initializers that build every struct. */
#if defined(__GNUC__) && !defined(__CUDACC__) && !defined(__cplusplus)
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wpadded"
#endif
/* One quantization: x [rows, cols] (F32/BF16/F16) into FP8 rowwise and/or columnwise outputs,
 * in the layouts documented at lutra_tensor in lutra.h. NULL outputs are skipped. */
typedef struct lutra_quant_args {
  const void *x;
  int32_t x_dtype;
  int32_t out_dtype; /* LUTRA_E4M3 or LUTRA_E5M2 */
  int64_t rows, cols;
  void *data, *scale_inv;         /* rowwise output */
  void *col_data, *col_scale_inv; /* columnwise output (the transpose, quantized along its rows) */
  /* per-tensor casts */
  const float *scale; /* scale to multiply by before the cast; scale_inv outputs get 1/scale */
  float *amax;        /* if not NULL: *amax = max(*amax, max|x|) */
  /* block quantization (MXFP8 ignores these) */
  int32_t power_2_scale;
  float amax_epsilon;
  int32_t block_dim; /* 1: 1x128 blocks, 2: 128x128 tiles */
  int32_t pad;
  /* bias gradient of x, computed with the quantization (TransformerEngine's quantize_dbias):
   * dbias[c] (+= when dbias_accumulate) sum_r x[r, c], rounded once into dbias_dtype. The CPU
   * sums in double; a fused CUDA kernel sums each 64-row tile in f32 into dbias_scratch
   * (lutra_dbias_scratch_floats(rows, cols) floats the backend provides) and the tiles in
   * double, in the same launch. */
  void *dbias;
  int32_t dbias_dtype;
  int32_t dbias_accumulate;
  float *dbias_scratch;
  uint32_t *dbias_count; /* zeroed, one per 64 columns: lutra_dbias_counters(cols) (the kernel
                            counts the tiles of each column strip done, and zeroes it again) */
  /* GELU's backward fused in front (TransformerEngine's dgelu + cast + transpose + dbias): when
   * not NULL, the matrix quantized (and summed into dbias, and max'ed into amax) is
   * x * gelu'(act), in f32, where act is the GELU's input (x's dtype and shape): x is then the
   * gradient of the GELU's output. Per-tensor casts only (backend->cast); act_kind below
   * generalizes it to every activation kind and to the forward direction. */
  const void *act;
  /* TransformerEngine's noop flag: when not NULL and *skip != 0 at the time the work runs, the
   * quantization writes nothing at all (codes, scales, scale_inv, amax, dbias). Backend memory,
   * read by every kernel of the quantization on the device (so a CUDA graph can be replayed with
   * a different value); the CPU reads it directly. */
  const int32_t *skip;
  /* The activation kind of `act` (LUTRA_ACT_*; 0 with act set: the tanh GELU above) and its
   * direction, so that every kind's backward (TE's dact + dbias + cast + transpose) and forward
   * (quantize(act(x)) in one pass) runs inside the cast. rows and cols are always the shape of
   * the matrix quantized; act is the activation's input (the pre-activation):
   *   act_forward 0  x is the gradient of the activation's output ([rows, cols / 2] for gated
   *                  kinds, else [rows, cols]), act [rows, cols]; the matrix quantized is the
   *                  gradient of act (the gated kinds' both halves)
   *   act_forward 1  x is not read; act is [rows, 2 cols] for gated kinds, else [rows, cols];
   *                  the matrix quantized is act's output
   * Either way each value is the f32 formula of the activation backend entry, rounded once into
   * x_dtype, as activation_forward / activation_backward store it: the fused cast sees the
   * values the activation's own kernel would have written, bit for bit. act_out, when not
   * NULL, receives that matrix (x_dtype, [rows, cols]): the activation's output or input
   * gradient in high precision, written only when a caller needs it. */
  int32_t act_kind;
  int32_t act_forward;
  void *act_out;
  /* NVFP4 (lutra/nvfp4.h; out_dtype LUTRA_E2M1): LUTRA_NVFP4_* options, the RHT sign mask and
   * this quantization's stochastic-rounding seed (fp4_call_seed, core/fp4.h) */
  int32_t nvfp4;
  uint32_t rht_signs;
  uint64_t seed;
} lutra_quant_args;

#if defined(__GNUC__) && !defined(__CUDACC__) && !defined(__cplusplus)
#pragma GCC diagnostic pop
#endif

/* partial column sums kept by a fused quantize + bias gradient: one row per 64-row tile */
static inline int64_t lutra_dbias_scratch_floats(int64_t rows, int64_t cols) {
  return (rows + 63) / 64 * cols;
}
static inline int64_t lutra_dbias_counters(int64_t cols) {
  return (cols + 63) / 64;
}

#if defined(__GNUC__) && !defined(__CUDACC__) && !defined(__cplusplus)
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wpadded"
#endif
/* Dequantize an FP8 matrix stored as [rows, cols] with the given scaling layout. */
typedef struct lutra_dequant_args {
  const void *data;
  const void *scale_inv;
  int32_t dtype;   /* E4M3 or E5M2 */
  int32_t scaling; /* LUTRA_SCALING_* */
  int64_t rows, cols;
  void *out;
  int32_t out_dtype; /* F32, BF16 or F16 */
  int32_t pad;
} lutra_dequant_args;

#if defined(__GNUC__) && !defined(__CUDACC__) && !defined(__cplusplus)
#pragma GCC diagnostic pop
#endif

/* A GEMM operand as stored (row-major [rows, cols]) and how it is used. */
typedef struct lutra_gemm_operand {
  const void *data;
  const void *scale_inv; /* FP8 only */
  int32_t dtype;
  int32_t scaling;
  int64_t rows, cols;
  int32_t trans;
} lutra_gemm_operand;

/* What a plan is cached by. Compared with memcmp: build it zeroed. */
typedef struct lutra_gemm_key {
  int64_t m, n, k;
  int32_t a_dtype, b_dtype, d_dtype, bias_dtype; /* bias_dtype -1: no bias */
  int32_t a_scaling, b_scaling;
  int32_t transa, transb;
  int32_t accumulate;
  int32_t fast_accum;
  int32_t device;
  int32_t epilogue;    /* LUTRA_EPILOGUE_* */
  int32_t aux_dtype;   /* -1: no aux */
  int32_t dbias_dtype; /* -1: no dbias */
} lutra_gemm_key;

typedef struct lutra_gemm_plan {
  lutra_gemm_key key;
  size_t workspace_bytes; /* scratch the backend needs for this shape */
  void *backend_plan;     /* descriptors and algorithm (CUDA); NULL on CPU */
} lutra_gemm_plan;

/* D [m, n] = op(B) [m, k] @ op(A) [k, n] (+ bias [n]) (+ D if accumulate), then the epilogue
 * (lutra_gemm_epilogue in lutra.h; the front has checked its combination rules). */
typedef struct lutra_gemm_args {
  lutra_gemm_operand a, b;
  void *d;
  int32_t d_dtype;
  int32_t accumulate;
  int64_t m, n, k;
  const void *bias;
  int32_t bias_dtype;
  int32_t epilogue; /* LUTRA_EPILOGUE_* */
  void *aux;        /* [m, n] row-major, aux_dtype (= d_dtype): GELU_AUX out, DGELU* in */
  void *dbias;      /* DGELU_BGRAD: [n]; BGRADB: [m] */
  int32_t aux_dtype;
  int32_t dbias_dtype;
  const lutra_gemm_plan *plan;
  void *workspace;
  size_t workspace_bytes;
} lutra_gemm_args;

/* Optimizer steps over many tensors in one call. For each i: value[i] (dtype value_dtype[i])
 * is updated from grad[i] (f32 or the value dtype); master[i], when not NULL, is the f32
 * master copy that is updated and then rounded into value[i]. */
typedef struct lutra_optim_args {
  int32_t count;
  int32_t pad;
  void **value;
  int32_t *value_dtype;
  const void **grad;
  int32_t *grad_dtype;
  float **master;
  float **m; /* SGD momentum buffer or AdamW first moment (NULL for plain SGD) */
  float **v; /* AdamW second moment */
  int64_t *numel;
  float lr, momentum, weight_decay, beta1, beta2, eps;
  int64_t step; /* AdamW: 1-based step for bias correction */
  /* AdamW on a device (NULL on the CPU, which uses step): the number of steps taken, in backend
   * memory owned by the optimizer (zeroed at creation). The step's kernel reads
   * t = *device_step + 1 and advances the counter itself, so that a replayed CUDA graph takes
   * step t + 1 next; arrivals is that kernel's block counter (zero between launches). */
  int64_t *device_step;
  uint32_t *arrivals;
} lutra_optim_args;

#if defined(__GNUC__) && !defined(__CUDACC__) && !defined(__cplusplus)
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wpadded"
#endif
/* Activation kinds (lutra_act_args.act). Internal to the backends and modules, so that kinds
 * can be added (relu, silu, swiglu, erf GELU) without touching the public API; a backend
 * refuses a kind it does not implement with LUTRA_EUNSUPPORTED. */
enum {
  LUTRA_ACT_NONE = 0, /* no activation (modules and fusions; no backend entry takes it) */
  /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), TransformerEngine's and cuBLASLt's GELU */
  LUTRA_ACT_GELU_TANH = 1,
  /* ---- activations beside the tanh GELU (TransformerEngine's set); the values are the public
   * LUTRA_ACTIVATION_* of lutra.h, which src/nn/activation.c asserts ---- */
  LUTRA_ACT_RELU = 2,     /* max(x, 0) */
  LUTRA_ACT_SILU = 3,     /* x sigmoid(x) */
  LUTRA_ACT_QGELU = 4,    /* x sigmoid(1.702 x) */
  LUTRA_ACT_SRELU = 5,    /* relu(x)^2 */
  LUTRA_ACT_GELU_ERF = 6, /* 0.5 x (1 + erf(x / sqrt 2)) */
  /* gated: x [rows, cols], cols = 2h even, gate a = x[:, :h], linear b = x[:, h:] (TE's order);
   * y [rows, h] = f(a) b */
  LUTRA_ACT_SWIGLU = 7, /* silu(a) b */
  LUTRA_ACT_GEGLU = 8,  /* gelu_tanh(a) b */
  LUTRA_ACT_REGLU = 9,  /* relu(a) b */
  LUTRA_ACT_COUNT = 10, /* one past the last kind */
};

/* whether kind act is gated (its input's last dim is split in two halves) */
static inline bool lutra_act_is_gated(int act) {
  return act == LUTRA_ACT_SWIGLU || act == LUTRA_ACT_GEGLU || act == LUTRA_ACT_REGLU;
}

/* An element-wise activation over n elements (F32/BF16/F16, all three buffers of one dtype):
 * forward out = act(x), backward out = dy * act'(x) in f32, rounded once. out may be x or dy
 * (each element is read before it is written).
 * Gated kinds read rows and cols (x [rows, cols], cols even, h = cols / 2) instead of n:
 * forward out [rows, h] = f(a) b; backward dy [rows, h], out = dx [rows, cols] with
 * da = dy b f'(a), db = dy f(a), each in f32 and rounded once; out must not alias x or dy. */
typedef struct lutra_act_args {
  const void *x;  /* the activation's input */
  const void *dy; /* backward: the gradient of its output; forward ignores it */
  void *out;      /* forward: y; backward: dx */
  int32_t dtype;
  int32_t act; /* LUTRA_ACT_* */
  int64_t n;
  int64_t rows, cols; /* gated kinds: the input's shape as a matrix (n is ignored) */
} lutra_act_args;

/* db[c] (+= when accumulate) sum_r dy[r, c], summed in double and rounded once into db_dtype. */
typedef struct lutra_bias_grad_args {
  const void *dy; /* [rows, cols] */
  int32_t dtype;
  int32_t pad;
  int64_t rows, cols;
  void *db; /* [cols] */
  int32_t db_dtype;
  int32_t accumulate;
  /* when not NULL and *skip != 0 at the time the work runs, nothing is written: a
   * quantization's skip flag (lutra_quant_args.skip), backend memory */
  const int32_t *skip;
} lutra_bias_grad_args;

/* A loss and its gradient, in one struct for both losses (each reads its own fields):
 * mse: loss = mean((pred - target)^2) over n elements, dgrad = 2 (pred - target) / n;
 * softmax_xent: pred is logits [rows, cols], loss = mean_r -log softmax(pred[r])[labels[r]],
 * dgrad = (softmax - onehot) / rows. The means accumulate in double. */
typedef struct lutra_loss_args {
  const void *pred;      /* mse: the prediction; softmax_xent: the logits */
  const void *target;    /* mse: pred's dtype and size */
  const int32_t *labels; /* softmax_xent: [rows], each in [0, cols) */
  int32_t dtype;         /* pred's, target's and dgrad's */
  int32_t pad;
  int64_t rows, cols; /* softmax_xent */
  int64_t n;          /* mse */
  float *loss;        /* f32 [1] */
  void *dgrad;        /* if not NULL: d loss / d pred, pred's dtype and shape */
  /* softmax_xent on a device, if not NULL: backend memory set to 1 when a label is outside
   * [0, cols) (never cleared by the backend; the loss is NaN then). A kernel cannot return an
   * error, and reading a flag back would cost a synchronization per call, so the loss module
   * reads it with the loss value. The CPU refuses such labels at once instead. */
  int32_t *bad_label;
} lutra_loss_args;

/* ---- norms (LayerNorm, RMSNorm; src/backend/cpu/norm_cpu.c, kernels/norm.cu) ----
 * Over the last dim of x [rows, hidden], statistics in f32 (f32 sums in one fixed order):
 *   LayerNorm  y = (x - mean) * rstd * g + beta,  rstd = 1 / sqrt(var + eps)  (biased var)
 *   RMSNorm    y = x * rstd * g,                  rstd = 1 / sqrt(mean(x^2) + eps)
 * with g = gamma, or gamma + 1 when zero_centered_gamma (TransformerEngine's: the stored weight
 * is gamma - 1). x, y, dy and dx have dtype; gamma, beta, dgamma and dbeta param_dtype. */
typedef struct lutra_norm_args {
  const void *x;     /* [rows, hidden] */
  const void *gamma; /* [hidden] */
  const void *beta;  /* [hidden]; LayerNorm only (RMSNorm ignores it) */
  int32_t dtype, param_dtype;
  int64_t rows, hidden;
  float eps;
  int32_t rms;                 /* 1: RMSNorm (no mean, no beta) */
  int32_t zero_centered_gamma; /* 1: g = gamma + 1 */
  int32_t pad;
  /* forward writes y, and mean (LayerNorm) and rstd [rows] f32 when not NULL; backward reads
   * the mean and rstd of that forward */
  void *y;
  float *mean, *rstd;
  /* backward: dx [rows, hidden] (may be NULL: not wanted), dgamma and dbeta [hidden] (dbeta
   * NULL for RMSNorm), overwritten; the column sums are deterministic (a fixed order) */
  const void *dy;
  void *dx, *dgamma, *dbeta;
} lutra_norm_args;

/* ---- the norm writing a GEMM's FP8 input (src/backend/cpu/norm_quantize_cpu.c,
 * kernels/norm_quantize.cu; TransformerEngine's layernorm_fwd with an FP8 output) ----
 * The norm of norm (its y may be NULL: no high-precision output) is rounded into norm.dtype,
 * exactly as layernorm_forward stores it, and that value is quantized as the quantizer of
 * quant.scaling would quantize the stored y: the codes, scales and amax equal those of
 * layernorm_forward followed by cast / quantize_mxfp8 / quantize_block (block_dim 1) on its y.
 * quant.x, x_dtype, rows, cols, act, dbias* are ignored (the input is norm's). Per-tensor:
 *   delayed  (current 0) quant.scale is read, *quant.amax max-accumulates max|y|: one pass;
 *   current  (current 1) *quant.amax = max|y| and *quant.scale from it (fp8_max,
 *            quant.power_2_scale, quant.amax_epsilon; TE's compute_scale_from_amax), then the
 *            cast with that scale: the scale depends on every row's output, so the norm runs
 *            twice (CUDA: two launches; work: 2 words of backend memory, zero on entry, left
 *            zero, as current_scale's).
 * MXFP8 needs hidden % 32 == 0 (and rows % 32 for the columnwise copy); BLOCK_1D is 1x128
 * blocks (quant.block_dim is ignored). quant.skip as for the quantizers: nothing is written. */
typedef struct lutra_norm_quant_args {
  lutra_norm_args norm;
  lutra_quant_args quant;
  int32_t scaling; /* LUTRA_SCALING_TENSOR, LUTRA_SCALING_MXFP8 or LUTRA_SCALING_BLOCK_1D */
  int32_t current; /* TENSOR: 1 for current scaling */
  float fp8_max;   /* current scaling */
  int32_t pad;
  uint32_t *work; /* current scaling */
} lutra_norm_quant_args;
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
/* ---- grouped operations (GroupedLinear; backend/grouped_layout.h has the packed FP8 layout) ----
 * Expert e owns rows [R_e, R_e + splits[e]) of the token-side matrices (x, y, dy, dx), R_e the
 * prefix sum. splits is backend memory, read where the work runs: the host never reads it on a
 * device. A split < 0, or splits summing to anything but total_rows, is an error: the CPU
 * refuses at once (LUTRA_EINVAL); a device backend sets *bad_split = 1 and writes nothing. */

/* The FP8 copy of one grouped operand in the packed layout. */
typedef struct lutra_grouped_fp8 {
  void *data, *scale_inv;         /* rowwise */
  void *col_data, *col_scale_inv; /* columnwise (each expert's transpose) */
  int32_t dtype;                  /* E4M3 / E5M2 */
  int32_t scaling;                /* LUTRA_SCALING_* */
  int32_t align;                  /* rows of each expert padded to a multiple of align */
  int32_t pad;
} lutra_grouped_fp8;

/* Quantize every expert's rows in one call, each with its own scaling state (its own scale and
 * amax for per-tensor scaling), into the packed layout. Expert e's rows are xs[e] [rows_each,
 * cols] when xs is not NULL (the weights), else its token rows of x (splits). */
typedef struct lutra_grouped_quant_args {
  int32_t num;
  int32_t kind; /* LUTRA_QUANT_DELAYED, _CURRENT, _MXFP8, _BLOCK_1D, _BLOCK_2D */
  const int32_t *splits;
  int32_t *bad_split;
  int64_t total_rows, cols;
  const void *x;
  const void *const *xs; /* backend memory [num] */
  int64_t rows_each;
  int32_t x_dtype;
  int32_t power_2_scale;
  float amax_epsilon;
  float fp8_max;
  int32_t block_dim;
  int32_t amax_stride; /* amax of expert e at amax[e * amax_stride] */
  /* per-tensor: expert e multiplies by scale[4 e]; current scaling writes it, and amax (e's
   * max|x|; delayed: max-accumulated into when amax is not NULL) */
  float *scale;
  float *amax;
  uint32_t *work; /* current scaling: 2 zero words per expert at work[4 e] (current_scale) */
  lutra_grouped_fp8 out;
  /* the bias gradient of each expert's rows: dbias[e] [cols] (+= when dbias_accumulate) */
  void *const *dbias; /* backend memory [num], or NULL */
  int32_t dbias_dtype;
  int32_t dbias_accumulate;
  const int32_t *skip; /* lutra_quant_args.skip */
  /* device scratch of lutra_grouped_scratch_bytes(num, in, out) bytes owned by the caller (the
   * offsets and GEMM argument arrays the kernels derive from splits); NULL on the CPU */
  void *scratch;
  /* An activation inside the cast, as lutra_quant_args.act_kind / act_forward say of one
   * matrix, over each expert's token rows (xs NULL; per-tensor scaling): act (not NULL) is the
   * activation's input, [total_rows, 2 cols] for a gated forward, else [total_rows, cols];
   * act_forward 0: x is the gradient of its output ([total_rows, cols / 2] for gated kinds).
   * The matrix quantized (and summed into dbias, and max'ed into amax) is the activation's
   * output or input gradient, each value rounded once into x_dtype as the activation's kernel
   * stores it; act_out, when not NULL, receives it ([total_rows, cols], x_dtype, unpadded). */
  const void *act;
  int32_t act_kind; /* LUTRA_ACT_*, not NONE with act */
  int32_t act_forward;
  void *act_out;
} lutra_grouped_quant_args;

/* Which of a GroupedLinear's three GEMMs, per expert e with s_e rows (W_e [out, in]):
 *   FPROP  y_e [s_e, out]  = x_e W_e^T (+ bias[e])
 *   DGRAD  dx_e [s_e, in]  = dy_e W_e
 *   WGRAD  dw[e] [out, in] (+)= dy_e^T x_e, and db[e] [out] = the column sums of dy_e */
enum { LUTRA_GROUPED_FPROP = 0, LUTRA_GROUPED_DGRAD = 1, LUTRA_GROUPED_WGRAD = 2 };

typedef struct lutra_grouped_gemm_args {
  int32_t pass; /* LUTRA_GROUPED_* */
  int32_t num;
  const int32_t *splits;
  int32_t *bad_split;
  int64_t total_rows, in, out;
  int32_t dtype;      /* of x, dy, W, y and dx */
  int32_t fp8;        /* 1: the operands are xq, dyq and wq (TN through their columnwise copies) */
  const void *x, *dy; /* high precision token operands */
  const void *const *w; /* backend memory [num]: W_e */
  lutra_grouped_fp8 xq, dyq, wq;
  void *y, *dx;
  void *const *dw; /* backend memory [num] */
  int32_t dw_dtype;
  int32_t accumulate;      /* WGRAD: dw[e] += (main_grad); db[e] += */
  const void *const *bias; /* FPROP: backend memory [num], or NULL */
  void *const *db;         /* WGRAD, high precision: backend memory [num], or NULL */
  int32_t bias_dtype;      /* bias's and db's */
  int32_t fast_accum;      /* FP8 FPROP: no split accumulator */
  void *scratch;           /* as lutra_grouped_quant_args.scratch */
  /* FPROP: where splits are copied as the GEMM reads them, or NULL. A module's forward reads
   * the caller's device splits in place and keeps this copy for its backward, so that a
   * forward issues no copy of its own. */
  int32_t *save_splits;
  /* the calling module's slot for the backend's cached graphs of its calls (CUDA: the call's
   * launches replayed as one graph, backend/cuda/call_graphs.c; freed by call_graphs_free), or
   * NULL: every call runs directly */
  void **call_graphs;
} lutra_grouped_gemm_args;

#if defined(__GNUC__) && !defined(__CUDACC__) && !defined(__cplusplus)
#pragma GCC diagnostic pop
#endif

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
  /* current scaling's amax and scale in one call: *amax = max|x| over n elements (NaNs
   * ignored; 0 when n == 0), *scale from it (TransformerEngine's compute_scale_from_amax).
   * work: 2 words of backend memory that are zero on entry and left zero (CUDA: the blocks'
   * shared maximum and arrival count; the last block to arrive writes *amax and *scale and
   * clears them), so no memset precedes it. Writes nothing at all when skip && *skip. */
  int (*current_scale)(const void *x, int dtype, int64_t n, float fp8_max, int power_2_scale,
                       float epsilon, float *amax, float *scale, uint32_t *work,
                       const int32_t *skip);
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

  /* grouped operations (NULL where the backend has none: GroupedLinear refuses then) */
  int (*grouped_quantize)(const lutra_grouped_quant_args *a);
  int (*grouped_gemm)(const lutra_grouped_gemm_args *g);
  /* frees what grouped_gemm cached in a module's call_graphs slot (NULL: nothing is cached) */
  void (*call_graphs_free)(void *graphs);

  /* Current scaling of a cast with an activation inside (lutra_quant_args.act_kind): *amax =
   * max|v| over the matrix that cast quantizes (NaNs ignored), *scale from it as current_scale
   * computes it (fp8_max, a->power_2_scale, a->amax_epsilon); work as current_scale's; nothing
   * written when a->skip is set. The amax pass and the cast then each read the activation's
   * input instead of a stored output. NULL where a backend has none. */
  int (*current_scale_act)(const lutra_quant_args *a, float fp8_max, float *amax, float *scale,
                           uint32_t *work);
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
} lutra_backend;

#endif
