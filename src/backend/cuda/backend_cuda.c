/* The CUDA backend's table: every backend call routed to its kernel launcher (kernels/), to
 * cuBLASLt (gemm_cuda.c), or to the device's memory (memory_cuda.c); each launcher checks
 * what its kernels cannot take and turns the launch status into a lutra status. The device
 * and the threads' streams and scratch are context_cuda.c's. */
#include "cuda_backend.h"

#include "kernels.h"

#include <stdint.h>

/* ---- kernels: each wrapper turns the launch status into a lutra status ------------------ */

#define LAUNCH(name, call) lutra_cuda_status((call), "lutra_cuda_" #name, "kernel " #name)

static int k_convert(const void *src, int sd, void *dst, int dd, int64_t n) {
  return LAUNCH(convert, lk_convert(src, sd, dst, dd, n, lutra_cuda_stream()));
}
static int k_fill(void *dst, int dtype, int64_t n, float v) {
  return LAUNCH(fill, lk_fill(dst, dtype, n, v, lutra_cuda_stream()));
}
static int k_amax(const void *x, int dtype, int64_t n, float *amax) {
  return LAUNCH(amax, lk_amax(x, dtype, n, amax, lutra_cuda_stream()));
}
static int k_current_scale(const void *x, int dtype, int64_t n, float fp8_max, int pow2, float eps,
                           float *amax, float *scale, uint32_t *work, const int32_t *skip) {
  return LAUNCH(current_scale, lk_current_scale(x, dtype, n, fp8_max, pow2, eps, amax, scale, work,
                                                skip, lutra_cuda_stream()));
}
typedef cudaError_t (*quantize_launcher)(const lutra_quant_args *, cudaStream_t);

/* A quantization with its bias gradient: fused into the tiled kernel when it writes a
 * columnwise output (the kernel reads every column there anyway), else a bias-gradient kernel
 * after the quantization. */
static int quantize_with_dbias(quantize_launcher launch, bool can_fuse, const lutra_quant_args *a,
                               const char *name) {
  if (!a->dbias) return lutra_cuda_status(launch(a, lutra_cuda_stream()), name, "kernel");
  lutra_quant_args q = *a;
  if (can_fuse && a->col_data && a->rows > 0 && a->cols > 0) {
    TRY(lutra_cuda_dbias_scratch(a->rows, a->cols, &q));
    return lutra_cuda_status(launch(&q, lutra_cuda_stream()), name, "kernel with dbias");
  }
  q.dbias = NULL;
  TRY(lutra_cuda_status(launch(&q, lutra_cuda_stream()), name, "kernel"));
  const lutra_bias_grad_args b = {.dy = a->x,
                                  .dtype = a->x_dtype,
                                  .rows = a->rows,
                                  .cols = a->cols,
                                  .db = a->dbias,
                                  .db_dtype = a->dbias_dtype,
                                  .accumulate = a->dbias_accumulate,
                                  .skip = a->skip};
  return LAUNCH(bias_grad, lk_bias_grad(&b, lutra_cuda_reduce_scratch(), lutra_cuda_stream()));
}

/* an activation inside the cast (lutra_quant_args.act) is the per-tensor casts' (the block
 * kernels read no activation); its bias gradient comes from the tiled kernel's columnwise pass */
