/* MultiheadAttention and TransformerLayer (lutra/transformer.h): each a Sequential of lutra's own
 * modules, wrapped so that it has a kind, named parts for checkpoints and printing, and no code
 * of its own in forward or backward. The Sequential inside gives the Linears their fusions and
 * runs the chain in one C call; the QKV projection's output reaches the attention as it is
 * (the attention reads q, k and v through strides), so no split or copy runs between them. */
#include "core/error.h"
#include "core/object.h"
#include "nn/module.h"

#include <math.h>
#include <stdlib.h>

enum { BLOCK_MAX_PARTS = 4 };

typedef struct block {
  lutra_module base;
  lutra_module *body; /* the Sequential that runs it */
  int count;          /* named children, in parameter order */
  lutra_module *child[BLOCK_MAX_PARTS];
  const char *name[BLOCK_MAX_PARTS];
  lutra_module *part[BLOCK_MAX_PARTS]; /* LUTRA_PART_*: borrowed from child[] or their parts */
} block;

/* RoPE inside the chain: rotates the q and k heads of the QKV projection's output in place and
 * hands the same tensor on (the projection's backward does not read its output); its backward
 * rotates the attention's packed gradient back in place. */
typedef struct rope_step {
  lutra_module base;
  lutra_module *rope;
  int64_t heads, kv_heads;
  bool forward_done;
} rope_step;

static int rope_step_forward(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *a,
                             lutra_tensor **y) {
  rope_step *r = (rope_step *)m;
  (void)a;
  lutra_tensor *qkv = (lutra_tensor *)x; /* the QKV projection's own output buffer */
  TRY(lutra_rope_apply_qkv(r->rope, qkv, r->heads, r->kv_heads, 0));
  r->forward_done = true;
  *y = qkv;
  return LUTRA_OK;
}
static int rope_step_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  static const char fn[] = "lutra_mha_backward";
  rope_step *r = (rope_step *)m;
  CHECK_STATE(r->forward_done, "backward called before forward");
  lutra_tensor *g = (lutra_tensor *)dy; /* the attention's packed gradient, its own buffer */
  TRY(lutra_rope_apply_qkv(r->rope, g, r->heads, r->kv_heads, 1));
  if (dx) *dx = g;
  return LUTRA_OK;
}
static void rope_step_release(lutra_module *m) {
  rope_step *r = (rope_step *)m;
  lutra_module_unref(r->rope);
  r->rope = NULL;
}
static const lutra_module_ops rope_step_ops = {
    .kind = "rotary_qkv",
    .forward = rope_step_forward,
    .backward = rope_step_backward,
    .num_params = lutra_module_no_params,
    .param = lutra_module_no_param,
    .release = rope_step_release,
    .checkpoint = &lutra_checkpoint_stateless,
};

static int rope_step_new(const lutra_mha_desc *d, lutra_module **out, const char *fn) {
  lutra_rope_desc rd;
  lutra_rope_defaults(&rd);
  rd.head_dim = d->head_dim;
  rd.base = d->rope_base;
  rd.qkv_format = d->qkv_format == LUTRA_QKV_SBHD ? LUTRA_ROPE_SBHD : LUTRA_ROPE_BSHD;
  rd.dtype = d->dtype;
  rd.device = d->device;
  if (d->rope_max_seq > 0) rd.max_seq = d->rope_max_seq;
  lutra_module *rope = NULL;
  if (lutra_rope_new(&rd, &rope) != LUTRA_OK) return lutra_error_wrap(LUTRA_EINVAL, fn);
  rope_step *r = calloc(1, sizeof *r);
  if (!r) {
    lutra_module_unref(rope);
    return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  }
  r->rope = rope;
  r->heads = d->num_heads;
  r->kv_heads = d->num_gqa_groups;
  lutra_module_init(&r->base, &rope_step_ops);
  *out = &r->base;
  return LUTRA_OK;
}

static int block_forward(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *a,
                         lutra_tensor **y) {
  lutra_module *body = ((block *)m)->body;
  return body->ops->forward(body, x, a, y);
}
static int block_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  lutra_module *body = ((block *)m)->body;
  return body->ops->backward(body, dy, dx);
}
/* a Residual around a MultiheadAttention: its projection's GEMM adds the input, its QKV norm's
 * backward the gradient (the body arms them) */
static bool block_arm_residual(lutra_module *m, int pass, const lutra_tensor *r,
                               lutra_tensor *out) {
  return lutra_module_arm_residual(((block *)m)->body, pass, r, out);
}
static const lutra_fusion_ops block_fusion = {.activation = LUTRA_ACT_NONE,
                                              .arm_residual = block_arm_residual};
