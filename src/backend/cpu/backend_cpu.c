/* The CPU backend table and the device lookup every object uses at creation. */
#include "backend/tensor_ops_shared.h"
#include "cpu.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

LUTRA_TENSOR_OPS_DECLARE(lutra_cpu); /* tensor_ops_cpu.c */

/* The quantizers with their bias gradient (lutra_quant_args.dbias): on the CPU the two are one
 * call but two passes; the sum runs in double as lutra_cpu_bias_grad's. A set skip flag skips
 * both. */
static int with_dbias(int st, const lutra_quant_args *a) {
  if (st != LUTRA_OK || !a->dbias || (a->skip && *a->skip)) return st;
  return lutra_cpu_bias_grad(&(lutra_bias_grad_args){.dy = a->x,
                                                     .dtype = a->x_dtype,
                                                     .rows = a->rows,
                                                     .cols = a->cols,
                                                     .db = a->dbias,
                                                     .db_dtype = a->dbias_dtype,
                                                     .accumulate = a->dbias_accumulate,
                                                     .skip = a->skip});
}
/* lutra_quant_args.act: the activation's output or input gradient is formed in f32 first (a
 * grow-once per-thread buffer: the CPU backend is the reference, one pass more is its price),
 * each value rounded as the activation's kernel stores it, then cast and summed like any f32
 * input, so both see the values the unfused composition would (act_out gets them too). */
static _Thread_local struct {
  float *ptr;
  int64_t n;
} act_buf;

/* the buffer is freed when its thread exits (a pthread key's destructor gets the pointer) */
static pthread_once_t act_key_once = PTHREAD_ONCE_INIT;
static pthread_key_t act_key;
static bool act_key_ok;
static void make_act_key(void) {
  act_key_ok = pthread_key_create(&act_key, free) == 0;
}

/* the activation's matrix of a (lutra_cpu_act_matrix) into act_buf */
static int act_values(const lutra_quant_args *a, const char *fn) {
  CHECK_ARG(a->rows >= 0 && a->cols >= 0, "negative shape [%lld, %lld]", (long long)a->rows,
            (long long)a->cols);
  CHECK_FLOAT_DTYPE(a->x_dtype, "input");
  int64_t n = a->rows * a->cols;
  if (n > act_buf.n) {
    float *p = realloc(act_buf.ptr, (size_t)n * sizeof(float));
    if (!p)
      return lutra_error(LUTRA_ENOMEM, fn, "no memory for the activation's values (%lld floats)",
                         (long long)n);
    pthread_once(&act_key_once, make_act_key);
    if (act_key_ok && pthread_setspecific(act_key, p) != 0) {
      free(p);
      act_buf.ptr = NULL;
      act_buf.n = 0;
      return lutra_error(LUTRA_ENOMEM, fn, "cannot register the activation buffer's release");
    }
    act_buf.ptr = p;
    act_buf.n = n;
  }
  return lutra_cpu_act_matrix(a, act_buf.ptr);
}

static int cpu_current_scale(const lutra_current_scale_args *a) {
  return lutra_cpu_current_scale(a->x, a->dtype, a->n, a->fp8_max, a->power_2_scale,
                                 a->amax_epsilon, a->amax, a->scale, a->work, a->skip);
}

static int cpu_current_scale_act(const lutra_current_scale_act_args *c) {
  static const char fn[] = "lutra_cpu_current_scale_act";
  const lutra_quant_args *a = &c->a;
  CHECK_ARG(a->act, "arguments without an activation");
  if (a->skip && *a->skip) return LUTRA_OK;
  TRY(act_values(a, fn));
  return lutra_cpu_current_scale(act_buf.ptr, LUTRA_F32, a->rows * a->cols, c->fp8_max,
                                 a->power_2_scale, a->amax_epsilon, c->amax, c->scale, c->work,
                                 NULL);
}