static int check_cast_act(const lutra_quant_args *a, bool per_tensor, const char *fn) {
  if (!a || !a->act) return LUTRA_OK;
  if (!per_tensor)
    return lutra_error(LUTRA_EUNSUPPORTED, fn,
                       "an activation inside the cast is for per-tensor scaling only");
  if (a->dbias && !a->col_data)
    return lutra_error(LUTRA_EUNSUPPORTED, fn,
                       "an activation's bias gradient inside the cast needs a columnwise output");
  return LUTRA_OK;
}
static int k_current_scale_act(const lutra_quant_args *a, float fp8_max, float *amax, float *scale,
                               uint32_t *work) {
  return LAUNCH(current_scale_act,
                lk_current_scale_act(a, fp8_max, amax, scale, work, lutra_cuda_stream()));
}
static int k_cast(const lutra_quant_args *a) {
  TRY(check_cast_act(a, true, "lutra_cuda_cast"));
  return quantize_with_dbias(lk_cast, true, a, "lutra_cuda_cast");
}
static int k_mxfp8(const lutra_quant_args *a) {
  TRY(check_cast_act(a, false, "lutra_cuda_quantize_mxfp8"));
  return quantize_with_dbias(lk_quantize_mxfp8, true, a, "lutra_cuda_quantize_mxfp8");
}
static int k_block(const lutra_quant_args *a) {
  TRY(check_cast_act(a, false, "lutra_cuda_quantize_block"));
  return quantize_with_dbias(lk_quantize_block, false, a, "lutra_cuda_quantize_block");
}
static int k_dequantize(const lutra_dequant_args *a) {
  return LAUNCH(dequantize, lk_dequantize(a, lutra_cuda_stream()));
}
static int k_nvfp4(const lutra_quant_args *a) {
  return LAUNCH(quantize_nvfp4, lk_quantize_nvfp4(a, lutra_cuda_stream()));
}
static int k_rowwise(const lutra_quant_args *a) {
  static const char fn[] = "lutra_cuda_quantize_rowwise";
  CHECK_ARG(a, "arguments are NULL");
  CHECK_ARG(!a->dbias && !a->act, "rowwise scaling fuses no bias gradient or GELU gradient");
  CHECK_ARG(!a->col_data || (a->rows + 63) / 64 <= 0xFFFF,
            "%lld rows are more than the columnwise copy's kernels take (4194240)",
            (long long)a->rows);
  return LAUNCH(quantize_rowwise, lk_quantize_rowwise(a, lutra_cuda_stream()));
}
static int k_delayed_update(lutra_scale_meta *const *metas, int n) {
  return LAUNCH(delayed_update, lk_delayed_update(metas, n, lutra_cuda_stream()));
}
/* The kernels answer an unknown kind with cudaErrorInvalidValue only; the message is given
 * here, where it can say which kind. */
static int check_act(const lutra_act_args *a, const char *fn) {
  CHECK_ARG(a != NULL, "arguments are NULL");
  if (a->act <= LUTRA_ACT_NONE || a->act >= LUTRA_ACT_COUNT)
    return lutra_error(LUTRA_EINVAL, fn, "unknown activation kind %d (expected 1..%d)", (int)a->act,
                       LUTRA_ACT_COUNT - 1);
  if (lutra_act_is_gated(a->act))
    CHECK_ARG(a->rows >= 0 && a->cols >= 0 && a->cols % 2 == 0,
              "gated activation input [%lld, %lld]: the last dim must be even (2h)",
              (long long)a->rows, (long long)a->cols);
  return LUTRA_OK;
}
static int k_activation_forward(const lutra_act_args *a) {
  TRY(check_act(a, "lutra_cuda_activation_forward"));
  return LAUNCH(activation_forward, lk_activation_forward(a, lutra_cuda_stream()));
}
static int k_activation_backward(const lutra_act_args *a) {
  TRY(check_act(a, "lutra_cuda_activation_backward"));
  return LAUNCH(activation_backward, lk_activation_backward(a, lutra_cuda_stream()));
}
static int k_bias_grad(const lutra_bias_grad_args *a) {
  return LAUNCH(bias_grad, lk_bias_grad(a, lutra_cuda_reduce_scratch(), lutra_cuda_stream()));
}
static int k_mse(const lutra_loss_args *a) {
  return LAUNCH(mse, lk_mse(a, lutra_cuda_reduce_scratch(), lutra_cuda_stream()));
}
static int k_xent(const lutra_loss_args *a) {
  return LAUNCH(softmax_xent, lk_softmax_xent(a, lutra_cuda_reduce_scratch(), lutra_cuda_stream()));
}
static int k_sgd(const lutra_optim_args *a) {
  return LAUNCH(sgd_step, lk_sgd_step(a, lutra_cuda_stream()));
}
static int k_adamw(const lutra_optim_args *a) {
  return LAUNCH(adamw_step, lk_adamw_step(a, lutra_cuda_stream()));
}