static int block_num_params(const lutra_module *m) {
  const lutra_module *body = ((const block *)m)->body;
  return body->ops->num_params(body);
}
static int block_param(const lutra_module *m, int i, lutra_param *out) {
  const lutra_module *body = ((const block *)m)->body;
  return body->ops->param(body, i, out);
}
static void block_release(lutra_module *m) {
  block *b = (block *)m;
  lutra_module_unref(b->body);
  b->body = NULL;
  for (int i = 0; i < b->count; i++) {
    lutra_module_unref(b->child[i]);
    b->child[i] = NULL;
  }
  b->count = 0;
}
static int block_num_children(const lutra_module *m) {
  return ((const block *)m)->count;
}
static lutra_module *block_child(const lutra_module *m, int i, const char **name) {
  const block *b = (const block *)m;
  *name = b->name[i];
  return b->child[i];
}
static const lutra_checkpoint_ops block_checkpoint = {
    .num_children = block_num_children,
    .child = block_child,
};
static const lutra_module_ops mha_ops = {
    .kind = "multihead_attention",
    .forward = block_forward,
    .backward = block_backward,
    .num_params = block_num_params,
    .param = block_param,
    .release = block_release,
    .fusion = &block_fusion,
    .checkpoint = &block_checkpoint,
};
static const lutra_module_ops layer_ops = {
    .kind = "transformer_layer",
    .forward = block_forward,
    .backward = block_backward,
    .num_params = block_num_params,
    .param = block_param,
    .release = block_release,
    .fusion = &block_fusion,
    .checkpoint = &block_checkpoint,
};

void lutra_mha_defaults(lutra_mha_desc *d) {
  if (!d) return;
  *d = (lutra_mha_desc){.input_layernorm = 1,
                        .normalization = LUTRA_NORM_LAYERNORM,
                        .bias = 1,
                        .causal = 1,
                        .qkv_format = LUTRA_QKV_BSHD,
                        .rope_base = 10000.0f,
                        .eps = 1e-5f,
                        .dtype = LUTRA_F32,
                        .device = LUTRA_CPU};
  lutra_seed_next(&d->seed);
}

void lutra_transformer_defaults(lutra_transformer_desc *d) {
  if (!d) return;
  *d = (lutra_transformer_desc){.activation = LUTRA_ACTIVATION_GELU_TANH};
  lutra_mha_defaults(&d->attention);
}

/* the desc with its defaults resolved (heads of kv, head_dim), or LUTRA_EINVAL naming the field */
static int resolve(const lutra_mha_desc *in, lutra_mha_desc *d, const char *fn) {
  CHECK_ARG(in, "desc is NULL");
  *d = *in;
  CHECK_ARG(d->hidden >= 1, "hidden must be positive (got %lld)", (long long)d->hidden);
  CHECK_ARG(d->num_heads >= 1, "num_heads must be positive (got %lld)", (long long)d->num_heads);
  if (d->num_gqa_groups == 0) d->num_gqa_groups = d->num_heads;
  CHECK_ARG(d->num_gqa_groups >= 1 && d->num_heads % d->num_gqa_groups == 0,
            "num_gqa_groups (%lld) must divide num_heads (%lld)", (long long)d->num_gqa_groups,
            (long long)d->num_heads);
  if (d->head_dim == 0) {
    CHECK_ARG(d->hidden % d->num_heads == 0,
              "hidden (%lld) is not a multiple of num_heads (%lld): give head_dim",
              (long long)d->hidden, (long long)d->num_heads);
    d->head_dim = d->hidden / d->num_heads;
  }
  CHECK_ARG(d->head_dim >= 1, "head_dim must be positive (got %lld)", (long long)d->head_dim);
  CHECK_ARG(d->normalization == LUTRA_NORM_LAYERNORM || d->normalization == LUTRA_NORM_RMSNORM,
            "normalization must be LUTRA_NORM_LAYERNORM or LUTRA_NORM_RMSNORM (got %d)",
            (int)d->normalization);
  CHECK_ARG(d->rope == 0 || d->rope == 1, "rope must be 0 or 1 (got %d)", (int)d->rope);
  CHECK_ARG(isfinite(d->eps) && d->eps > 0, "eps must be positive and finite");
  return LUTRA_OK;
}

