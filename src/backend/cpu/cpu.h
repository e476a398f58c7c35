/* The CPU backend's functions (the table is in backend_cpu.c). The reference implementation:
 * plain loops, bit-exact FP8 through lutra_encode/lutra_decode, OpenBLAS for GEMMs. */
#ifndef LUTRA_CPU_H
#define LUTRA_CPU_H

#include "backend/backend.h"
#include "core/codec.h"
#include "core/dtype.h"
#include "core/error.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>

extern const lutra_backend lutra_cpu_backend;

/* the dtypes the element-wise ops, losses and optimizers take */
static inline bool lutra_cpu_float_dtype(int dtype) {
  return dtype == LUTRA_F32 || dtype == LUTRA_BF16 || dtype == LUTRA_F16;
}
#define CHECK_FLOAT_DTYPE(dtype, what)                                                             \
  CHECK_ARG(lutra_cpu_float_dtype(dtype), "unsupported %s dtype %d (expected F32, BF16, F16)",     \
            what, (int)(dtype))

/* TransformerEngine's compute_scale_from_amax (value_for_inf = FLT_MAX): the scale of the
 * per-tensor, block and rowwise quantizations */
static inline float lutra_cpu_scale_rule(float amax, float fp8_max, int power_2_scale,
                                         float epsilon) {
  float a = amax;
  if (a < epsilon) a = epsilon;
  float scale = 1.0f;
  if (isinf(a) || a == 0.0f) return scale;
  scale = fp8_max / a;
  if (isinf(scale)) scale = FLT_MAX;
  if (power_2_scale) scale = bits_f32(f32_bits(scale) & 0xFF800000u);
  return scale;
}

/* memory (memory_cpu.c) */
int lutra_cpu_alloc(size_t bytes, void **out);
void lutra_cpu_free(void *p);
int lutra_cpu_memcpy(void *dst, const void *src, size_t bytes);
int lutra_cpu_memset(void *dst, int value, size_t bytes);

/* element-wise and quantization (quantize_cpu.c) */
int lutra_cpu_convert(const void *src, int src_dtype, void *dst, int dst_dtype, int64_t n);
int lutra_cpu_fill(void *dst, int dtype, int64_t n, float value);
int lutra_cpu_amax(const void *x, int dtype, int64_t n, float *amax);
int lutra_cpu_current_scale(const void *x, int dtype, int64_t n, float fp8_max, int power_2_scale,
                            float epsilon, float *amax, float *scale, uint32_t *work,
                            const int32_t *skip);
int lutra_cpu_cast(const lutra_quant_args *a);
int lutra_cpu_quantize_mxfp8(const lutra_quant_args *a);
int lutra_cpu_quantize_block(const lutra_quant_args *a);
int lutra_cpu_dequantize(const lutra_dequant_args *a);
int lutra_cpu_delayed_update(lutra_scale_meta *const *metas, int n);
/* rowwise_cpu.c: the table's quantize_rowwise (lutra/formats.h) */
int lutra_cpu_quantize_rowwise(const lutra_quant_args *a);
/* nvfp4_cpu.c: the table's quantize_nvfp4, and dequantize's NVFP4 case (lutra/nvfp4.h) */
int lutra_cpu_quantize_nvfp4(const lutra_quant_args *a);
int lutra_cpu_dequantize_nvfp4(const lutra_dequant_args *a);
/* rules_cpu.c: the backend table's rules_gather / rules_apply */
int lutra_cpu_rules_gather(lutra_scale_meta *const *metas, int n, float *host);
int lutra_cpu_rules_apply(lutra_scale_meta *const *metas, int n, const float *scales);

/* GEMM through OpenBLAS on f32-upcast operands (gemm_cpu.c) */
int lutra_cpu_gemm_plan(lutra_gemm_plan *p);
void lutra_cpu_gemm_plan_free(lutra_gemm_plan *p);
int lutra_cpu_gemm(const lutra_gemm_args *g);

