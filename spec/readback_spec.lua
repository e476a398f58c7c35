-- Values read back into Lua: i32 tensors (labels) as integers (lutra_tensor_get_i32), and NaNs
-- whose payload is one of LuaJIT's type tags (issue 40: a NaN of 0xFFFFFFFF in a loss's input
-- made loss:value() a nil-typed value that `v ~= v` missed, and left a hole in to_table()).
-- Every float the C core hands to the host has its NaNs made the one quiet NaN.
local lutra = require("lutra")
local ffi = require("ffi")
local C = require("lutra.core").C

local function is_nan_number(v)
  return type(v) == "number" and v ~= v
end

describe("reading tensors back", function()
  it("to_table returns an i32 tensor's values as integers", function()
    local n = 37
    local want = {}
    for i = 1, n do want[i] = math.random(-2 ^ 31, 2 ^ 31 - 1) end
    want[1], want[2] = -2 ^ 31, 2 ^ 31 - 1
    local t = lutra.tensor({n}, "i32")
    t:set(want)
    assert.are.same(want, t:to_table())
    -- the f32 reader says what to use instead
    local buf = ffi.new("float[?]", n)
    assert.are.equal(C.LUTRA_EINVAL, C.lutra_tensor_get_f32(t, buf, n))
    assert.matches("read it with lutra_tensor_get_i32", ffi.string(C.lutra_last_error()), 1, true)
    -- and lutra_tensor_get_i32 refuses a float tensor and a wrong count
    local ibuf = ffi.new("int32_t[?]", n)
    assert.are.equal(C.LUTRA_EINVAL, C.lutra_tensor_get_i32(lutra.tensor({n}), ibuf, n))
    assert.matches("lutra_tensor_get_i32: tensor dtype f32 is not i32",
                   ffi.string(C.lutra_last_error()), 1, true)
    assert.are.equal(C.LUTRA_EINVAL, C.lutra_tensor_get_i32(t, ibuf, n - 1))
  end)

  -- payloads whose widened double carries a LuaJIT tag in its upper word (0xFFFFFFFF: nil),
  -- and ordinary ones
  for _, bits in ipairs({ 0xFFFFFFFF, 0xFFFFFFFE, 0xFFFF0001, 0xFFC00000, 0x7FFFFFFF, 0x7FC00000 }) do
    it(string.format("hands a NaN of 0x%08X to Lua as a NaN number", bits), function()
      local rows, cols = 4, 8
      local x = lutra.tensor({rows, cols}):randn(math.random(1, 2 ^ 30))
      local target = lutra.tensor({rows, cols}):randn(math.random(1, 2 ^ 30))
      local buf = x:read()
      local at = math.random(0, rows * cols - 1)
      ffi.cast("uint32_t *", buf)[at] = bits
      x:set(buf)
      local values = x:to_table()
      assert.are.equal(rows * cols, #values)
      for i = 1, rows * cols do assert.are.equal("number", type(values[i])) end
      assert.is_true(is_nan_number(values[at + 1]))
      assert.is_true(is_nan_number(x:read()[at]))
      assert.are.equal("number", type(x:absmax())) -- the amax skips NaNs; whatever it is, a number
      local loss = lutra.nn.MSELoss()
      loss:forward(x, target)
      assert.is_true(is_nan_number(loss:value()))
      local one = lutra.tensor({1})
      local b = ffi.new("float[1]")
      ffi.cast("uint32_t *", b)[0] = bits
      one:set(b)
      assert.is_true(is_nan_number(one:item()))
    end)
  end
end)
