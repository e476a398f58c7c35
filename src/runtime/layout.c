/* The C compiler's view of every struct the Lua front reads or fills, for
 * spec/layout_spec.lua to compare with LuaJIT's ffi.offsetof/ffi.sizeof. */
#include "core/error.h"
#include "lutra.h"

#include <stddef.h>

typedef struct field {
  const char *type, *field;
  size_t offset, size;
} field;

#define F(T, f)                                                                                    \
  { #T, #f, offsetof(T, f), sizeof(((T *)0)->f) }
#define S(T)                                                                                       \
  { #T, "", sizeof(T), sizeof(T) }

static const field fields[] = {
    S(lutra_tensor),
    F(lutra_tensor, data),
    F(lutra_tensor, col_data),
    F(lutra_tensor, scale_inv),
    F(lutra_tensor, col_scale_inv),
    F(lutra_tensor, amax),
    F(lutra_tensor, shape),
    F(lutra_tensor, numel),
    F(lutra_tensor, ndim),
    F(lutra_tensor, dtype),
    F(lutra_tensor, device),
    F(lutra_tensor, scaling),
    F(lutra_tensor, flags),
    F(lutra_tensor, refs),
    F(lutra_tensor, held),
    F(lutra_tensor, views),
    F(lutra_tensor, base),

    S(lutra_delayed_desc),
    F(lutra_delayed_desc, fp8_format),
    F(lutra_delayed_desc, margin),
    F(lutra_delayed_desc, amax_history_len),
    F(lutra_delayed_desc, amax_compute_algo),
    F(lutra_delayed_desc, reduce_amax),

    S(lutra_current_desc),
    F(lutra_current_desc, fp8_format),
    F(lutra_current_desc, power_2_scale),
    F(lutra_current_desc, amax_epsilon),

    S(lutra_mxfp8_desc),
    F(lutra_mxfp8_desc, fp8_format),
    F(lutra_mxfp8_desc, margin),

    S(lutra_block_desc),
    F(lutra_block_desc, fp8_format),
    F(lutra_block_desc, power_2_scale),
    F(lutra_block_desc, amax_epsilon),
    F(lutra_block_desc, block_dim),

    S(lutra_custom_desc),
    F(lutra_custom_desc, kind),
    F(lutra_custom_desc, format),
    F(lutra_custom_desc, power_2_scale),
    F(lutra_custom_desc, amax_epsilon),
    F(lutra_custom_desc, margin),
    F(lutra_custom_desc, amax_history_len),
    F(lutra_custom_desc, amax_compute_algo),
    F(lutra_custom_desc, reduce_amax),
    F(lutra_custom_desc, nvfp4),
    F(lutra_custom_desc, rht_signs),
    F(lutra_custom_desc, nvfp4_seed),

    S(lutra_linear_desc),
    F(lutra_linear_desc, in_features),
    F(lutra_linear_desc, out_features),
    F(lutra_linear_desc, bias),
    F(lutra_linear_desc, dtype),
    F(lutra_linear_desc, device),
    F(lutra_linear_desc, accumulate_main_grad),
    F(lutra_linear_desc, seed),

    S(lutra_norm_desc),
    F(lutra_norm_desc, hidden),
    F(lutra_norm_desc, eps),
    F(lutra_norm_desc, rms),
    F(lutra_norm_desc, zero_centered_gamma),
    F(lutra_norm_desc, dtype),
    F(lutra_norm_desc, device),

    S(lutra_attention_desc),
    F(lutra_attention_desc, num_heads),
    F(lutra_attention_desc, head_dim),
    F(lutra_attention_desc, num_gqa_groups),
    F(lutra_attention_desc, causal),
    F(lutra_attention_desc, qkv_format),
    F(lutra_attention_desc, softmax_scale),
    F(lutra_attention_desc, dropout),
    F(lutra_attention_desc, dtype),
    F(lutra_attention_desc, device),
    F(lutra_attention_desc, seed),
    F(lutra_attention_desc, fp8),

    S(lutra_moe_router_desc),
    F(lutra_moe_router_desc, experts),
    F(lutra_moe_router_desc, k),
    F(lutra_moe_router_desc, renormalize),
    F(lutra_moe_router_desc, scaling_factor),
    F(lutra_moe_router_desc, device),

    S(lutra_moe_mlp_desc),
    F(lutra_moe_mlp_desc, hidden),
    F(lutra_moe_mlp_desc, ffn_hidden),
    F(lutra_moe_mlp_desc, experts),
    F(lutra_moe_mlp_desc, top_k),
    F(lutra_moe_mlp_desc, normalization),
    F(lutra_moe_mlp_desc, activation),
    F(lutra_moe_mlp_desc, bias),
    F(lutra_moe_mlp_desc, zero_centered_gamma),
    F(lutra_moe_mlp_desc, eps),
    F(lutra_moe_mlp_desc, renormalize),
    F(lutra_moe_mlp_desc, scaling_factor),
    F(lutra_moe_mlp_desc, dtype),
    F(lutra_moe_mlp_desc, device),
    F(lutra_moe_mlp_desc, accumulate_main_grad),
    F(lutra_moe_mlp_desc, seed),

    S(lutra_mha_desc),
    F(lutra_mha_desc, accumulate_main_grad),
    F(lutra_mha_desc, fp8_attention),
    F(lutra_mha_desc, seed),

    S(lutra_transformer_desc),
    F(lutra_transformer_desc, ffn_hidden),
    F(lutra_transformer_desc, activation),
    F(lutra_transformer_desc, moe_experts),
    F(lutra_transformer_desc, moe_top_k),

    S(lutra_forward_args),
    F(lutra_forward_args, is_first_microbatch),
    F(lutra_forward_args, grad),
    F(lutra_forward_args, splits),

    S(lutra_param),
    F(lutra_param, value),
    F(lutra_param, grad),
    F(lutra_param, main_grad),

    S(lutra_gemm_epilogue),
    F(lutra_gemm_epilogue, kind),
    F(lutra_gemm_epilogue, pad),
    F(lutra_gemm_epilogue, aux),
    F(lutra_gemm_epilogue, dbias),

    S(lutra_optim_desc),
    F(lutra_optim_desc, kind),
    F(lutra_optim_desc, lr),
    F(lutra_optim_desc, momentum),
    F(lutra_optim_desc, weight_decay),
    F(lutra_optim_desc, beta1),
    F(lutra_optim_desc, beta2),
    F(lutra_optim_desc, eps),
    F(lutra_optim_desc, max_grad_norm),
    F(lutra_optim_desc, decay),
    F(lutra_optim_desc, schedule),
    S(lutra_lr_schedule),
    F(lutra_lr_schedule, kind),
    F(lutra_lr_schedule, min_lr),
    F(lutra_lr_schedule, warmup_steps),
    F(lutra_lr_schedule, total_steps),

    S(lutra_checkpoint_objects),
    F(lutra_checkpoint_objects, model),
    F(lutra_checkpoint_objects, optim),
    F(lutra_checkpoint_objects, recipe),
    F(lutra_checkpoint_objects, fp8),
    F(lutra_checkpoint_objects, main_grads),
    F(lutra_checkpoint_objects, rng),
    S(lutra_checkpoint_rename),
    F(lutra_checkpoint_rename, from),
    F(lutra_checkpoint_rename, to),
    S(lutra_checkpoint_load_opts),
    F(lutra_checkpoint_load_opts, map),
    F(lutra_checkpoint_load_opts, map_len),
    F(lutra_checkpoint_load_opts, convert),
};

/* Entry i, or LUTRA_EINVAL past the end (the caller's loop stops there). An entry with an
 * empty field name gives the struct's size in offset and size. */
int lutra_layout(int i, const char **type, const char **field_name, size_t *offset, size_t *size) {
  static const char fn[] = "lutra_layout";
  CHECK_ARG(i >= 0 && (size_t)i < sizeof fields / sizeof *fields, "entry %d is out of range 0..%d",
            i, (int)(sizeof fields / sizeof *fields) - 1);
  CHECK_ARG(type && field_name && offset && size, "output pointers must not be NULL");
  *type = fields[i].type;
  *field_name = fields[i].field;
  *offset = fields[i].offset;
  *size = fields[i].size;
  return LUTRA_OK;
}
