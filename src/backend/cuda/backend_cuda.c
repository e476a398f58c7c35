/* The CUDA backend's table: every backend call routed to its kernel launcher (kernels/), to
 * cuBLASLt (gemm_cuda.c), or to the device's memory (memory_cuda.c); each launcher checks
 * what its kernels cannot take and turns the launch status into a lutra status. The device
 * and the threads' streams and scratch are context_cuda.c's. */
#include "cuda_backend.h"

#include "backend/tensor_ops_shared.h"
#include "kernels.h"

#include <stdint.h>
#include <string.h>

LUTRA_TENSOR_OPS_DECLARE(lutra_cuda); /* tensor_ops_cuda.c */

/* ---- kernels: each wrapper turns the launch status into a lutra status ------------------ */

#define LAUNCH(name, call) lutra_cuda_status((call), "lutra_cuda_" #name, "kernel " #name)

/* A launcher's call is run through its cached graph (call_graphs.c): key and context are one
 * struct holding everything the launches bake in, the arguments as given and the stream; the
 * stream's scratch lives in the stream's state, as the cache does, so it is the same for every
 * call a cache sees. backend.h's argument structs have no padding bytes, and neither have the
 * structs here (-Wpadded checks both): two calls with equal bytes issue equal launches. */
#define CACHED(launcher, call, issue, name)                                                        \
  lutra_call_graphs_run(lutra_cuda_launch_graphs(launcher, lutra_call_graphs_free),                \
                        LUTRA_CALLS_KERNEL, &(call), sizeof(call), (call).stream, issue, &(call),  \
                        name)

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wpadded"
#endif
typedef struct convert_call {
  const void *src;
  void *dst;
  int32_t src_dtype, dst_dtype;
  int64_t n;
  cudaStream_t stream;
} convert_call;
typedef struct fill_call {
  void *dst;
  int32_t dtype;
  float value;
  int64_t n;
  cudaStream_t stream;
} fill_call;
typedef struct amax_call {
  const void *x;
  float *amax;
  int32_t dtype, pad;
  int64_t n;
  cudaStream_t stream;
} amax_call;
typedef struct add_call {
  const void *a, *b;
  void *out;
  int32_t dtype, pad;
  int64_t n;
  cudaStream_t stream;
} add_call;
typedef cudaError_t (*quantize_launcher)(const lutra_quant_args *, cudaStream_t);
typedef struct quantize_call {
  lutra_quant_args a;
  quantize_launcher launch;
  const char *name;
  int32_t fused_dbias; /* the bias gradient inside the tiled kernel (else a kernel after it) */
  int32_t pad;
  cudaStream_t stream;
} quantize_call;
/* the launchers whose only argument is one of backend.h's structs */
#define ARGS_CALL(args_type)                                                                       \
  typedef struct args_type##_call {                                                                \
    args_type a;                                                                                   \
    cudaStream_t stream;                                                                           \
  } args_type##_call
ARGS_CALL(lutra_quant_args);
ARGS_CALL(lutra_current_scale_args);
ARGS_CALL(lutra_current_scale_act_args);
ARGS_CALL(lutra_dequant_args);
ARGS_CALL(lutra_act_args);
ARGS_CALL(lutra_bias_grad_args);
ARGS_CALL(lutra_loss_args);
ARGS_CALL(lutra_norm_args);
ARGS_CALL(lutra_norm_quant_args);
ARGS_CALL(lutra_topk_args);
ARGS_CALL(lutra_permute_args);
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/* A cached launcher over one struct: issue_<name> launches lk_<name>(&a, stream), or with the
 * stream's reduction scratch lk_<name>(&a, scratch, stream) */
#define ISSUE_ARGS(name, args_type)                                                                \
  static int issue_##name(void *p) {                                                               \
    const args_type##_call *c = p;                                                                 \
    return LAUNCH(name, lk_##name(&c->a, c->stream));                                              \
  }
#define ISSUE_ARGS_SCRATCH(name, args_type)                                                        \
  static int issue_##name(void *p) {                                                               \
    const args_type##_call *c = p;                                                                 \
    return LAUNCH(name, lk_##name(&c->a, lutra_cuda_reduce_scratch(), c->stream));                 \
  }
