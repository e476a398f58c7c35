--- Quantizers: one role of a recipe, usable on its own (to inspect FP8 data and scales) and used
-- by Linear internally.
--   local q = lutra.quantizer(recipe, "input", {rowwise=true, columnwise=true})
--   local xq = q:quantize(x)          -- FP8 tensor owned by q, reused while x's shape stays
--   local scale, scale_inv = q:scale() -- delayed and current scaling
-- The FP8 tensor belongs to q and keeps q alive while referenced; after q:destroy(), or once a
-- quantize of a new shape replaced it, using it is an error ("tensor ... was freed").
-- @module lutra.quantizer
local core = require("lutra.core")
local chk = require("lutra.check")
local borrow = require("lutra.tensor").borrow
local ffi, C, check = core.ffi, core.C, core.check

local M = {}
local Quantizer = {}
Quantizer.__index = Quantizer

--- lutra.quantizer(recipe, role, opts): the quantizer of one role of a recipe.
--
-- @param recipe a recipe (lutra.recipe.*)
-- @tparam string role "input", "weight" or "grad_output"
--
-- @tparam[opt] table opts {rowwise = true, columnwise = true, device =}
function M.new(recipe, role, opts)
  local where = "lutra.quantizer"
  opts = core.check_options(opts, { rowwise = true, columnwise = true, device = true }, where)
  if recipe ~= nil and not ffi.istype(chk.recipe_t, recipe) then
    error(string.format("%s: recipe must be a recipe (got %s)", where, chk.got(recipe)), 2)
  end
  local r = core.code(core.roles, role, "role", where)
  local rowwise = chk.flag(opts.rowwise, "rowwise", where, 1)
  local columnwise = chk.flag(opts.columnwise, "columnwise", where, 1)
  local box = ffi.new("lutra_quantizer*[1]")
  check(C.lutra_quantizer_new(recipe, r, rowwise, columnwise,
                              core.device(opts.device, where), box))
  return ffi.gc(box[0], C.lutra_quantizer_unref)
end

--- A quantizer (lutra.quantizer(...), or module:quantizer(role)).
-- @type Quantizer

--- Quantizes x to FP8.
-- @param x an f32/bf16/f16 tensor
--
-- @return the FP8 tensor, owned by the quantizer and reused by its next call
function Quantizer:quantize(x)
  chk.tensor(x, "x", "quantizer:quantize")
  if C.lutra_quantize(self, x, core.tensor_box) ~= 0 then core.fail() end
  return borrow(core.tensor_box[0], self)
end

--- Quantizes x and writes its bias gradient (the column sums) into dbias in the same pass.
-- @param x an f32/bf16/f16 tensor [rows, cols]
-- @param dbias a tensor [cols]
-- @tparam[opt] boolean accumulate true: adds to dbias instead of overwriting it
-- @return the FP8 tensor, owned by the quantizer
function Quantizer:quantize_dbias(x, dbias, accumulate)
  local where = "quantizer:quantize_dbias"
  chk.tensor(x, "x", where)
  chk.tensor(dbias, "dbias", where)
  local acc = chk.flag(accumulate, "accumulate", where, 0)
  if C.lutra_quantize_dbias(self, x, dbias, acc, core.tensor_box) ~= 0 then
    core.fail()
  end
  return borrow(core.tensor_box[0], self)
end

--- Quantizes x unless skip is nonzero when the work runs: then nothing is written (codes,
-- scales, amax, history, dbias keep their values). For CUDA graphs of gradient accumulation.
-- @param x an f32/bf16/f16 tensor
-- @param skip an i32 tensor of one element on the quantizer's device
-- @param[opt] dbias as quantize_dbias
-- @tparam[opt] boolean accumulate as quantize_dbias
-- @return the FP8 tensor, owned by the quantizer
function Quantizer:quantize_skip(x, skip, dbias, accumulate)
  local where = "quantizer:quantize_skip"
  chk.tensor(x, "x", where)
  chk.tensor(skip, "skip", where)
  chk.tensor(dbias, "dbias", where)
  local acc = chk.flag(accumulate, "accumulate", where, 0)
  if C.lutra_quantize_skip(self, x, skip, dbias, acc, core.tensor_box) ~= 0 then
    core.fail()
  end
  return borrow(core.tensor_box[0], self)
end

--- Delayed scaling: updates scale and scale_inv from the amax history now.
function Quantizer:update() check(C.lutra_quantizer_update(self)) end

--- The current scale and scale_inv (per-tensor recipes).
-- @return scale, scale_inv
function Quantizer:scale()
  local b = core.float_box
  check(C.lutra_quantizer_scale(self, b, b + 1))
  return b[0], b[1]
end

--- The last n amaxes of the delayed-scaling history, newest first.
--
-- @tparam integer n
-- @treturn table
function Quantizer:history(n)
  chk.integer(n, "n", "quantizer:history", 1, 2 ^ 20)
  local buf = ffi.new("float[?]", n)
  check(C.lutra_quantizer_history(self, buf, n))
  local t = {}
  for i = 1, n do t[i] = buf[i - 1] end
  return t
end

--- Delayed scaling: the length of the amax history.
--
-- @treturn int
function Quantizer:history_len()
  check(C.lutra_quantizer_history_len(self, core.int_box))
  return core.int_box[0]
end

--- Records an amax into the history as a quantization would (for tests and calibration).
--
-- @tparam number v
function Quantizer:record_amax(v)
  chk.number(v, "amax", "quantizer:record_amax")
  check(C.lutra_quantizer_record_amax(self, v))
end

--- Frees the quantizer now; tensors it returned become freed.
function Quantizer:destroy() check(C.lutra_quantizer_destroy(self)) end

ffi.metatype("struct lutra_quantizer", { __index = Quantizer })

--- @section end

--- lutra.dequantize(q, out, columnwise?): FP8 -> out's dtype. The columnwise copy comes out
-- transposed ([cols, rows]).
function M.dequantize(q, out, columnwise)
  chk.tensor(q, "q", "lutra.dequantize")
  chk.tensor(out, "out", "lutra.dequantize")
  columnwise = chk.flag(columnwise, "columnwise", "lutra.dequantize", 0) == 1
  check(C.lutra_dequantize(q, columnwise and 1 or 0, out))
  return out
end

return M
