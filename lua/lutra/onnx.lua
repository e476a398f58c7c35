--- ONNX export: a trained module tree as an ONNX model, for inference in an engine's ONNX
-- runtime (ONNX Runtime, Unity Sentis, Unreal NNE, Godot through onnxruntime).
--   lutra.export_onnx(net, "policy.onnx", {input_shape = {0, 64}})
-- options (a table):
--   input_shape  the input's dims (1 to 4 of them; the last, the features, must be given); a dim
--                of 0 is dynamic (named "batch" for the first)
--   opset        the ONNX opset, 17 (default) to 21
--   input_name, output_name  the graph's value names (default "input", "output")
-- Supported kinds: sequential, linear, layernorm, rmsnorm, layernorm_linear, layernorm_mlp,
-- residual and the activations; another kind anywhere in the tree is refused with an error
-- naming it and its place, and nothing is written. Parameters are exported as f32; a linear
-- layer whose last forward ran in FP8 is exported with that FP8 weight dequantized, which the
-- model's metadata says (src/lutra/onnx.h has the operators each kind becomes).
-- @module lutra.onnx
local core = require("lutra.core")
local chk = require("lutra.check")
local ffi, C, check = core.ffi, core.C, core.check

local M = {}
local option_keys = { input_shape = true, opset = true, input_name = true, output_name = true }

local function name_of(v, name, where)
  if v ~= nil and (type(v) ~= "string" or v == "" or v:find("\0", 1, true)) then
    chk.fail(where, "%s must be a non-empty string without NUL bytes (got %s)", name, chk.got(v))
  end
  return v
end

--- lutra.onnx_available: whether this library was built with ONNX export (the Makefile's ONNX:
-- on where protoc-c and protobuf-c's header were found); without it export_onnx refuses.
-- @treturn boolean
function M.onnx_available() return C.lutra_onnx_available() == 1 end

--- lutra.export_onnx: writes module's forward as an ONNX model.
-- @param module the module tree
-- @tparam string path the .onnx file (replaced when it exists)
-- @tparam table opts {input_shape =, opset =, input_name =, output_name =} (see above)
-- @treturn string path
function M.export_onnx(module, path, opts)
  local where = "lutra.export_onnx"
  if not chk.is_module(module) then
    chk.fail(where, "module must be a lutra module (got %s)", chk.got(module))
  end
  chk.path(path, "path", where)
  opts = core.check_options(opts, option_keys, where)
  local shape = opts.input_shape
  if type(shape) ~= "table" or #shape < 1 or #shape > C.LUTRA_MAX_DIMS then
    chk.fail(where, "input_shape must be a table of 1 to %d dims, like {0, 64} (got %s)",
             C.LUTRA_MAX_DIMS, chk.got(shape))
  end
  local o = ffi.new("lutra_onnx_options")
  C.lutra_onnx_defaults(o)
  o.ndim = #shape
  for i = 1, #shape do
    o.input_shape[i - 1] = chk.integer(shape[i], "input_shape[" .. i .. "]", where, 0)
  end
  if opts.opset ~= nil then o.opset = chk.integer(opts.opset, "opset", where) end
  -- the names' Lua strings stay referenced by opts until the call returned
  o.input_name = name_of(opts.input_name, "input_name", where) or o.input_name
  o.output_name = name_of(opts.output_name, "output_name", where) or o.output_name
  check(C.lutra_export_onnx(module, path, o))
  return path
end

return M