/* the QKV projection, the attention and the output projection of d (each a new reference) */
static int make_attention_parts(const lutra_mha_desc *d, lutra_module **parts, const char *fn) {
  int64_t qkv_out = (d->num_heads + 2 * d->num_gqa_groups) * d->head_dim;
  int64_t attn_out = d->num_heads * d->head_dim;
  if (d->input_layernorm) {
    lutra_layernorm_linear_desc q;
    lutra_layernorm_linear_defaults(&q);
    q.in_features = d->hidden;
    q.out_features = qkv_out;
    q.normalization = d->normalization;
    q.bias = d->bias;
    q.zero_centered_gamma = d->zero_centered_gamma;
    q.eps = d->eps;
    q.dtype = d->dtype;
    q.device = d->device;
    q.accumulate_main_grad = d->accumulate_main_grad;
    q.seed = d->seed;
    if (lutra_layernorm_linear_new(&q, &parts[0]) != LUTRA_OK)
      return lutra_error_wrap(LUTRA_EINVAL, fn);
  } else {
    lutra_linear_desc q;
    lutra_linear_defaults(&q);
    q.in_features = d->hidden;
    q.out_features = qkv_out;
    q.bias = d->bias;
    q.dtype = d->dtype;
    q.device = d->device;
    q.accumulate_main_grad = d->accumulate_main_grad;
    q.seed = d->seed;
    if (lutra_linear_new(&q, &parts[0]) != LUTRA_OK) return lutra_error_wrap(LUTRA_EINVAL, fn);
  }
  lutra_attention_desc a;
  lutra_attention_defaults(&a);
  a.num_heads = d->num_heads;
  a.head_dim = d->head_dim;
  a.num_gqa_groups = d->num_gqa_groups;
  a.causal = d->causal;
  a.qkv_format = d->qkv_format;
  a.softmax_scale = d->softmax_scale;
  a.dropout = d->attention_dropout;
  a.fp8 = d->fp8_attention;
  a.dtype = d->dtype;
  a.device = d->device;
  a.seed = d->seed + 2;
  int st = lutra_attention_new(&a, &parts[1]);
  if (st == LUTRA_OK) {
    lutra_linear_desc p;
    lutra_linear_defaults(&p);
    p.in_features = attn_out;
    p.out_features = d->hidden;
    p.bias = d->bias;
    p.dtype = d->dtype;
    p.device = d->device;
    p.accumulate_main_grad = d->accumulate_main_grad;
    p.seed = d->seed + 1;
    st = lutra_linear_new(&p, &parts[2]);
    if (st != LUTRA_OK) lutra_module_unref(parts[1]);
  }
  if (st != LUTRA_OK) {
    lutra_module_unref(parts[0]);
    return lutra_error_wrap(st, fn);
  }
  return LUTRA_OK;
}

/* a block of kind ops running body, its named children taken over (their references move into
 * the block); on failure every reference given is dropped */
static int make_block(const lutra_module_ops *ops, lutra_module *body, lutra_module *const *child,
                      const char *const *name, int count, lutra_module **out, const char *fn) {
  block *b = body ? calloc(1, sizeof *b) : NULL;
  if (!b) {
    lutra_module_unref(body);
    for (int i = 0; i < count; i++)
      lutra_module_unref(child[i]);
    return body ? lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module")
                : lutra_error_wrap(LUTRA_EINVAL, fn);
  }
  b->body = body;
  b->count = count;
  for (int i = 0; i < count; i++) {
    b->child[i] = child[i];
    b->name[i] = name[i];
  }
  lutra_module_init(&b->base, ops);
  *out = &b->base;
  return LUTRA_OK;
}

/* a Sequential of mods (NULL on failure, the error set) */
static lutra_module *sequential_of(lutra_module *const *mods, int n) {
  lutra_module *s = NULL;
  return lutra_sequential_new(mods, n, &s) == LUTRA_OK ? s : NULL;
}

static int mha_build(const lutra_mha_desc *d, lutra_module **out, const char *fn) {
  lutra_module *parts[3], *chain[4];
  TRY(make_attention_parts(d, parts, fn));
  int n = 0;
  chain[n++] = parts[0];
  if (d->rope) {
    int st = rope_step_new(d, &chain[n], fn);
    if (st != LUTRA_OK) {
      for (int i = 0; i < 3; i++)
        lutra_module_unref(parts[i]);
      return st;
    }
    n++;
  }
  chain[n++] = parts[1];
  chain[n++] = parts[2];
  lutra_module *body = sequential_of(chain, n);
  if (d->rope) lutra_module_unref(chain[1]); /* the Sequential holds it (or nothing does) */
  static const char *const names_ln[] = {"layernorm_qkv", "core_attention", "proj"};
  static const char *const names[] = {"qkv", "core_attention", "proj"};
  TRY(make_block(&mha_ops, body, parts, d->input_layernorm ? names_ln : names, 3, out, fn));
  block *b = (block *)*out;
  b->part[LUTRA_PART_QKV] = parts[0];
  b->part[LUTRA_PART_ATTENTION] = parts[1];
  b->part[LUTRA_PART_PROJ] = parts[2];
  return LUTRA_OK;
}

int lutra_mha_new(const lutra_mha_desc *desc, lutra_module **out) {
  static const char fn[] = "lutra_mha_new";
  CHECK_ARG(out, "out is NULL");
  lutra_mha_desc d;
  TRY(resolve(desc, &d, fn));
  return mha_build(&d, out, fn);
}

