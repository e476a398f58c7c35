--- DotProductAttention (lutra.nn.DotProductAttention): scaled dot-product attention,
-- softmax(q k^T * softmax_scale [+ causal mask]) v, as TransformerEngine's DotProductAttention
-- (src/nn/attention.c; lutra/attention.h for the C API).
--   local attn = nn.DotProductAttention(4, 16, {num_gqa_groups = 2})
--   local out = attn:forward(q, k, v)      -- q {B, T, 4, 16}, k and v {B, T, 2, 16}
--   local dq, dk, dv = attn:backward(dout) -- dout of out's shape
--   local y = attn:forward(qkv)            -- qkv {B, T, (4 + 2 * 2) * 16} -> {B, T, 4 * 16}
--   local dqkv = attn:backward(dy)
-- The one-tensor forward is the module protocol (what a Sequential calls): a fused QKV
-- projection's output, its last dim laid out [q heads | k heads | v heads], read in place. A
-- backward answers the kind of the last forward. No parameters. Dropout applies in forwards
-- with grad (each draws a fresh mask); an inference forward ({grad = false}) runs without it.
-- @module lutra.attention
local core = require("lutra.core")
local chk = require("lutra.check")
local tensor = require("lutra.tensor")
local ffi, C, check = core.ffi, core.C, core.check
local borrow = tensor.borrow

local M = {}

local module_box = ffi.new("lutra_module*[1]")
local desc = ffi.new("lutra_attention_desc")
local masks = { causal = 1, no_mask = 0 }
local formats = { bshd = C.LUTRA_QKV_BSHD, sbhd = C.LUTRA_QKV_SBHD }