/* norms: the kernels' limits are refused here with a message (kernels.h) */
static int check_norm(const lutra_norm_args *a, const char *fn) {
  CHECK_ARG(a != NULL, "arguments are NULL");
  CHECK_ARG(a->hidden > 0 && 2 * a->hidden <= LK_BIAS_PARTIALS,
            "hidden %lld is outside the kernels' range 1..%d", (long long)a->hidden,
            LK_BIAS_PARTIALS / 2);
  CHECK_ARG(a->rows >= 0 && a->rows <= 0x7FFFFFFF, "%lld rows (one block per row: at most 2^31-1)",
            (long long)a->rows);
  return LUTRA_OK;
}
static int k_layernorm_forward(const lutra_norm_args *a) {
  TRY(check_norm(a, "lutra_cuda_layernorm_forward"));
  return LAUNCH(layernorm_forward, lk_layernorm_forward(a, lutra_cuda_stream()));
}
static int k_layernorm_backward(const lutra_norm_args *a) {
  TRY(check_norm(a, "lutra_cuda_layernorm_backward"));
  return LAUNCH(layernorm_backward,
                lk_layernorm_backward(a, lutra_cuda_reduce_scratch(), lutra_cuda_stream()));
}

static int k_norm_quantize(const lutra_norm_quant_args *a) {
  static const char fn[] = "lutra_cuda_norm_quantize";
  CHECK_ARG(a != NULL, "arguments are NULL");
  TRY(check_norm(&a->norm, fn));
  CHECK_ARG(a->scaling == LUTRA_SCALING_TENSOR || a->scaling == LUTRA_SCALING_MXFP8 ||
                a->scaling == LUTRA_SCALING_BLOCK_1D,
            "scaling %d is not tensor, mxfp8 or block_1d", (int)a->scaling);
  CHECK_ARG(a->quant.out_dtype == LUTRA_E4M3 || a->quant.out_dtype == LUTRA_E5M2,
            "output dtype %d is not e4m3 or e5m2", (int)a->quant.out_dtype);
  if (a->norm.rstd || !lk_norm_quantize_tiles(a))
    return LAUNCH(norm_quantize, lk_norm_quantize(a, lutra_cuda_stream()));
  /* no statistics kept (an inference forward, lutra_norm_quantize): the tile path (the statistics
   * first, then the quantizer's tile kernels) wants them somewhere */
  lutra_norm_quant_args with = *a;
  TRY(lutra_cuda_norm_stats_scratch(a->norm.rows, &with.norm.mean, &with.norm.rstd));
  if (a->norm.rms) with.norm.mean = NULL;
  return LAUNCH(norm_quantize, lk_norm_quantize(&with, lutra_cuda_stream()));
}

static int k_add(const void *a, const void *b, void *out, int dtype, int64_t n) {
  return LAUNCH(add, lk_add(a, b, out, dtype, n, lutra_cuda_stream()));
}