static int cpu_cast(const lutra_quant_args *a) {
  if (!a || !a->act || (a->skip && *a->skip)) return with_dbias(lutra_cpu_cast(a), a);
  static const char fn[] = "lutra_cpu_cast";
  TRY(act_values(a, fn));
  const int64_t n = a->rows * a->cols;
  if (a->act_out) TRY(lutra_cpu_convert(act_buf.ptr, LUTRA_F32, a->act_out, a->x_dtype, n));
  lutra_quant_args f = *a;
  f.x = act_buf.ptr;
  f.x_dtype = LUTRA_F32;
  f.act = NULL;
  f.act_out = NULL;
  return with_dbias(lutra_cpu_cast(&f), &f);
}
/* an activation inside a cast is the per-tensor casts' (the CUDA block kernels have none) */
static int no_act(const lutra_quant_args *a, const char *fn) {
  if (a && a->act)
    return lutra_error(LUTRA_EUNSUPPORTED, fn,
                       "an activation inside the cast is for per-tensor "
                       "scaling only");
  return LUTRA_OK;
}
static int cpu_quantize_mxfp8(const lutra_quant_args *a) {
  TRY(no_act(a, "lutra_cpu_quantize_mxfp8"));
  return with_dbias(lutra_cpu_quantize_mxfp8(a), a);
}
static int cpu_quantize_block(const lutra_quant_args *a) {
  TRY(no_act(a, "lutra_cpu_quantize_block"));
  return with_dbias(lutra_cpu_quantize_block(a), a);
}

const lutra_backend lutra_cpu_backend = {
    .name = "cpu",
    .device = LUTRA_CPU,
    .alloc = lutra_cpu_alloc,
    .free = lutra_cpu_free,
    .from_host = lutra_cpu_memcpy,
    .to_host = lutra_cpu_memcpy,
    .copy = lutra_cpu_memcpy,
    .memset = lutra_cpu_memset,
    .convert = lutra_cpu_convert,
    .fill = lutra_cpu_fill,
    .amax = lutra_cpu_amax,
    .current_scale = cpu_current_scale,
    .cast = cpu_cast,
    .quantize_mxfp8 = cpu_quantize_mxfp8,
    .quantize_block = cpu_quantize_block,
    .dequantize = lutra_cpu_dequantize,
    .delayed_update = lutra_cpu_delayed_update,
    .gemm_plan = lutra_cpu_gemm_plan,
    .gemm_plan_free = lutra_cpu_gemm_plan_free,
    .gemm = lutra_cpu_gemm,
    .activation_forward = lutra_cpu_activation_forward,
    .activation_backward = lutra_cpu_activation_backward,
    .bias_grad = lutra_cpu_bias_grad,
    .mse = lutra_cpu_mse,
    .softmax_xent = lutra_cpu_softmax_xent,
    .sgd_step = lutra_cpu_sgd_step,
    .adamw_step = lutra_cpu_adamw_step,
    .layernorm_forward = lutra_cpu_layernorm_forward,
    .layernorm_backward = lutra_cpu_layernorm_backward,
    .norm_quantize = lutra_cpu_norm_quantize,
    .add = lutra_cpu_add,
    .axpby = lutra_cpu_axpby,
    .copy_2d = lutra_cpu_copy_2d,
    .rows_argmax = lutra_cpu_rows_argmax,
    .rows_softmax = lutra_cpu_rows_softmax,
    .rows_sample = lutra_cpu_rows_sample,
    .moe_topk_forward = lutra_cpu_moe_topk_forward,
    .moe_topk_backward = lutra_cpu_moe_topk_backward,
    .moe_permute = lutra_cpu_moe_permute,
    .moe_permute_backward = lutra_cpu_moe_permute_backward,
    .moe_unpermute = lutra_cpu_moe_unpermute,
    .moe_unpermute_backward = lutra_cpu_moe_unpermute_backward,
    .grouped_quantize = lutra_cpu_grouped_quantize,
    .grouped_gemm = lutra_cpu_grouped_gemm,
    .current_scale_act = cpu_current_scale_act,
    .rules_gather = lutra_cpu_rules_gather,
    .rules_apply = lutra_cpu_rules_apply,
    .quantize_rowwise = lutra_cpu_quantize_rowwise,
    .quantize_nvfp4 = lutra_cpu_quantize_nvfp4,
    .embedding_forward = lutra_cpu_embedding_forward,
    .embedding_backward = lutra_cpu_embedding_backward,
    .embedding_scratch = lutra_cpu_embedding_scratch,
    .rope = lutra_cpu_rope,
    .attention_plan = lutra_cpu_attention_plan,
    .attention_plan_free = lutra_cpu_attention_plan_free,
    .attention_forward = lutra_cpu_attention_forward,
    .attention_backward = lutra_cpu_attention_backward,
};
