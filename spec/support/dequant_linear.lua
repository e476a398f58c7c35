-- A Linear(64, 32) under a scaled recipe against a high-precision Linear fed its dequantized
-- operands (spec/rowwise_spec.lua, spec/nvfp4_train_spec.lua): the forward's output must equal
-- the high-precision Linear's, bit for bit, with round (when given) applied to both dequantized
-- operands first, as the GEMM does; the backward runs quantized and is compared with an f32
-- Linear's input gradient. Returns that gradient's NMSE and its squared error (0 when nothing was
-- quantized): the caller asserts its format's band.
local lutra = require("lutra")
local assert = require("luassert")
local nn = lutra.nn

return function(recipe, round)
  round = round or function(t) return t end
  local lin = nn.Linear(64, 32, { seed = 4 })
  local ref = nn.Linear(64, 32, { seed = 4 })
  local x = lutra.tensor({ 32, 64 }):randn(5, 0, 3)
  local scope = lutra.autocast { recipe = recipe }
  scope:enter()
  local y = lin:forward(x):to_table()
  local xd, wd = lutra.tensor({ 32, 64 }), lutra.tensor({ 32, 64 })
  lutra.dequantize(lin:quantizer("input"):quantize(x), xd)
  lutra.dequantize(lin:quantizer("weight"):quantize(lin:parameters()[1].value), wd)
  scope:exit()
  ref:parameters()[1].value:copy(round(wd))
  assert.are.same(ref:forward(round(xd)):to_table(), y)
  local dy = lutra.tensor({ 32, 32 }):randn(6)
  local g = lin:backward(dy):to_table()
  local f32 = nn.Linear(64, 32, { seed = 4 })
  f32:forward(x)
  local gr = f32:backward(dy):to_table()
  local num, den = 0, 0
  for i, a in ipairs(g) do num, den = num + (a - gr[i]) ^ 2, den + gr[i] ^ 2 end
  return num / den, num
end