/* the fields a feed-forward desc f (either kind) takes from the layer: desc and its resolved
 * attention desc d; its weights from the layer's seed + 3 */
#define FEED_FORWARD_FROM_LAYER(f, desc, d)                                                        \
  do {                                                                                             \
    (f).hidden = (d)->hidden;                                                                      \
    (f).ffn_hidden = (desc)->ffn_hidden;                                                           \
    (f).normalization = (d)->normalization;                                                        \
    (f).activation = (desc)->activation;                                                           \
    (f).bias = (d)->bias;                                                                          \
    (f).zero_centered_gamma = (d)->zero_centered_gamma;                                            \
    (f).eps = (d)->eps;                                                                            \
    (f).dtype = (d)->dtype;                                                                        \
    (f).device = (d)->device;                                                                      \
    (f).accumulate_main_grad = (d)->accumulate_main_grad;                                          \
    (f).seed = (d)->seed + 3;                                                                      \
  } while (0)

/* the layer's feed-forward: a LayerNormMLP, or the MoE feed-forward when it has experts */
static int feed_forward_new(const lutra_transformer_desc *desc, const lutra_mha_desc *d,
                            lutra_module **out) {
  if (desc->moe_experts) {
    lutra_moe_mlp_desc f;
    lutra_moe_mlp_defaults(&f);
    FEED_FORWARD_FROM_LAYER(f, desc, d);
    f.experts = desc->moe_experts;
    f.top_k = desc->moe_top_k;
    return lutra_moe_mlp_new(&f, out);
  }
  lutra_layernorm_mlp_desc f;
  lutra_layernorm_mlp_defaults(&f);
  FEED_FORWARD_FROM_LAYER(f, desc, d);
  return lutra_layernorm_mlp_new(&f, out);
}

int lutra_transformer_new(const lutra_transformer_desc *desc, lutra_module **out) {
  static const char fn[] = "lutra_transformer_new";
  CHECK_ARG(out, "out is NULL");
  CHECK_ARG(desc, "desc is NULL");
  lutra_mha_desc d;
  TRY(resolve(&desc->attention, &d, fn));
  CHECK_ARG(desc->ffn_hidden >= 1, "ffn_hidden must be positive (got %lld)",
            (long long)desc->ffn_hidden);
  CHECK_ARG(d.input_layernorm, "a TransformerLayer is pre-norm: input_layernorm must be 1");
  CHECK_ARG(desc->moe_experts >= 0, "moe_experts must be >= 0 (0: a dense LayerNormMLP), got %d",
            (int)desc->moe_experts);
  CHECK_ARG(desc->moe_experts > 0 || desc->moe_top_k == 0,
            "moe_top_k = %d without moe_experts: give the experts too", (int)desc->moe_top_k);
  lutra_module *mlp = NULL, *mha = NULL;
  if (feed_forward_new(desc, &d, &mlp) != LUTRA_OK) return lutra_error_wrap(LUTRA_EINVAL, fn);
  if (mha_build(&d, &mha, fn) != LUTRA_OK) {
    lutra_module_unref(mlp);
    return LUTRA_EINVAL;
  }
  lutra_module *res[2] = {NULL, NULL};
  int st = lutra_residual_new(mha, &res[0]);
  if (st == LUTRA_OK) st = lutra_residual_new(mlp, &res[1]);
  lutra_module *body = st == LUTRA_OK ? sequential_of(res, 2) : NULL;
  lutra_module_unref(res[0]); /* the Sequential holds them now (or nothing does) */
  lutra_module_unref(res[1]);
  lutra_module *children[2] = {mha, mlp};
  static const char *const names[] = {"self_attention", "layernorm_mlp"};
  static const char *const moe_names[] = {"self_attention", "moe_mlp"};
  TRY(make_block(&layer_ops, body, children, desc->moe_experts ? moe_names : names, 2, out, fn));
  block *b = (block *)*out, *inner = (block *)mha;
  for (int i = 0; i < LUTRA_PART_MLP; i++)
    b->part[i] = inner->part[i];
  b->part[LUTRA_PART_MLP] = mlp;
  return LUTRA_OK;
}

int lutra_transformer_part(const lutra_module *m, int part, lutra_module **out) {
  static const char fn[] = "lutra_transformer_part";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(out, "out is NULL");
  CHECK_ARG(m->ops == &mha_ops || m->ops == &layer_ops,
            "the module is a %s, not a MultiheadAttention or TransformerLayer", m->ops->kind);
  CHECK_ARG(part >= LUTRA_PART_QKV && part <= LUTRA_PART_MLP, "no part %d (LUTRA_PART_*)", part);
  *out = ((const block *)m)->part[part];
  if (*out) lutra_module_retain(*out);
  return LUTRA_OK;
}
