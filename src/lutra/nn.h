/* lutra/nn.h: modules: Linear, norms, activations, Sequential, parameters.
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_NN_H
#define LUTRA_NN_H

#include "quantizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- modules ----------------------------------------------------------------------------- */
typedef struct lutra_module lutra_module;

/* is_first_microbatch of lutra_module_forward. DEVICE: the weight is quantized on every call,
 * under the device's skip-weight-update flag (lutra_set_skip_weight_update), which the
 * quantization reads when it runs: 0 quantizes (and caches), 1 keeps the FP8 weight of the last
 * quantization. For CUDA graphs of gradient accumulation, where the host cannot choose between
 * 1 and 0 per replay. The first forward of a Linear (and the first after a recipe change) must
 * quantize: it is refused while the flag is set from the host. */
enum { LUTRA_FIRST_MICROBATCH_NONE = -1, LUTRA_FIRST_MICROBATCH_DEVICE = 2 };

typedef struct lutra_linear_desc {
  int64_t in_features;
  int64_t out_features;
  int32_t bias;                 /* default 1 */
  int32_t dtype;                /* parameter and activation dtype: F32 (default) or BF16 */
  int32_t device;               /* LUTRA_CPU (default) */
  int32_t accumulate_main_grad; /* wgrad accumulates into an f32 main_grad buffer */
  uint64_t seed; /* weight init: uniform(-1/sqrt(in), 1/sqrt(in)); default: the next seed of
                    the global generator (lutra_seed_next) */
  /* Weight tying (GPT's LM head on its token embedding): not NULL, the Linear uses parameter
   * tie_param of module tie (an Embedding's weight [num_embeddings, dim] is a Linear(dim ->
   * num_embeddings)'s [out, in]; or another Linear's weight) as its own weight: the same value,
   * gradient and main_grad tensors, one buffer each. Refused unless the shape is [out_features,
   * in_features], dtype and device are the Linear's, and accumulate_main_grad is tie's; tie must
   * be an Embedding or Linear (or a Linear tied itself). The Linear holds a reference to tie, so
   * either may be dropped first; tie cannot be destroyed while the Linear lives. Gradients: a
   * backward overwrites the weight gradient unless the other module wrote it since this one's
   * forward, then adds: after a step's forwards and backwards (in any order) it holds the sum
   * of both parts, with nothing to zero in between (accumulate_main_grad: both add into
   * main_grad). A Sequential (and so an optimizer, a grad sync, zero_grad) lists the shared
   * weight once; a checkpoint stores it once, under its first name in the tree. The bias stays
   * the Linear's own. Not for tensor-parallel Linears. */
  lutra_module *tie;
  int32_t tie_param;
  int32_t pad;
} lutra_linear_desc;

LUTRA_API void lutra_linear_defaults(lutra_linear_desc *d);
LUTRA_API int lutra_linear_new(const lutra_linear_desc *d, lutra_module **out);
/* A Linear's tie: *kind the kind of the module whose weight it uses ("embedding", "linear"), or
 * NULL when its weight is its own. */
LUTRA_API int lutra_linear_tied_to(const lutra_module *m, const char **kind);
LUTRA_API int lutra_gelu_new(lutra_module **out);
/* LayerNorm and RMSNorm over the last dim (TransformerEngine's LayerNorm / RMSNorm): weight
 * [hidden] (ones, or zeros when zero_centered_gamma: the stored weight is gamma - 1) and, for
 * LayerNorm, bias [hidden] (zeros), in dtype; the input must have dtype and hidden features. */
typedef struct lutra_norm_desc {
  int64_t hidden;
  float eps;                   /* default 1e-5 */
  int32_t rms;                 /* 1: RMSNorm (no bias) */
  int32_t zero_centered_gamma; /* default 0 */
  int32_t dtype;               /* F32 (default) or BF16 */
  int32_t device;              /* LUTRA_CPU (default) */
} lutra_norm_desc;
LUTRA_API void lutra_norm_defaults(lutra_norm_desc *d);
LUTRA_API int lutra_layernorm_new(const lutra_norm_desc *d, lutra_module **out);
/* ---- activations (TransformerEngine's set) ----
 * lutra_activation_new(kind): an activation module of a LUTRA_ACTIVATION_* kind; lutra_gelu_new
 * is kind GELU_TANH, the only one a Linear before it runs in its GEMM's epilogue. Gated kinds
 * take an input whose last dim is 2h and give h: the first half a is the gate, the second b the
 * linear part (TE's order), y = f(a) b; their last dim must be even (LUTRA_EINVAL otherwise). */
