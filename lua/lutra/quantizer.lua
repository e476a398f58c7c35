-- Quantizers: one role of a recipe, usable on its own (to inspect FP8 data and scales) and used
-- by Linear internally.
--   local q = lutra.quantizer(recipe, "input", {rowwise=true, columnwise=true})
--   local xq = q:quantize(x)          -- FP8 tensor owned by q, reused while x's shape stays
--   local scale, scale_inv = q:scale() -- delayed and current scaling
-- The FP8 tensor belongs to q: keep q referenced while using it (the GC frees it with q).
local core = require("lutra.core")
local ffi, C, check = core.ffi, core.C, core.check

local M = {}
local Quantizer = {}
Quantizer.__index = Quantizer

function M.new(recipe, role, opts)
  local where = "lutra.quantizer"
  opts = core.check_options(opts, { rowwise = true, columnwise = true, device = true }, where)
  local r = core.code(core.roles, role, "role", where)
  local rowwise = opts.rowwise == nil or opts.rowwise
  local columnwise = opts.columnwise == nil or opts.columnwise
  local box = ffi.new("lutra_quantizer*[1]")
  check(C.lutra_quantizer_new(recipe, r, rowwise and 1 or 0, columnwise and 1 or 0,
                              core.device(opts.device, where), box))
  return ffi.gc(box[0], C.lutra_quantizer_free)
end

function Quantizer:quantize(x)
  if C.lutra_quantize(self, x, core.tensor_box) ~= 0 then core.fail() end
  return core.tensor_box[0]
end

-- quantize x and write its bias gradient (column sums) into dbias; accumulate adds to dbias
function Quantizer:quantize_dbias(x, dbias, accumulate)
  if C.lutra_quantize_dbias(self, x, dbias, accumulate and 1 or 0, core.tensor_box) ~= 0 then
    core.fail()
  end
  return core.tensor_box[0]
end

-- quantize x unless skip (an i32 tensor of one element on q's device) is nonzero when the work
-- runs: then nothing is written (codes, scales, amax, history, dbias keep their values).
-- dbias (optional): as quantize_dbias.
function Quantizer:quantize_skip(x, skip, dbias, accumulate)
  if C.lutra_quantize_skip(self, x, skip, dbias, accumulate and 1 or 0, core.tensor_box) ~= 0 then
    core.fail()
  end
  return core.tensor_box[0]
end

function Quantizer:update() check(C.lutra_quantizer_update(self)) end

function Quantizer:scale()
  local b = core.float_box
  check(C.lutra_quantizer_scale(self, b, b + 1))
  return b[0], b[1]
end

function Quantizer:history(n)
  local buf = ffi.new("float[?]", n)
  check(C.lutra_quantizer_history(self, buf, n))
  local t = {}
  for i = 1, n do t[i] = buf[i - 1] end
  return t
end

function Quantizer:record_amax(v) check(C.lutra_quantizer_record_amax(self, v)) end

function Quantizer:free() check(C.lutra_quantizer_release(self)) end

ffi.metatype("struct lutra_quantizer", { __index = Quantizer })

-- lutra.dequantize(q, out, columnwise?): FP8 -> out's dtype. The columnwise copy comes out
-- transposed ([cols, rows]).
function M.dequantize(q, out, columnwise)
  check(C.lutra_dequantize(q, columnwise and 1 or 0, out))
  return out
end

return M