/* GroupedLinear's grouped quantization and GEMMs: loops over the experts (grouped_cpu.c) */
int lutra_cpu_grouped_quantize(const lutra_grouped_quant_args *a);
int lutra_cpu_grouped_gemm(const lutra_grouped_gemm_args *g);

/* activations and the bias gradient (activation_cpu.c) */
/* tanh GELU and its derivative in f32 (the formulas every GELU of lutra uses) */
float lutra_cpu_gelu(float x);
float lutra_cpu_gelu_grad(float x);
int lutra_cpu_activation_forward(const lutra_act_args *a);
int lutra_cpu_activation_backward(const lutra_act_args *a);
/* The matrix a cast with an activation quantizes (lutra_quant_args.act_kind: the activation's
 * output, or the gradient of its input), [rows, cols] in f32, each value rounded into x_dtype
 * as the activation entries above store it: the input of the fused casts. */
int lutra_cpu_act_matrix(const lutra_quant_args *a, float *out);
int lutra_cpu_bias_grad(const lutra_bias_grad_args *a);

/* LayerNorm and RMSNorm (norm_cpu.c) */
int lutra_cpu_layernorm_forward(const lutra_norm_args *a);
int lutra_cpu_layernorm_backward(const lutra_norm_args *a);
/* the norm writing its output FP8 (norm_quantize_cpu.c) */
int lutra_cpu_norm_quantize(const lutra_norm_quant_args *a);
/* out = a + b element-wise (residual_cpu.c) */
int lutra_cpu_add(const void *a, const void *b, void *out, int dtype, int64_t n);

/* losses (loss_cpu.c) */
int lutra_cpu_mse(const lutra_loss_args *a);
int lutra_cpu_softmax_xent(const lutra_loss_args *a);
/* embedding (embedding_cpu.c) */
int lutra_cpu_embedding_forward(const lutra_embedding_args *a);
int lutra_cpu_embedding_backward(const lutra_embedding_args *a);
int lutra_cpu_embedding_scratch(int64_t n, int64_t vocab, size_t *bytes);
/* rotary position embedding (rope_cpu.c) */
int lutra_cpu_rope(const lutra_rope_args *a);

/* scaled dot-product attention (attention_cpu.c) */
/* a row of len scores' max and sum of exp(s - max): the softmax's log-sum-exp is max + log(sum) */
static inline void lutra_cpu_softmax_sums(const double *s, int64_t len, double *max, double *sum) {
  double m = s[0], e = 0.0;
  for (int64_t j = 1; j < len; j++)
    m = s[j] > m ? s[j] : m;
  for (int64_t j = 0; j < len; j++)
    e += exp(s[j] - m);
  *max = m;
  *sum = e;
}
int lutra_cpu_attention_plan(const lutra_attention_args *a, void **plan, size_t *workspace_bytes,
                             int *deterministic);
void lutra_cpu_attention_plan_free(void *plan);
int lutra_cpu_attention_forward(const lutra_attention_args *a);
int lutra_cpu_attention_backward(const lutra_attention_args *a);
/* FP8 attention's emulation (attention_fp8_cpu.c), called by the two above when a->fp8 */
int lutra_cpu_attention_fp8_forward(const lutra_attention_args *a);
int lutra_cpu_attention_fp8_backward(const lutra_attention_args *a);

/* optimizers (optim_cpu.c) */
int lutra_cpu_sgd_step(const lutra_optim_args *a);
int lutra_cpu_adamw_step(const lutra_optim_args *a);

/* MoE routing (moe_cpu.c) */
int lutra_cpu_moe_topk_forward(const lutra_topk_args *a);
int lutra_cpu_moe_topk_backward(const lutra_topk_args *a);
int lutra_cpu_moe_permute(const lutra_permute_args *a);
int lutra_cpu_moe_permute_backward(const lutra_permute_args *a);
int lutra_cpu_moe_unpermute(const lutra_permute_args *a);
int lutra_cpu_moe_unpermute_backward(const lutra_permute_args *a);

#endif
