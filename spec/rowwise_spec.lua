-- Rowwise scaling (torchao's ROWWISE; lutra/formats.h, src/backend/cpu/rowwise_cpu.c): every row
-- of the rowwise copy, and every column of x in the columnwise copy, quantized bit for bit as
-- current scaling quantizes a tensor whose rows are all that row (same amax, same scale rule),
-- and a Linear's forward equal to a high-precision Linear fed the dequantized operands.
local lutra = require("lutra")
local ffi = require("ffi")
local R = lutra.recipe
local dequant_linear = require("spec.support.dequant_linear")

-- a 16 x n tensor whose every row is v (a Lua array of n values)
local function repeated(v)
  local t = {}
  for r = 0, 15 do
    for i = 1, #v do t[r * #v + i] = v[i] end
  end
  return lutra.from_table(t, { 16, #v })
end

describe("rowwise scaling", function()
  for _, p2 in ipairs { true, false } do
    it("quantizes each row and column as current scaling quantizes it alone (power_2_scale "
       .. tostring(p2) .. ")", function()
      local rows, cols = 32, 48
      local x = lutra.tensor({ rows, cols }):randn(3, 0, 1)
      -- rows of very different magnitudes, so one scale per tensor would not do
      local v = x:to_table()
      for r = 0, rows - 1 do
        for c = 1, cols do v[r * cols + c] = v[r * cols + c] * 2 ^ (r % 9 - 4) end
      end
      x = lutra.from_table(v, { rows, cols })
      local q = lutra.quantizer(R.rowwise { power_2_scale = p2 }, "input")
      local xq = q:quantize(x)
      assert.are.equal("rowwise", xq:scaling_name())
      local row_bytes, col_bytes = xq:bytes(false), xq:bytes(true)
      local sc = ffi.cast("const float*", xq.scale_inv)
      local csc = ffi.cast("const float*", xq.col_scale_inv)
      local cq = lutra.quantizer(R.current { power_2_scale = p2, fp8_format = "e4m3" }, "input",
                                 { columnwise = false })
      for r = 0, rows - 1 do
        local line = {}
        for c = 1, cols do line[c] = v[r * cols + c] end
        local ref = cq:quantize(repeated(line))
        assert.are.equal(ref:bytes(false):sub(1, cols), row_bytes:sub(r * cols + 1, (r + 1) * cols),
                         "row " .. r)
        assert.are.equal(ffi.cast("const float*", ref.scale_inv)[0], sc[r], "row scale " .. r)
      end
      for c = 0, cols - 1 do
        local line = {}
        for r = 0, rows - 1 do line[r + 1] = v[r * cols + c + 1] end
        local ref = cq:quantize(repeated(line))
        assert.are.equal(ref:bytes(false):sub(1, rows), col_bytes:sub(c * rows + 1, (c + 1) * rows),
                         "column " .. c)
        assert.are.equal(ffi.cast("const float*", ref.scale_inv)[0], csc[c], "column scale " .. c)
      end
    end)
  end

  it("runs a Linear: the forward as a high-precision Linear fed the dequantized operands", function()
    -- the backward runs in FP8 and lands near the f32 input gradient: two E4M3 operands (3
    -- mantissa bits), NMSE about 1e-3; 1e-2 catches a wrong scale or layout
    local nmse, err = dequant_linear(R.rowwise())
    assert.is_true(nmse < 1e-2, "NMSE " .. nmse)
    assert.is_true(err > 0) -- it did quantize
  end)

  it("is a custom and factory kind, and refuses what it cannot fuse", function()
    local r = R.custom { input = { kind = "rowwise" }, weight = { kind = "rowwise" },
                         grad_output = { kind = "current", format = "e5m2" } }
    assert.are.same({ "rowwise", "e4m3" }, { r:role("weight") })
    local ok, err = pcall(R.rowwise, { fp8_format = "e5m2" })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("fp8_format must be", 1, true))
    local q = lutra.quantizer(R.rowwise(), "grad_output")
    local dy = lutra.tensor({ 16, 16 }):randn(1)
    local db = lutra.tensor({ 16 })
    q:quantize_dbias(dy, db) -- the bias gradient is summed after the quantization
    local want = {}
    local v = dy:to_table()
    for c = 1, 16 do
      local s = 0
      for r = 0, 15 do s = s + v[r * 16 + c] end
      want[c] = s
    end
    for c, got in ipairs(db:to_table()) do assert.is_true(math.abs(got - want[c]) < 1e-5) end
  end)
end)
