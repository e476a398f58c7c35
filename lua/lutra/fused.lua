--- The norm-fused modules (TransformerEngine's LayerNormLinear and LayerNormMLP, src/nn/),
-- nn.Residual and the norm writing a quantizer's FP8 output (lutra.norm_quantize). lutra.nn
-- exposes the modules under the same names:
--   local blk = nn.LayerNormMLP(512, 2048, {normalization = "RMSNorm", activation = "swiglu"})
--   local y = blk:forward(x); local dx = blk:backward(dy)
-- @module lutra.fused
local core = require("lutra.core")
local chk = require("lutra.check")
local borrow = require("lutra.tensor").borrow
local ffi, C, check = core.ffi, core.C, core.check

local M = {}
local LayerNormLinear, LayerNormMLP = {}, {}

local module_box = ffi.new("lutra_module*[1]")
local function own(m) return ffi.gc(m, C.lutra_module_unref) end

local normalizations = { LayerNorm = C.LUTRA_NORM_LAYERNORM, RMSNorm = C.LUTRA_NORM_RMSNORM }
--- LayerNormMLP's activation names and their C codes.
-- @table activations
M.activations = {
  gelu = C.LUTRA_ACTIVATION_GELU_TANH, relu = C.LUTRA_ACTIVATION_RELU,
  silu = C.LUTRA_ACTIVATION_SILU, swiglu = C.LUTRA_ACTIVATION_SWIGLU,
  geglu = C.LUTRA_ACTIVATION_GEGLU, reglu = C.LUTRA_ACTIVATION_REGLU,
  qgelu = C.LUTRA_ACTIVATION_QGELU, srelu = C.LUTRA_ACTIVATION_SRELU,
  tanh = C.LUTRA_ACTIVATION_TANH,
}

-- the options both modules share, into desc d
local function common(d, opts, where)
  if opts.normalization ~= nil then
    d.normalization = core.code(normalizations, opts.normalization, "normalization", where)
  end
  d.bias = chk.flag(opts.bias, "bias", where, d.bias, 4)
  d.zero_centered_gamma = chk.flag(opts.zero_centered_gamma, "zero_centered_gamma", where, 0, 4)
  if opts.eps ~= nil then
    chk.finite(opts.eps, "eps", where, 4)
    if opts.eps < 0 then chk.fail(where, "eps must be >= 0 (got %s)", tostring(opts.eps)) end
    d.eps = opts.eps
  end
  if opts.dtype ~= nil then d.dtype = core.code(core.dtypes, opts.dtype, "dtype", where) end
  d.device = core.device(opts.device, where)
  if opts.seed ~= nil then d.seed = chk.seed(opts.seed, "seed", where) end
  d.accumulate_main_grad = chk.flag(opts.accumulate_main_grad, "accumulate_main_grad", where, 0, 4)
end

--- nn.LayerNormLinear: a norm over the last dim, then a Linear (in one pass where the recipe
-- lets the norm write the GEMM's FP8 input). Parameters: the norm's weight (and LayerNorm's
-- bias), then the Linear's weight (and bias).
-- @tparam integer in_features
-- @tparam integer out_features
-- @tparam[opt] table opts {normalization = "LayerNorm" | "RMSNorm", bias = true,
-- return_layernorm_output = false, zero_centered_gamma = false, eps = 1e-5, dtype = "f32",
-- device =, accumulate_main_grad = false, seed =, parallel_mode = "column", tp_group =,
-- sequence_parallel = false, name =} (tensor parallel: column only, the features are the full
-- layer's; name: what a factory recipe is told)
-- @return the module
function M.LayerNormLinear(in_features, out_features, opts)
  local where = "lutra.nn.LayerNormLinear"
  opts = core.check_options(opts, { normalization = true, bias = true, eps = true,
    return_layernorm_output = true, zero_centered_gamma = true, dtype = true, device = true,
    accumulate_main_grad = true, seed = true, parallel_mode = true, tp_group = true,
    sequence_parallel = true, name = true }, where)
  if opts.name ~= nil then chk.string(opts.name, "name", where) end
  chk.integer(in_features, "in_features", where, 1, 2 ^ 53)
  chk.integer(out_features, "out_features", where, 1, 2 ^ 53)
  local d = ffi.new("lutra_layernorm_linear_desc")
  C.lutra_layernorm_linear_defaults(d)
  d.in_features = in_features
  d.out_features = out_features
  common(d, opts, where)
  d.return_layernorm_output = chk.flag(opts.return_layernorm_output, "return_layernorm_output",
                                       where, 0)
  -- tensor parallel (lutra/tp_modules.h): column only; the features given are the full layer's
  if opts.parallel_mode ~= nil or opts.tp_group ~= nil or opts.sequence_parallel ~= nil then
    local tp
    if opts.parallel_mode == "row" then
      -- refused whatever the group (as TransformerEngine refuses it): the C call says why
      tp = ffi.new("lutra_tp_desc", { mode = C.LUTRA_TP_ROW })
    else
      tp = require("lutra.dist").tp_desc(opts, where)
    end
    check(C.lutra_layernorm_linear_parallel_new(d, tp, module_box))
    return core.set_name(own(module_box[0]), opts.name)
  end
  check(C.lutra_layernorm_linear_new(d, module_box))
  return core.set_name(own(module_box[0]), opts.name)
end

--- nn.LayerNormMLP: norm -> FC1 -> activation -> FC2 (gated activations: FC1 gives
-- 2 * ffn_hidden). "gelu" is the tanh GELU (TransformerEngine's).
-- @tparam integer hidden the input's and the output's last dim
-- @tparam integer ffn_hidden FC1's output width (before a gated activation halves it)
-- @tparam[opt] table opts {normalization = "LayerNorm" | "RMSNorm", activation = "gelu" |
-- "relu" | "silu" | "swiglu" | "geglu" | "reglu" | "qgelu" | "srelu" | "tanh", bias,
-- zero_centered_gamma, eps, dtype, device, accumulate_main_grad, seed, tp_group,
-- sequence_parallel} (with tp_group, FC1 is column- and FC2 row-parallel; hidden and ffn_hidden
-- are the full layer's)
-- @return the module
function M.LayerNormMLP(hidden, ffn_hidden, opts)
  local where = "lutra.nn.LayerNormMLP"
  opts = core.check_options(opts, { normalization = true, activation = true, bias = true,
    eps = true, zero_centered_gamma = true, dtype = true, device = true,
    accumulate_main_grad = true, seed = true, tp_group = true, sequence_parallel = true,
    parallel_mode = true }, where)
  chk.integer(hidden, "hidden", where, 1, 2 ^ 52)
  chk.integer(ffn_hidden, "ffn_hidden", where, 1, 2 ^ 52)
  local d = ffi.new("lutra_layernorm_mlp_desc")
  C.lutra_layernorm_mlp_defaults(d)
  d.hidden = hidden
  d.ffn_hidden = ffn_hidden
  if opts.activation ~= nil then
    d.activation = core.code(M.activations, opts.activation, "activation", where)
  end
  common(d, opts, where)
  if opts.parallel_mode ~= nil then
    chk.fail(where, "parallel_mode is not an option: with tp_group, FC1 is column- and FC2 "
             .. "row-parallel")
  end
  -- tensor parallel over tp_group (lutra/tp_modules.h); hidden and ffn_hidden are the full layer's
  if opts.tp_group ~= nil or opts.sequence_parallel ~= nil then
    local t = require("lutra.dist").tp_desc({ parallel_mode = "column", tp_group = opts.tp_group,
      sequence_parallel = opts.sequence_parallel }, where)
    t.mode = C.LUTRA_TP_NONE
    check(C.lutra_layernorm_mlp_parallel_new(d, t, module_box))
    return own(module_box[0])
  end
  check(C.lutra_layernorm_mlp_new(d, module_box))
  return own(module_box[0])
end

--- nn.Residual: y = x + m(x); its backward gives dx = dy + m's input gradient; its parameters
-- are m's (it holds a reference to m). Where m's last kernel can, it makes the sum (a Linear's
-- GEMM adds x in its epilogue, a norm's backward or a Linear's dgrad GEMM adds dy): one
-- rounding, no launch of its own.
-- @param m a module whose output has its input's shape
-- @return the module
function M.Residual(m)
  if not chk.is_module(m) then
    error(string.format("lutra.nn.Residual: argument must be a module (got %s)", chk.got(m)), 2)
  end
  check(C.lutra_residual_new(m, module_box))
  return own(module_box[0])
end

--- lutra.norm_quantize: the norm of x written FP8 by q's scaling in one pass.
-- @param q a quantizer (lutra.quantizer)
-- @param x the input tensor, normalized over its last dim
-- @param gamma the norm's weight
-- @param beta the norm's bias (ignored, may be nil, with rms)
-- @tparam[opt] table opts {eps = 1e-5, rms = false, zero_centered_gamma = false, y = nil}; y,
-- when given, gets the high-precision output too
-- @return q's output tensor (owned by q)
function M.norm_quantize(q, x, gamma, beta, opts)
  local where = "lutra.norm_quantize"
  opts = core.check_options(opts, { eps = true, rms = true, zero_centered_gamma = true, y = true },
                            where)
  chk.tensor(x, "x", where)
  chk.tensor(gamma, "gamma", where)
  local rms = chk.flag(opts.rms, "rms", where, 0)
  if rms == 0 then chk.tensor(beta, "beta", where) end
  local eps = 1e-5
  if opts.eps ~= nil then eps = chk.finite(opts.eps, "eps", where) end
  if opts.y ~= nil then chk.tensor(opts.y, "y", where) end
  local zc = chk.flag(opts.zero_centered_gamma, "zero_centered_gamma", where, 0)
  if C.lutra_norm_quantize(q, x, gamma, rms == 0 and beta or nil, eps, rms, zc, opts.y,
                           core.tensor_box) ~= 0 then
    core.fail()
  end
  return borrow(core.tensor_box[0], q)
end

--- A LayerNormLinear's own methods, beside those of every module (lutra.nn's Module).
-- @type LayerNormLinear

--- The norm's output of the last forward (a module made with return_layernorm_output).
-- @return a tensor owned by the module
function LayerNormLinear:layernorm_output()
  if C.lutra_layernorm_linear_ln_output(self, core.tensor_box) ~= 0 then core.fail() end
  return borrow(core.tensor_box[0], self)
end

--- Whether the last forward's norm wrote the GEMM's FP8 input itself.
-- @treturn boolean
function LayerNormLinear:norm_fused()
  check(C.lutra_layernorm_linear_fused(self, core.int_box))
  return core.int_box[0] ~= 0
end

--- A LayerNormMLP's own methods, beside those of every module (lutra.nn's Module).
-- @type LayerNormMLP

local fusion_box = ffi.new("int[2]")
--- The Linear+activation pairs its last forward and backward ran fused.
-- @return forward, backward: counts
function LayerNormMLP:mlp_fusions()
  check(C.lutra_layernorm_mlp_fusions(self, fusion_box, fusion_box + 1))
  return fusion_box[0], fusion_box[1]
end

local methods = require("lutra.module_methods")
methods.define("layernorm_linear", "LayerNormLinear", LayerNormLinear)
methods.define("layernorm_mlp", "LayerNormMLP", LayerNormMLP)
methods.define("residual", "Residual")

return M