enum {
  LUTRA_ACTIVATION_GELU_TANH = 1, /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
  LUTRA_ACTIVATION_RELU = 2,      /* max(x, 0) */
  LUTRA_ACTIVATION_SILU = 3,      /* x sigmoid(x) */
  LUTRA_ACTIVATION_QGELU = 4,     /* x sigmoid(1.702 x), QuickGELU */
  LUTRA_ACTIVATION_SRELU = 5,     /* relu(x)^2, SquaredReLU */
  LUTRA_ACTIVATION_GELU_ERF = 6,  /* 0.5 x (1 + erf(x / sqrt 2)), the exact GELU */
  LUTRA_ACTIVATION_SWIGLU = 7,    /* silu(a) b */
  LUTRA_ACTIVATION_GEGLU = 8,     /* gelu_tanh(a) b */
  LUTRA_ACTIVATION_REGLU = 9,     /* relu(a) b */
  LUTRA_ACTIVATION_TANH = 10,     /* tanh(x) */
};
LUTRA_API int lutra_activation_new(int kind, lutra_module **out);
/* ---- end activations ---- */
/* A chain of modules; it holds a reference to each. A Linear followed by a GELU runs as one
 * GEMM with the GELU in its epilogue, and the Linear after that GELU applies gelu' in its dgrad
 * GEMM (not with FP8 operands, where the GELU's backward kernel runs). */
LUTRA_API int lutra_sequential_new(lutra_module *const *mods, int n, lutra_module **out);
/* Linear+GELU pairs the last forward and backward of a Sequential fused into GEMM epilogues. */
LUTRA_API int lutra_sequential_fusions(const lutra_module *m, int *forward, int *backward);
LUTRA_API int lutra_module_unref(lutra_module *m);
LUTRA_API int lutra_module_destroy(lutra_module *m);
LUTRA_API const char *lutra_module_kind(const lutra_module *m);
/* What one forward call is told beyond its input, for every module kind (fields a module does
 * not use are ignored; start from lutra_forward_defaults so that new fields get their defaults).
 *   is_first_microbatch  -1 (always quantize weights), 1 (quantize and cache), 0 (reuse), 2
 *                        (LUTRA_FIRST_MICROBATCH_DEVICE: quantize unless the device's
 *                        skip-weight-update flag is set)
 *   grad                 nonzero (default): a backward follows. 0: an inference forward; the
 *                        module keeps nothing for backward, and a backward after it is refused
 *   splits               NULL (default), or the m_splits of every GroupedLinear the forward
 *                        reaches (an I32 tensor, as lutra_grouped_set_splits takes it), so that
 *                        one call gives them to both experts' layers of a Sequential; a
 *                        Sequential with no GroupedLinear refuses them */
typedef struct lutra_forward_args {
  int32_t is_first_microbatch;
  int32_t grad;
  const lutra_tensor *splits;
} lutra_forward_args;
LUTRA_API void lutra_forward_defaults(lutra_forward_args *a);
LUTRA_API int lutra_module_forward_ex(lutra_module *m, const lutra_tensor *x,
                                      const lutra_forward_args *a, lutra_tensor **y);
/* lutra_module_forward_ex with the defaults and is_first_microbatch. */
LUTRA_API int lutra_module_forward(lutra_module *m, const lutra_tensor *x, int is_first_microbatch,
                                   lutra_tensor **y);
/* dx NULL: the input's gradient is not wanted (the input is data, as a tensor without
 * requires_grad in PyTorch): the module skips the work that only it needs (a Linear's dgrad GEMM,
 * a Sequential's first module's); parameter gradients are computed as always. */
LUTRA_API int lutra_module_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx);
/* Parameters: weight, bias, their gradients and main grads, by index. NULL where absent. A
 * Sequential lists its children's in order, a weight two of them share (a tied Linear's) once. */
typedef struct lutra_param {
  lutra_tensor *value;
  lutra_tensor *grad;      /* written by backward (overwritten each backward; a tied weight:
                              lutra_linear_desc.tie) */
  lutra_tensor *main_grad; /* f32, accumulated by backward when asked for, else NULL */
} lutra_param;
LUTRA_API int lutra_module_num_params(const lutra_module *m, int *n);
LUTRA_API int lutra_module_param(const lutra_module *m, int i, lutra_param *out);
LUTRA_API int lutra_module_zero_grad(lutra_module *m);
/* The device's skip-weight-update flag (TransformerEngine's skip_fp8_weight_update), read by
 * forwards with is_first_microbatch LUTRA_FIRST_MICROBATCH_DEVICE: nonzero skips their weight
 * quantization. It lives in device memory (zero at first use) and is set in stream order (work
 * queued before sees the old value, work and graph replays queued after the new one), without
 * synchronizing. Refused while this thread captures a CUDA graph: set it between replays. */
LUTRA_API int lutra_set_skip_weight_update(int device, int skip);
/* Linear only: the quantizer a role used in the last forward/backward, or NULL. */
LUTRA_API int lutra_linear_quantizer(const lutra_module *m, int role, lutra_quantizer **out);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_NN_H */
