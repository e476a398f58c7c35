-- lutra_quantize_dbias on the CPU backend (the reference): the bias gradient of x (its column
-- sums) written along with the quantization, as TransformerEngine's quantize_dbias does for
-- grad_output. Checked against FP64 column sums computed here, for every recipe; the FP8
-- output must be the one lutra_quantize gives; bad dbias tensors are refused and left alone.
local lutra = require("lutra")
local R = lutra.recipe

local RECIPES = {
  { name = "delayed", make = function() return R.delayed { amax_history_len = 4 } end },
  { name = "current", make = function() return R.current {} end },
  { name = "mxfp8", make = function() return R.mxfp8 {} end },
  { name = "block", make = function() return R.block {} end },
}

-- FP64 column sums of x [rows, cols], and the column sums of |x| (the error scale)
local function col_sums(x, rows, cols)
  local v = x:read()
  local sum, mag = {}, {}
  for c = 0, cols - 1 do
    local s, m = 0, 0
    for r = 0, rows - 1 do
      local e = v[r * cols + c]
      s, m = s + e, m + math.abs(e)
    end
    sum[c], mag[c] = s, m
  end
  return sum, mag
end

-- every element of got within tol * (mag + |want|) of want
local function assert_close(got, want, mag, tol, what)
  local g = got:read()
  for c = 0, got:size() - 1 do
    local err = math.abs(g[c] - want[c])
    if not (err <= tol * (mag[c] + math.abs(want[c]))) then
      error(string.format("%s: dbias[%d] = %.9g, FP64 reference %.9g (error %.3g, bound %.3g)",
        what, c, g[c], want[c], err, tol * (mag[c] + math.abs(want[c]))), 2)
    end
  end
end

describe("lutra_quantize_dbias", function()
  for _, rc in ipairs(RECIPES) do
    for _, dt in ipairs { "f32", "bf16" } do
      it(rc.name .. " recipe, " .. dt .. " input: column sums and unchanged FP8 output", function()
        local rows, cols = 96, 160
        local seed = math.random(1, 2 ^ 30)
        local x = lutra.tensor({ rows, cols }, dt):randn(seed, 0.5, 2)
        local want, mag = col_sums(x, rows, cols)
        local r = rc.make()
        local q = lutra.quantizer(r, "grad_output")
        local plain = lutra.quantizer(r, "grad_output")
        local ref = plain:quantize(x)
        for _, bdt in ipairs { "f32", "bf16" } do
          local tol = bdt == "f32" and 2 ^ -23 or 2 ^ -8
          local db = lutra.tensor({ cols }, bdt):fill(0 / 0)
          local xq = q:quantize_dbias(x, db)
          assert_close(db, want, mag, tol, rc.name .. " " .. dt .. " -> " .. bdt)
          assert.are.equal(ref:bytes(), xq:bytes(), "rowwise codes")
          assert.are.equal(ref:bytes(true), xq:bytes(true), "columnwise codes")
          -- accumulate: dbias + column sums
          local init = lutra.tensor({ cols }, bdt):randn(seed + 1)
          local base = init:read()
          local acc, accmag = {}, {}
          for c = 0, cols - 1 do
            acc[c], accmag[c] = base[c] + want[c], mag[c] + math.abs(base[c])
          end
          q:quantize_dbias(x, init, true)
          assert_close(init, acc, accmag, tol, rc.name .. " accumulate " .. bdt)
        end
      end)
    end
  end

  it("refuses a bad dbias and changes nothing", function()
    local x = lutra.tensor({ 32, 64 }, "f32"):randn(7)
    local q = lutra.quantizer(R.delayed {}, "grad_output")
    local before = q:history(1)[1]
    local cases = {
      { lutra.tensor({ 63 }, "f32"):fill(3), "dbias has 63 elements, x has 64 columns" },
      { lutra.tensor({ 64 }, "i32"), "dbias dtype i32 is not f32, bf16 or f16" },
    }
    for _, case in ipairs(cases) do
      local db, msg = case[1], case[2]
      local ok, err = pcall(q.quantize_dbias, q, x, db)
      assert.is_false(ok)
      assert.matches("lutra_quantize_dbias", err, 1, true)
      assert.matches(msg, err, 1, true)
      if db:dtype_name() ~= "i32" then
        for _, v in ipairs(db:to_table()) do assert.are.equal(3, v) end
      end
      assert.are.equal(before, q:history(1)[1], "no amax recorded by a refused call")
    end
    local ok, err = pcall(q.quantize_dbias, q, x, x)
    assert.is_false(ok)
    assert.matches("lutra_quantize_dbias", err, 1, true)
  end)

  it("gives Linear's bias gradient in FP8 backward (fused path) as the column sums of dy", function()
    local N, IN, OUT = 64, 32, 48
    local lin = lutra.nn.Linear(IN, OUT)
    local x = lutra.tensor({ N, IN }, "f32"):randn(11)
    local dy = lutra.tensor({ N, OUT }, "f32"):randn(12)
    local want, mag = col_sums(dy, N, OUT)
    local scope = lutra.autocast { recipe = R.current {} }
    scope:run(function() lin:forward(x) end)
    lin:backward(dy)
    assert_close(lin:parameters()[2].grad, want, mag, 2 ^ -23, "Linear FP8 bias grad")
  end)
end)
