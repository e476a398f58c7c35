--- MultiheadAttention, TransformerLayer (src/lutra/transformer.h) and the mixture-of-experts
-- feed-forward MoEMLP (src/lutra/moe_mlp.h): TransformerEngine's blocks built from lutra's
-- modules, each one C module (one call per forward or backward). lutra.nn exposes them under
-- the same names:
--   local layer = nn.TransformerLayer(768, 3072, 12, {dtype = "bf16", device = "cuda"})
--   local y = layer:forward(x)      -- x {B, T, 768}
--   local dx = layer:backward(dy)
--   local moe = nn.TransformerLayer(768, 3072, 12, {moe = {experts = 8, top_k = 2}})
-- @module lutra.transformer
local core = require("lutra.core")
local chk = require("lutra.check")
local fused = require("lutra.fused")
local borrow = require("lutra.tensor").borrow
local ffi, C, check = core.ffi, core.C, core.check

local M = {}
local module_box = ffi.new("lutra_module*[1]")
local function own(m) return ffi.gc(m, C.lutra_module_unref) end

local normalizations = { LayerNorm = C.LUTRA_NORM_LAYERNORM, RMSNorm = C.LUTRA_NORM_RMSNORM }
local mask_types = { causal = 1, no_mask = 0 }
local formats = { bshd = C.LUTRA_QKV_BSHD, sbhd = C.LUTRA_QKV_SBHD }

local attention_options = {
  num_gqa_groups = true, head_dim = true, input_layernorm = true, normalization = true,
  zero_centered_gamma = true, bias = true, attn_mask_type = true, qkv_format = true, rope = true,
  rope_base = true, rope_max_seq = true, eps = true, softmax_scale = true, attention_dropout = true,
  fp8_attention = true, dtype = true, device = true, accumulate_main_grad = true, seed = true,
}

local function number_option(v, name, where, lo)
  if v == nil then return nil end
  chk.finite(v, name, where, 4)
  if v < lo then chk.fail(where, "%s must be >= %s (got %s)", name, tostring(lo), tostring(v)) end
  return v
end

