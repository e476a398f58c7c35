-- Bitwise comparison of two runs' results for the determinism specs (spec/determinism_spec.lua,
-- spec/gpu/determinism_gpu.lua): lists of values or of byte strings, in the same order.
local assert = require("luassert")

local M = {}

-- the index of the first element that differs, or nil when every one is equal
function M.first_difference(a, b)
  assert.are.equal(#a, #b, "element counts")
  for i = 1, #a do
    if a[i] ~= b[i] then return i end
  end
end

return M