#define RUN_ARGS(launcher, name, args_type, args)                                                  \
  do {                                                                                             \
    args_type##_call call = {.a = *(args), .stream = lutra_cuda_stream()};                         \
    return CACHED(launcher, call, issue_##name, "lutra_cuda_" #name);                              \
  } while (0)

static int issue_convert(void *p) {
  const convert_call *c = p;
  return LAUNCH(convert, lk_convert(c->src, c->src_dtype, c->dst, c->dst_dtype, c->n, c->stream));
}
static int k_convert(const void *src, int sd, void *dst, int dd, int64_t n) {
  convert_call c = {src, dst, sd, dd, n, lutra_cuda_stream()};
  return CACHED(LUTRA_LAUNCH_CONVERT, c, issue_convert, "lutra_cuda_convert");
}
static int issue_fill(void *p) {
  const fill_call *c = p;
  return LAUNCH(fill, lk_fill(c->dst, c->dtype, c->n, c->value, c->stream));
}
static int k_fill(void *dst, int dtype, int64_t n, float v) {
  fill_call c = {dst, dtype, v, n, lutra_cuda_stream()};
  return CACHED(LUTRA_LAUNCH_FILL, c, issue_fill, "lutra_cuda_fill");
}
static int issue_amax(void *p) {
  const amax_call *c = p;
  return LAUNCH(amax, lk_amax(c->x, c->dtype, c->n, c->amax, c->stream));
}
static int k_amax(const void *x, int dtype, int64_t n, float *amax) {
  amax_call c = {x, amax, dtype, 0, n, lutra_cuda_stream()};
  return CACHED(LUTRA_LAUNCH_AMAX, c, issue_amax, "lutra_cuda_amax");
}
static int issue_current_scale(void *p) {
  const lutra_current_scale_args *a = &((const lutra_current_scale_args_call *)p)->a;
  return LAUNCH(current_scale,
                lk_current_scale(a->x, a->dtype, a->n, a->fp8_max, a->power_2_scale,
                                 a->amax_epsilon, a->amax, a->scale, a->work, a->skip,
                                 ((const lutra_current_scale_args_call *)p)->stream));
}
static int k_current_scale(const lutra_current_scale_args *a) {
  RUN_ARGS(LUTRA_LAUNCH_CURRENT_SCALE, current_scale, lutra_current_scale_args, a);
}

/* A quantization and, when unfused, its bias gradient after it: one graph for both */
static int issue_quantize(void *p) {
  const quantize_call *c = p;
  if (!c->a.dbias || c->fused_dbias)
    return lutra_cuda_status(c->launch(&c->a, c->stream), c->name,
                             c->a.dbias ? "kernel with dbias" : "kernel");
  lutra_quant_args q = c->a;
  q.dbias = NULL;
  TRY(lutra_cuda_status(c->launch(&q, c->stream), c->name, "kernel"));
  const lutra_bias_grad_args b = {.dy = q.x,
                                  .dtype = q.x_dtype,
                                  .rows = q.rows,
                                  .cols = q.cols,
                                  .db = c->a.dbias,
                                  .db_dtype = q.dbias_dtype,
                                  .accumulate = q.dbias_accumulate,
                                  .skip = q.skip};
  return LAUNCH(bias_grad, lk_bias_grad(&b, lutra_cuda_reduce_scratch(), c->stream));
}

/* A quantization with its bias gradient: fused into the tiled kernel when it writes a
 * columnwise output (the kernel reads every column there anyway), else a bias-gradient kernel
 * after the quantization. The fused kernel's scratch is taken before the call's key. */
static int quantize_with_dbias(int launcher, quantize_launcher launch, bool can_fuse,
                               const lutra_quant_args *a, const char *name) {
  quantize_call c = {.a = *a, .launch = launch, .name = name, .stream = lutra_cuda_stream()};
  if (a->dbias && can_fuse && a->col_data && a->rows > 0 && a->cols > 0) {
    TRY(lutra_cuda_dbias_scratch(a->rows, a->cols, &c.a));
    c.fused_dbias = 1;
  }
  return CACHED(launcher, c, issue_quantize, name);
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
static int issue_current_scale_act(void *p) {
  const lutra_current_scale_act_args *c = &((const lutra_current_scale_act_args_call *)p)->a;
  return LAUNCH(current_scale_act,
                lk_current_scale_act(&c->a, c->fp8_max, c->amax, c->scale, c->work,
                                     ((const lutra_current_scale_act_args_call *)p)->stream));
}
static int k_current_scale_act(const lutra_current_scale_act_args *a) {
  RUN_ARGS(LUTRA_LAUNCH_CURRENT_SCALE_ACT, current_scale_act, lutra_current_scale_act_args, a);
}
static int k_cast(const lutra_quant_args *a) {
  TRY(check_cast_act(a, true, "lutra_cuda_cast"));
  return quantize_with_dbias(LUTRA_LAUNCH_CAST, lk_cast, true, a, "lutra_cuda_cast");
}
static int k_mxfp8(const lutra_quant_args *a) {
  TRY(check_cast_act(a, false, "lutra_cuda_quantize_mxfp8"));
  return quantize_with_dbias(LUTRA_LAUNCH_MXFP8, lk_quantize_mxfp8, true, a,
                             "lutra_cuda_quantize_mxfp8");
}
static int k_block(const lutra_quant_args *a) {
  TRY(check_cast_act(a, false, "lutra_cuda_quantize_block"));
  return quantize_with_dbias(LUTRA_LAUNCH_BLOCK, lk_quantize_block, false, a,
                             "lutra_cuda_quantize_block");
}
ISSUE_ARGS(dequantize, lutra_dequant_args)
static int k_dequantize(const lutra_dequant_args *a) {
  RUN_ARGS(LUTRA_LAUNCH_DEQUANTIZE, dequantize, lutra_dequant_args, a);
}
/* NVFP4's stochastic rounding takes a new seed every call: no two calls are alike, none cached */
static int k_nvfp4(const lutra_quant_args *a) {
  return LAUNCH(quantize_nvfp4, lk_quantize_nvfp4(a, lutra_cuda_stream()));
}
ISSUE_ARGS(quantize_rowwise, lutra_quant_args)
static int k_rowwise(const lutra_quant_args *a) {
  static const char fn[] = "lutra_cuda_quantize_rowwise";
  CHECK_ARG(a, "arguments are NULL");
  CHECK_ARG(!a->dbias && !a->act, "rowwise scaling fuses no bias gradient or GELU gradient");
  CHECK_ARG(!a->col_data || (a->rows + 63) / 64 <= 0xFFFF,
            "%lld rows are more than the columnwise copy's kernels take (4194240)",
            (long long)a->rows);
  RUN_ARGS(LUTRA_LAUNCH_ROWWISE, quantize_rowwise, lutra_quant_args, a);
}
/* The scope's delayed-scaling update reads its host metas into the kernel's parameters, so its
 * key is what it reads of each (kernels/quantize.cu's DelayedMeta: keep the two alike): up to
 * DELAYED_KEY_METAS metas in one cache, up to DELAYED_WIDE_METAS (a GroupedLinear of 64 experts
 * has 128 in its forward) in another, whose 4 KB keys are built, hashed and compared per call
 * in place of a launch carrying as many bytes of parameters; a longer list (a large model's)
 * runs directly, its launches one per 768 metas. */
enum { DELAYED_KEY_METAS = 16, DELAYED_WIDE_METAS = 128 };
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wpadded"
#endif
typedef struct delayed_meta_key {
  float *scale, *scale_inv, *history;
  int32_t history_len, algo;
  float fp8_max;
  int32_t margin;
} delayed_meta_key;
typedef struct delayed_head {
  lutra_scale_meta *const *metas; /* not in the key: read only while the call is issued */
  cudaStream_t stream;
  int32_t n, pad;
} delayed_head;
typedef struct delayed_call {
  delayed_head h;
  delayed_meta_key m[DELAYED_KEY_METAS];
} delayed_call;
typedef struct delayed_wide_call {
  delayed_head h;
  delayed_meta_key m[DELAYED_WIDE_METAS];
} delayed_wide_call;
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
static int issue_delayed_update(void *p) {
  const delayed_head *h = p;
  return LAUNCH(delayed_update, lk_delayed_update(h->metas, h->n, h->stream));
}
/* the key's entries of metas[0..n) (the rest of m stays zero), false where one is NULL */
static bool delayed_keys(lutra_scale_meta *const *metas, int n, delayed_meta_key *m) {
  for (int j = 0; j < n; j++) {
    const lutra_scale_meta *x = metas[j];
    if (!x) return false;
    m[j] = (delayed_meta_key){x->scale,       x->scale_inv,         x->amax_history,
                              x->history_len, x->amax_compute_algo, x->fp8_max,
                              x->margin};
  }
  return true;
}
/* the call keyed by key (key_bytes, whose head holds no metas pointer: two lists of equal
 * contents are the same call), issued with metas */
static int run_delayed(int launcher, delayed_head *key, size_t key_bytes,
                       lutra_scale_meta *const *metas) {
  delayed_head ctx = {.metas = metas, .stream = key->stream, .n = key->n};
  return lutra_call_graphs_run(lutra_cuda_launch_graphs(launcher, lutra_call_graphs_free),
                               LUTRA_CALLS_KERNEL, key, key_bytes, key->stream,
                               issue_delayed_update, &ctx, "lutra_cuda_delayed_update");
}
static int k_delayed_update(lutra_scale_meta *const *metas, int n) {
  const cudaStream_t s = lutra_cuda_stream();
  if (n <= 0 || n > DELAYED_WIDE_METAS || !metas)
    return LAUNCH(delayed_update, lk_delayed_update(metas, n, s));
  if (n <= DELAYED_KEY_METAS) {
    delayed_call c = {.h = {.stream = s, .n = n}};
    if (!delayed_keys(metas, n, c.m)) /* it refuses */
      return LAUNCH(delayed_update, lk_delayed_update(metas, n, s));
    return run_delayed(LUTRA_LAUNCH_DELAYED_UPDATE, &c.h, sizeof c, metas);
  }
  delayed_wide_call c;
  c.h = (delayed_head){.stream = s, .n = n};
  memset(c.m + n, 0, (size_t)(DELAYED_WIDE_METAS - n) * sizeof *c.m);
  if (!delayed_keys(metas, n, c.m)) return LAUNCH(delayed_update, lk_delayed_update(metas, n, s));
  return run_delayed(LUTRA_LAUNCH_DELAYED_UPDATE_WIDE, &c.h, sizeof c, metas);
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
ISSUE_ARGS(activation_forward, lutra_act_args)
ISSUE_ARGS(activation_backward, lutra_act_args)
static int k_activation_forward(const lutra_act_args *a) {
  TRY(check_act(a, "lutra_cuda_activation_forward"));
  RUN_ARGS(LUTRA_LAUNCH_ACT_FORWARD, activation_forward, lutra_act_args, a);
}
static int k_activation_backward(const lutra_act_args *a) {
  TRY(check_act(a, "lutra_cuda_activation_backward"));
  RUN_ARGS(LUTRA_LAUNCH_ACT_BACKWARD, activation_backward, lutra_act_args, a);
}
ISSUE_ARGS_SCRATCH(bias_grad, lutra_bias_grad_args)
static int k_bias_grad(const lutra_bias_grad_args *a) {
  RUN_ARGS(LUTRA_LAUNCH_BIAS_GRAD, bias_grad, lutra_bias_grad_args, a);
}
ISSUE_ARGS_SCRATCH(mse, lutra_loss_args)
ISSUE_ARGS_SCRATCH(softmax_xent, lutra_loss_args)
static int k_mse(const lutra_loss_args *a) {
  RUN_ARGS(LUTRA_LAUNCH_MSE, mse, lutra_loss_args, a);
}
static int k_xent(const lutra_loss_args *a) {
  RUN_ARGS(LUTRA_LAUNCH_XENT, softmax_xent, lutra_loss_args, a);
}
/* not cached: the launches read the host arrays of tensor pointers they are given */
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
ISSUE_ARGS(layernorm_forward, lutra_norm_args)
ISSUE_ARGS_SCRATCH(layernorm_backward, lutra_norm_args)
static int k_layernorm_forward(const lutra_norm_args *a) {
  TRY(check_norm(a, "lutra_cuda_layernorm_forward"));
  RUN_ARGS(LUTRA_LAUNCH_NORM_FORWARD, layernorm_forward, lutra_norm_args, a);
}
static int k_layernorm_backward(const lutra_norm_args *a) {
  TRY(check_norm(a, "lutra_cuda_layernorm_backward"));
  RUN_ARGS(LUTRA_LAUNCH_NORM_BACKWARD, layernorm_backward, lutra_norm_args, a);
}

ISSUE_ARGS(norm_quantize, lutra_norm_quant_args)
static int k_norm_quantize(const lutra_norm_quant_args *a) {
  static const char fn[] = "lutra_cuda_norm_quantize";
  CHECK_ARG(a != NULL, "arguments are NULL");
  TRY(check_norm(&a->norm, fn));
  CHECK_ARG(a->scaling == LUTRA_SCALING_TENSOR || a->scaling == LUTRA_SCALING_MXFP8 ||
                a->scaling == LUTRA_SCALING_BLOCK_1D,
            "scaling %d is not tensor, mxfp8 or block_1d", (int)a->scaling);
  CHECK_ARG(a->quant.out_dtype == LUTRA_E4M3 || a->quant.out_dtype == LUTRA_E5M2,
            "output dtype %d is not e4m3 or e5m2", (int)a->quant.out_dtype);
  lutra_norm_quant_args with = *a;
  if (!a->norm.rstd && lk_norm_quantize_tiles(a)) {
    /* no statistics kept (an inference forward, lutra_norm_quantize): the tile path (the
     * statistics first, then the quantizer's tile kernels) wants them somewhere */
    TRY(lutra_cuda_norm_stats_scratch(a->norm.rows, &with.norm.mean, &with.norm.rstd));
    if (a->norm.rms) with.norm.mean = NULL;
  }
  RUN_ARGS(LUTRA_LAUNCH_NORM_QUANTIZE, norm_quantize, lutra_norm_quant_args, &with);
}

static int issue_add(void *p) {
  const add_call *c = p;
  return LAUNCH(add, lk_add(c->a, c->b, c->out, c->dtype, c->n, c->stream));
}
static int k_add(const void *a, const void *b, void *out, int dtype, int64_t n) {
  add_call c = {a, b, out, dtype, 0, n, lutra_cuda_stream()};
  return CACHED(LUTRA_LAUNCH_ADD, c, issue_add, "lutra_cuda_add");
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
ISSUE_ARGS(moe_topk_forward, lutra_topk_args)
ISSUE_ARGS(moe_topk_backward, lutra_topk_args)
ISSUE_ARGS(moe_permute, lutra_permute_args)
ISSUE_ARGS(moe_permute_backward, lutra_permute_args)
ISSUE_ARGS(moe_unpermute, lutra_permute_args)
ISSUE_ARGS(moe_unpermute_backward, lutra_permute_args)
static int k_moe_topk_forward(const lutra_topk_args *a) {
  TRY(check_topk(a, "lutra_cuda_moe_topk_forward"));
  RUN_ARGS(LUTRA_LAUNCH_TOPK_FORWARD, moe_topk_forward, lutra_topk_args, a);
}
static int k_moe_topk_backward(const lutra_topk_args *a) {
  TRY(check_topk(a, "lutra_cuda_moe_topk_backward"));
  RUN_ARGS(LUTRA_LAUNCH_TOPK_BACKWARD, moe_topk_backward, lutra_topk_args, a);
}
static int k_moe_permute(const lutra_permute_args *a) {
  static const char fn[] = "lutra_cuda_moe_permute";
  TRY(check_permute(a, fn));
  CHECK_ARG(a->bad_index && a->scratch && a->m_splits && a->indices,
            "indices, m_splits, scratch and the bad-index flag must not be NULL");
  RUN_ARGS(LUTRA_LAUNCH_PERMUTE, moe_permute, lutra_permute_args, a);
}
static int k_moe_permute_backward(const lutra_permute_args *a) {
  TRY(check_permute(a, "lutra_cuda_moe_permute_backward"));
  RUN_ARGS(LUTRA_LAUNCH_PERMUTE_BACKWARD, moe_permute_backward, lutra_permute_args, a);
}
static int k_moe_unpermute(const lutra_permute_args *a) {
  TRY(check_permute(a, "lutra_cuda_moe_unpermute"));
  RUN_ARGS(LUTRA_LAUNCH_UNPERMUTE, moe_unpermute, lutra_permute_args, a);
}
static int k_moe_unpermute_backward(const lutra_permute_args *a) {
  TRY(check_permute(a, "lutra_cuda_moe_unpermute_backward"));
  RUN_ARGS(LUTRA_LAUNCH_UNPERMUTE_BACKWARD, moe_unpermute_backward, lutra_permute_args, a);
}

/* the thread's current stream, the key of per-stream buffers above the backend */
static const void *stream_key(void) {
  return (const void *)lutra_cuda_stream();
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
    .axpby = lutra_cuda_axpby,
    .copy_2d = lutra_cuda_copy_2d,
    .rows_argmax = lutra_cuda_rows_argmax,
    .rows_softmax = lutra_cuda_rows_softmax,
    .rows_sample = lutra_cuda_rows_sample,
    .grouped_quantize = lutra_cuda_grouped_quantize,
    .grouped_gemm = lutra_cuda_grouped_gemm,
    .embedding_forward = lutra_cuda_embedding_forward,
    .embedding_backward = lutra_cuda_embedding_backward,
    .embedding_scratch = lutra_cuda_embedding_scratch,
    .rope = lutra_cuda_rope,
    .call_graphs_free = lutra_cuda_call_graphs_free,
    .from_host_async = lutra_cuda_from_host_async,
    .rules_gather = lutra_cuda_rules_gather,
    .rules_apply = lutra_cuda_rules_apply,
    .quantize_nvfp4 = k_nvfp4,
    .quantize_rowwise = k_rowwise,
#ifdef LUTRA_WITH_CUDNN /* else NULL: the module refuses attention on cuda */
    .attention_plan = lutra_cuda_attention_plan,
    .attention_plan_free = lutra_cuda_attention_plan_free,
    .attention_forward = lutra_cuda_attention_forward,
    .attention_backward = lutra_cuda_attention_backward,
#endif
    .stream = stream_key,
};