--- nn.DotProductAttention: num_heads query heads of head_dim values each.
-- @tparam integer num_heads query heads (H)
-- @tparam integer head_dim values per head (D)
-- @tparam[opt] table opts {num_gqa_groups = num_heads (key/value heads; must divide
-- num_heads), attn_mask_type = "causal" | "no_mask" (default "causal": query i sees keys
-- 0..i), softmax_scale = 1 / sqrt(head_dim), qkv_format = "bshd" | "sbhd" (default "bshd":
-- {B, T, ...}; "sbhd": {T, B, ...}), dropout = 0 (the probability of dropping an attention
-- weight), seed = (the dropout's; default from the global generator), dtype = "f32" (cpu only)
-- | "bf16" | "f16", device =, fp8 = false (true: FP8 attention inside an autocast scope of a
-- delayed-scaling recipe, TransformerEngine's fp8_dpa; head_dim 128, no dropout; outside such a
-- scope the module runs its dtype; lutra/attention.h)}
-- @return the module
function M.DotProductAttention(num_heads, head_dim, opts)
  local where = "lutra.nn.DotProductAttention"
  opts = core.check_options(opts, { num_gqa_groups = true, attn_mask_type = true,
                                    softmax_scale = true, qkv_format = true, dropout = true,
                                    seed = true, dtype = true, device = true, fp8 = true },
                                  where)
  chk.integer(num_heads, "num_heads", where, 1, 2 ^ 31 - 1)
  chk.integer(head_dim, "head_dim", where, 1, 2 ^ 31 - 1)
  C.lutra_attention_defaults(desc)
  desc.num_heads, desc.head_dim = num_heads, head_dim
  if opts.num_gqa_groups ~= nil then
    chk.integer(opts.num_gqa_groups, "num_gqa_groups", where, 1, num_heads)
    if num_heads % opts.num_gqa_groups ~= 0 then
      chk.fail(where, "num_gqa_groups %d does not divide num_heads %d", opts.num_gqa_groups,
               num_heads)
    end
    desc.num_gqa_groups = opts.num_gqa_groups
  end
  if opts.attn_mask_type ~= nil then
    desc.causal = core.code(masks, opts.attn_mask_type, "attn_mask_type", where)
  end
  if opts.qkv_format ~= nil then
    desc.qkv_format = core.code(formats, opts.qkv_format, "qkv_format", where)
  end
  if opts.softmax_scale ~= nil then
    chk.finite(opts.softmax_scale, "softmax_scale", where)
    desc.softmax_scale = opts.softmax_scale
  end
  if opts.dropout ~= nil then
    chk.number(opts.dropout, "dropout", where)
    if not (opts.dropout >= 0 and opts.dropout < 1) then
      chk.fail(where, "dropout must be in [0, 1) (got %s)", tostring(opts.dropout))
    end
    desc.dropout = opts.dropout
  end
  -- without a seed, lutra_attention_defaults drew one from the global generator
  if opts.seed ~= nil then desc.seed = chk.seed(opts.seed, "seed", where) end
  if opts.dtype ~= nil then desc.dtype = core.code(core.dtypes, opts.dtype, "dtype", where) end
  desc.device = core.device(opts.device, where)
  if opts.fp8 ~= nil then desc.fp8 = chk.boolean(opts.fp8, "fp8", where) and 1 or 0 end
  check(C.lutra_attention_new(desc, module_box))
  return ffi.gc(module_box[0], C.lutra_module_unref)
end

local forward_args = ffi.new("lutra_forward_args")
local grads = ffi.new("lutra_tensor*[3]")
local last_box = ffi.new("int32_t[1]")

--- The forward of q, k and v (lutra.nn's Module:forward(q, k, v, opts) comes here).
-- @local lutra.nn's Module:forward calls it when its third argument is a tensor
function M.forward(m, q, k, v, opts)
  local grad = true
  if opts ~= nil then
    if type(opts) ~= "table" then
      error("module:forward: the options after q, k, v must be a table (got " .. chk.got(opts)
            .. ")", 3)
    end
    if opts.grad ~= nil then grad = chk.boolean(opts.grad, "grad", "module:forward", 4) end
  end
  forward_args.is_first_microbatch = -1
  forward_args.grad = grad and 1 or 0
  if C.lutra_attention_forward_ex(m, q, k, v, forward_args, core.tensor_box) ~= 0 then
    core.fail()
  end
  return borrow(core.tensor_box[0], m)
end

--- The backward after a forward of q, k and v: true, dq, dk, dv (true alone when input_grad is
-- false); false after any other forward, for lutra.nn's Module:backward to run the module
-- protocol's.
-- @local lutra.nn's Module:backward calls it for a DotProductAttention
function M.backward(m, dout, input_grad)
  check(C.lutra_attention_info(m, nil, last_box))
  if last_box[0] ~= C.LUTRA_ATTENTION_QKV then return false end
  if C.lutra_attention_backward(m, dout, grads, grads + 1, grads + 2) ~= 0 then core.fail() end
  if input_grad == false then return true end
  return true, borrow(grads[0], m), borrow(grads[1], m), borrow(grads[2], m)
end

--- The line print(module) shows for a DotProductAttention.
-- @local lutra.module_tree calls it
function M.describe(m)
  local d = ffi.new("lutra_attention_desc")
  check(C.lutra_attention_info(m, d, nil))
  return string.format("lutra.nn.DotProductAttention(heads=%d, head_dim=%d, gqa_groups=%d, %s, "
                       .. "%s, scale=%.6g, dropout=%.6g, %s, %s%s)", tonumber(d.num_heads),
                       tonumber(d.head_dim), tonumber(d.num_gqa_groups),
                       d.causal ~= 0 and "causal" or "no_mask",
                       d.qkv_format == C.LUTRA_QKV_SBHD and "sbhd" or "bshd", d.softmax_scale,
                       d.dropout, tensor.dtype_names[tonumber(d.dtype)],
                       d.device == C.LUTRA_CPU and "cpu" or "cuda", d.fp8 ~= 0 and ", fp8" or "")
end

--- A DotProductAttention's own methods, beside those of every module (lutra.nn's Module:
-- forward(q, k, v[, opts]) or forward(qkv[, opts]), backward(dout), ...).
-- @type DotProductAttention
local DotProductAttention = {}

local rng_box = ffi.new("uint64_t[2]")
--- The dropout generator's state: the seed and the offset the next forward draws its mask from.
-- @return seed, offset (uint64_t cdata)
function DotProductAttention:rng_state()
  check(C.lutra_attention_rng_state(self, rng_box, rng_box + 1))
  return rng_box[0], rng_box[1]
end

--- Sets the dropout generator's state: the next forward draws the mask of (seed, offset).
-- @param seed an integer in 0..2^53 or a uint64_t
-- @param offset an integer in 0..2^53 or a uint64_t
function DotProductAttention:set_rng_state(seed, offset)
  local where = "module:set_rng_state"
  check(C.lutra_attention_set_rng_state(self, chk.seed(seed, "seed", where),
                                        chk.seed(offset, "offset", where)))
end

local plans_box = ffi.new("int[2]")
--- The plans the module keeps (one per shape, strides, dtype and dropout met; at most 4) and
-- whether the last forward's backward is deterministic on its backend.
-- @return count, deterministic (true, false, or nil before a forward with grad)
function DotProductAttention:plans()
  check(C.lutra_attention_plans(self, plans_box, plans_box + 1))
  local det = plans_box[1]
  if det < 0 then return plans_box[0], nil end
  return plans_box[0], det ~= 0
end

local fp8_len = ffi.new("int[2]")
local fp8_scales = ffi.new("float[?]", C.LUTRA_ATTENTION_FP8_TENSORS)
local fp8_names = { "qkv", "s", "o", "do", "dp", "dqkv" }
--- FP8 attention's delayed-scaling state, copied to the host (for specs and inspection).
-- @return {scales = {qkv =, s =, o =, do =, dp =, dqkv =}, history = {qkv = {...}, ...} (most
-- recent update last; [1] collects the current step's; empty before the first FP8 forward),
-- last_fp8 = whether the last forward ran in FP8}
function DotProductAttention:fp8_state()
  check(C.lutra_attention_fp8_state(self, fp8_scales, nil, fp8_len, fp8_len + 1))
  local len = fp8_len[0]
  local hist = ffi.new("float[?]", math.max(1, C.LUTRA_ATTENTION_FP8_TENSORS * len))
  if len > 0 then check(C.lutra_attention_fp8_state(self, nil, hist, nil, nil)) end
  local out = { scales = {}, history = {}, last_fp8 = fp8_len[1] ~= 0 }
  for t, name in ipairs(fp8_names) do
    out.scales[name] = fp8_scales[t - 1]
    local h = {}
    for i = 0, len - 1 do h[i + 1] = hist[(t - 1) * len + i] end
    out.history[name] = h
  end
  return out
end

-- the kind's own methods; lutra.nn defines the kind (M.kind: the entry its Module:backward
-- compares)
M.methods = DotProductAttention

return M