/* MoE routing: the kernels' limits are refused here with a message (kernels.h) */
static int check_topk(const lutra_topk_args *a, const char *fn) {
  CHECK_ARG(a != NULL, "arguments are NULL");
  CHECK_ARG(lutra_dtype_is_float(a->dtype), "logits dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(a->dtype));
  CHECK_ARG(a->tokens > 0 && a->experts > 0 && a->experts <= LUTRA_MOE_MAX_EXPERTS,
            "logits [%lld, %lld]: tokens must be positive, experts in 1..%d", (long long)a->tokens,
            (long long)a->experts, LUTRA_MOE_MAX_EXPERTS);
  CHECK_ARG(a->k >= 1 && a->k <= LUTRA_MOE_MAX_K && a->k <= a->experts,
            "k = %d is outside 1..min(%d, experts)", (int)a->k, LUTRA_MOE_MAX_K);
  return LUTRA_OK;
}
static int check_permute(const lutra_permute_args *a, const char *fn) {
  CHECK_ARG(a != NULL, "arguments are NULL");
  CHECK_ARG(lutra_dtype_is_float(a->dtype), "rows dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(a->dtype));
  CHECK_ARG(a->tokens > 0 && a->k > 0 && a->hidden > 0 && a->tokens * a->k <= 0x7FFFFFFF,
            "tokens %lld, k %d, hidden %lld: all positive, tokens * k at most 2^31-1",
            (long long)a->tokens, (int)a->k, (long long)a->hidden);
  CHECK_ARG(a->experts >= 1 && a->experts <= LUTRA_MOE_MAX_EXPERTS, "experts = %d is outside 1..%d",
            (int)a->experts, LUTRA_MOE_MAX_EXPERTS);
  return LUTRA_OK;
}
static int k_moe_topk_forward(const lutra_topk_args *a) {
  TRY(check_topk(a, "lutra_cuda_moe_topk_forward"));
  return LAUNCH(moe_topk_forward, lk_moe_topk_forward(a, lutra_cuda_stream()));
}
static int k_moe_topk_backward(const lutra_topk_args *a) {
  TRY(check_topk(a, "lutra_cuda_moe_topk_backward"));
  return LAUNCH(moe_topk_backward, lk_moe_topk_backward(a, lutra_cuda_stream()));
}
static int k_moe_permute(const lutra_permute_args *a) {
  static const char fn[] = "lutra_cuda_moe_permute";
  TRY(check_permute(a, fn));
  CHECK_ARG(a->bad_index && a->scratch && a->m_splits && a->indices,
            "indices, m_splits, scratch and the bad-index flag must not be NULL");
  return LAUNCH(moe_permute, lk_moe_permute(a, lutra_cuda_stream()));
}
static int k_moe_permute_backward(const lutra_permute_args *a) {
  TRY(check_permute(a, "lutra_cuda_moe_permute_backward"));
  return LAUNCH(moe_permute_backward, lk_moe_permute_backward(a, lutra_cuda_stream()));
}
static int k_moe_unpermute(const lutra_permute_args *a) {
  TRY(check_permute(a, "lutra_cuda_moe_unpermute"));
  return LAUNCH(moe_unpermute, lk_moe_unpermute(a, lutra_cuda_stream()));
}
static int k_moe_unpermute_backward(const lutra_permute_args *a) {
  TRY(check_permute(a, "lutra_cuda_moe_unpermute_backward"));
  return LAUNCH(moe_unpermute_backward, lk_moe_unpermute_backward(a, lutra_cuda_stream()));
}

const lutra_backend lutra_cuda_table = {
    .name = "cuda",
    .device = LUTRA_CUDA,
    .alloc = lutra_cuda_alloc,
    .free = lutra_cuda_free,
    .from_host = lutra_cuda_from_host,
    .to_host = lutra_cuda_to_host,
    .copy = lutra_cuda_copy,
    .memset = lutra_cuda_memset,
    .convert = k_convert,
    .fill = k_fill,
    .amax = k_amax,
    .current_scale = k_current_scale,
    .current_scale_act = k_current_scale_act,
    .cast = k_cast,
    .quantize_mxfp8 = k_mxfp8,
    .quantize_block = k_block,
    .dequantize = k_dequantize,
    .delayed_update = k_delayed_update,
    .gemm_plan = lutra_cuda_gemm_plan,
    .gemm_plan_free = lutra_cuda_gemm_plan_free,
    .gemm = lutra_cuda_gemm,
    .gemm_workspace = lutra_cuda_workspace,
    .activation_forward = k_activation_forward,
    .activation_backward = k_activation_backward,
    .bias_grad = k_bias_grad,
    .mse = k_mse,
    .softmax_xent = k_xent,
    .sgd_step = k_sgd,
    .adamw_step = k_adamw,
    .layernorm_forward = k_layernorm_forward,
    .layernorm_backward = k_layernorm_backward,
    .moe_topk_forward = k_moe_topk_forward,
    .moe_topk_backward = k_moe_topk_backward,
    .moe_permute = k_moe_permute,
    .moe_permute_backward = k_moe_permute_backward,
    .moe_unpermute = k_moe_unpermute,
    .moe_unpermute_backward = k_moe_unpermute_backward,
    .synchronize = lutra_cuda_sync,
    .capture_begin = lutra_cuda_capture_begin,
    .capture_end = lutra_cuda_capture_end,
    .capture_abort = lutra_cuda_capture_abort,
    .graph_launch = lutra_cuda_graph_launch,
    .graph_destroy = lutra_cuda_graph_destroy,
    .norm_quantize = k_norm_quantize,
    .add = k_add,
    .grouped_quantize = lutra_cuda_grouped_quantize,
    .grouped_gemm = lutra_cuda_grouped_gemm,
    .call_graphs_free = lutra_cuda_call_graphs_free,
    .from_host_async = lutra_cuda_from_host_async,
    .rules_gather = lutra_cuda_rules_gather,
    .rules_apply = lutra_cuda_rules_apply,
    .quantize_nvfp4 = k_nvfp4,
    .quantize_rowwise = k_rowwise,
};