-- the attention options (TE's names) into d, a lutra_mha_desc
local function attention_desc(d, hidden, num_heads, opts, where)
  chk.integer(hidden, "hidden", where, 1, 2 ^ 52)
  chk.integer(num_heads, "num_heads", where, 1, 2 ^ 31)
  d.hidden, d.num_heads = hidden, num_heads
  if opts.num_gqa_groups ~= nil then
    chk.integer(opts.num_gqa_groups, "num_gqa_groups", where, 1, 2 ^ 31)
    d.num_gqa_groups = opts.num_gqa_groups
  end
  if opts.head_dim ~= nil then
    chk.integer(opts.head_dim, "head_dim", where, 1, 2 ^ 31)
    d.head_dim = opts.head_dim
  end
  d.input_layernorm = chk.flag(opts.input_layernorm, "input_layernorm", where, 1)
  if opts.normalization ~= nil then
    d.normalization = core.code(normalizations, opts.normalization, "normalization", where)
  end
  d.zero_centered_gamma = chk.flag(opts.zero_centered_gamma, "zero_centered_gamma", where, 0)
  d.bias = chk.flag(opts.bias, "bias", where, 1)
  if opts.attn_mask_type ~= nil then
    d.causal = core.code(mask_types, opts.attn_mask_type, "attn_mask_type", where)
  end
  if opts.qkv_format ~= nil then
    d.qkv_format = core.code(formats, opts.qkv_format, "qkv_format", where)
  end
  d.rope = chk.flag(opts.rope, "rope", where, 0)
  d.rope_base = number_option(opts.rope_base, "rope_base", where, 1) or d.rope_base
  if opts.rope_max_seq ~= nil then
    chk.integer(opts.rope_max_seq, "rope_max_seq", where, 1, 2 ^ 31)
    d.rope_max_seq = opts.rope_max_seq
  end
  d.eps = number_option(opts.eps, "eps", where, 0) or d.eps
  d.softmax_scale = number_option(opts.softmax_scale, "softmax_scale", where, 0) or 0
  d.attention_dropout = number_option(opts.attention_dropout, "attention_dropout", where, 0) or 0
  d.fp8_attention = chk.flag(opts.fp8_attention, "fp8_attention", where, 0)
  if opts.dtype ~= nil then d.dtype = core.code(core.dtypes, opts.dtype, "dtype", where) end
  d.device = core.device(opts.device, where)
  if opts.seed ~= nil then d.seed = chk.seed(opts.seed, "seed", where) end
  d.accumulate_main_grad = chk.flag(opts.accumulate_main_grad, "accumulate_main_grad", where, 0)
end

--- nn.MultiheadAttention: [norm +] fused QKV projection -> [rotary embedding] ->
-- DotProductAttention -> output projection. forward(x {B, T, hidden}) -> {B, T, hidden}
-- ({T, B, hidden} with qkv_format "sbhd"); backward(dy) -> dx.
-- @tparam integer hidden the input's and output's last dim
-- @tparam integer num_heads query heads
-- @tparam[opt] table opts {num_gqa_groups = num_heads, head_dim = hidden / num_heads,
-- input_layernorm = true, normalization = "LayerNorm" | "RMSNorm", zero_centered_gamma = false,
-- bias = true, attn_mask_type = "causal" | "no_mask", qkv_format = "bshd" | "sbhd",
-- rope = false, rope_base = 10000, rope_max_seq = 4096, eps = 1e-5, softmax_scale = 1 / sqrt(head_dim),
-- attention_dropout = 0, fp8_attention = false (the attention in FP8 inside a delayed-scaling
-- scope: nn.DotProductAttention's fp8), dtype = "f32" | "bf16", device =,
-- accumulate_main_grad = false, seed =}
-- @return the module
function M.MultiheadAttention(hidden, num_heads, opts)
  local where = "lutra.nn.MultiheadAttention"
  opts = core.check_options(opts, attention_options, where)
  local d = ffi.new("lutra_mha_desc")
  C.lutra_mha_defaults(d)
  attention_desc(d, hidden, num_heads, opts, where)
  check(C.lutra_mha_new(d, module_box))
  return own(module_box[0])
end

-- written out (a pairs() loop at load would put an NYI into a trace a training loop started)
local layer_options = {
  num_gqa_groups = true, head_dim = true, input_layernorm = true, normalization = true,
  zero_centered_gamma = true, bias = true, attn_mask_type = true, qkv_format = true, rope = true,
  rope_base = true, rope_max_seq = true, eps = true, softmax_scale = true,
  attention_dropout = true, fp8_attention = true, dtype = true, device = true,
  accumulate_main_grad = true, seed = true, activation = true, moe = true,
}

-- the MoE options {experts =, top_k =} of a TransformerLayer into d (a lutra_transformer_desc)
local function moe_option(d, moe, where)
  if moe == nil then return end
  if type(moe) ~= "table" then
    chk.fail(where, "moe must be a table {experts =, top_k =} (got %s)", chk.got(moe))
  end
  moe = core.check_options(moe, { experts = true, top_k = true }, where .. " moe")
  chk.integer(moe.experts, "moe.experts", where, 1, 2 ^ 31 - 1)
  chk.integer(moe.top_k, "moe.top_k", where, 1, 2 ^ 31 - 1)
  d.moe_experts, d.moe_top_k = moe.experts, moe.top_k
end

--- nn.TransformerLayer: x + MultiheadAttention(x), then h + LayerNormMLP(h) (pre-norm, as TE's
-- TransformerLayer with its defaults), or h + MoEMLP(h) when moe is given.
-- forward(x {B, T, hidden}) -> {B, T, hidden}; backward(dy) -> dx.
-- @tparam integer hidden the input's and output's last dim
-- @tparam integer ffn_hidden the MLP's inner width
-- @tparam integer num_heads query heads
-- @tparam[opt] table opts MultiheadAttention's options, and activation = "gelu" | "swiglu" |
-- "geglu" | "reglu" | "relu" | "silu" | "qgelu" | "srelu" | "tanh" (the MLP's), moe = {experts =,
-- top_k =} (the feed-forward is then an MoEMLP of that many experts, ffn_hidden each, with the
-- layer's normalization, activation and bias; its part "mlp")
-- @return the module
function M.TransformerLayer(hidden, ffn_hidden, num_heads, opts)
  local where = "lutra.nn.TransformerLayer"
  opts = core.check_options(opts, layer_options, where)
  chk.integer(ffn_hidden, "ffn_hidden", where, 1, 2 ^ 52)
  local d = ffi.new("lutra_transformer_desc")
  C.lutra_transformer_defaults(d)
  attention_desc(d.attention, hidden, num_heads, opts, where)
  d.ffn_hidden = ffn_hidden
  if opts.activation ~= nil then
    d.activation = core.code(fused.activations, opts.activation, "activation", where)
  end
  moe_option(d, opts.moe, where)
  check(C.lutra_transformer_new(d, module_box))
  return own(module_box[0])
end

local parts = { qkv = 0, attention = 1, proj = 2, mlp = 3 }

--- A block's part: "qkv" (the QKV projection), "attention" (the DotProductAttention), "proj"
-- (the output projection) or "mlp" (a TransformerLayer's LayerNormMLP or MoEMLP), as a module handle of
-- its own (the part lives as long as either holds it).
-- @param m a MultiheadAttention or TransformerLayer
-- @tparam string name the part
-- @return the module
function M.part(m, name)
  local where = "lutra.nn.TransformerLayer:part"
  local code = core.code(parts, name, "part", where)
  check(C.lutra_transformer_part(m, code, module_box))
  if module_box[0] == nil then chk.fail(where, "a MultiheadAttention has no %s", name) end
  return own(module_box[0])
end

local moe_options = {
  normalization = true, activation = true, bias = true, zero_centered_gamma = true, eps = true,
  renormalize = true, scaling_factor = true, dtype = true, device = true,
  accumulate_main_grad = true, seed = true,
}

--- nn.MoEMLP: the mixture-of-experts feed-forward, one C module: norm -> router Linear (no
-- bias, always in the module's dtype, even under FP8 autocast) -> fused softmax + top-k ->
-- permute -> GroupedLinear fc1 -> activation -> GroupedLinear fc2 (FP8 under autocast) ->
-- unpermute, weighted by the router's probabilities. forward(x {.., hidden}) -> x's shape;
-- backward(dy) -> dx, the router's gradient included. No load-balancing loss (m:routing() gives
-- what one needs). Parameters: norm.weight (norm.bias), router.weight, fc1.weight0,
-- fc1.bias0, .., fc2.weight0, ..
-- @tparam integer hidden the input's and output's last dim
-- @tparam integer ffn_hidden each expert's inner width (gated activations: fc1 gives twice it)
-- @tparam integer experts 1..4096
-- @tparam integer top_k experts per token, 1..min(8, experts)
-- @tparam[opt] table opts {normalization = "LayerNorm" | "RMSNorm", activation = "gelu" | ...
-- (LayerNormMLP's), bias = true (the experts'), zero_centered_gamma = false, eps = 1e-5,
-- renormalize = true, scaling_factor = 1 (the top-k's: lutra.moe.TopK), dtype = "f32" | "bf16",
-- device =, accumulate_main_grad = false, seed =}
-- @return the module
function M.MoEMLP(hidden, ffn_hidden, experts, top_k, opts)
  local where = "lutra.nn.MoEMLP"
  opts = core.check_options(opts, moe_options, where)
  chk.integer(hidden, "hidden", where, 1, 2 ^ 52)
  chk.integer(ffn_hidden, "ffn_hidden", where, 1, 2 ^ 52)
  chk.integer(experts, "experts", where, 1, 2 ^ 31 - 1)
  chk.integer(top_k, "top_k", where, 1, 2 ^ 31 - 1)
  local d = ffi.new("lutra_moe_mlp_desc")
  C.lutra_moe_mlp_defaults(d)
  d.hidden, d.ffn_hidden, d.experts, d.top_k = hidden, ffn_hidden, experts, top_k
  if opts.normalization ~= nil then
    d.normalization = core.code(normalizations, opts.normalization, "normalization", where)
  end
  if opts.activation ~= nil then
    d.activation = core.code(fused.activations, opts.activation, "activation", where)
  end
  d.bias = chk.flag(opts.bias, "bias", where, 1)
  d.zero_centered_gamma = chk.flag(opts.zero_centered_gamma, "zero_centered_gamma", where, 0)
  d.eps = number_option(opts.eps, "eps", where, 0) or d.eps
  d.renormalize = chk.flag(opts.renormalize, "renormalize", where, 1)
  d.scaling_factor = number_option(opts.scaling_factor, "scaling_factor", where, 0) or 1
  if opts.dtype ~= nil then d.dtype = core.code(core.dtypes, opts.dtype, "dtype", where) end
  d.device = core.device(opts.device, where)
  if opts.seed ~= nil then d.seed = chk.seed(opts.seed, "seed", where) end
  d.accumulate_main_grad = chk.flag(opts.accumulate_main_grad, "accumulate_main_grad", where, 0)
  check(C.lutra_moe_mlp_new(d, module_box))
  return own(module_box[0])
end

local routing_box = ffi.new("lutra_tensor*[3]")
local MoEMLP = {}

--- An MoEMLP's own methods, beside those of every module (lutra.nn's Module).
-- @type MoEMLP

--- The routing of the last forward, read in place (owned by the module, valid until its next
-- forward): for a load-balancing loss or to watch the experts' load.
-- @return probs [tokens, top_k] f32, indices [tokens, top_k] i32, m_splits [experts] i32 (on the
-- module's device)
function MoEMLP:routing()
  check(C.lutra_moe_mlp_routing(self, routing_box, routing_box + 1, routing_box + 2))
  return borrow(routing_box[0], self), borrow(routing_box[1], self), borrow(routing_box[2], self)
end

--- @section end

--- The methods of the kind moe_mlp (lutra.nn defines the kind with them).
-- @local internal
M.moe_methods = MoEMLP

local moe_desc = ffi.new("lutra_moe_mlp_desc")
local activation_names, device_names = {}, {}
for name, code in pairs(fused.activations) do activation_names[tonumber(code)] = name end
for name, code in pairs(core.devices) do device_names[tonumber(code)] = name end

--- An MoEMLP's line in print(module).
-- @local internal: lutra.module_tree calls it
function M.describe_moe(m)
  check(C.lutra_moe_mlp_desc_of(m, moe_desc))
  local d = moe_desc
  return string.format("lutra.nn.MoEMLP(hidden=%d, ffn_hidden=%d, experts=%d, top_k=%d, %s, %s, "
                       .. "bias=%s, %s, %s)", tonumber(d.hidden), tonumber(d.ffn_hidden),
                       d.experts, d.top_k,
                       d.normalization == C.LUTRA_NORM_RMSNORM and "RMSNorm" or "LayerNorm",
                       activation_names[tonumber(d.activation)] or "?", tostring(d.bias ~= 0),
                       require("lutra.tensor").dtype_names[tonumber(d.dtype)],
                       device_names[tonumber(d.device)])
end

return M
