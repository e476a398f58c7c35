-- nn.Linear against references computed in double on the Lua side.
--   y  = x W^T + b        dx = dy W        dW = dy^T x        db = sum over rows of dy
--
-- Tolerances (elementwise, scale_i = sum over the dot product of |a_k b_k|, plus |b| for y):
--   f32:            |got - ref| <= 1e-5 * scale_i + 1e-6        (f32 accumulation only)
--   bf16 outputs:   |got - ref| <= 2^-8 * |ref| + 1e-5 * scale_i + 1e-6
--                   (inputs and weights are bf16 values, so the reference uses them exactly;
--                    the result is rounded once to bf16: at most 2^-9 relative, doubled)
--   FP8 vs dequantized operands: the f32 tolerance above (the GEMM only adds f32 rounding).
--   FP8 vs f32 (quantization error):
--     elementwise worst case: E4M3 rounds to 2^-4 relative, so a product of two E4M3 values
--       is off by at most (1 + 2^-4)^2 - 1 < 0.13 relative; E5M2 (grad_output under HYBRID)
--       rounds to 2^-3, so an E5M2 x E4M3 product is off by at most 0.20. Bound:
--       |fp8 - f32| <= 0.13 (0.20 for dgrad/wgrad) * scale_i + 1e-3 (subnormal slack)
--     whole tensor: ||fp8 - f32|| / ||f32|| <= 0.08 forward (measured ~0.036) and
--       <= 0.12 backward (measured ~0.056 with E5M2, ~0.036 with E4M3).
local lutra = require("lutra")

local F32_RTOL, F32_ATOL = 1e-5, 1e-6
local BF16_RTOL = 2 ^ -8

local recipes = {
  { name = "delayed", make = function() return lutra.recipe.delayed{ amax_history_len = 16 } end,
    scaling = { input = "tensor", weight = "tensor" } },
  { name = "current", make = function() return lutra.recipe.current{} end,
    scaling = { input = "tensor", weight = "tensor" } },
  { name = "mxfp8", make = function() return lutra.recipe.mxfp8{} end,
    scaling = { input = "mxfp8", weight = "mxfp8" } },
  { name = "block", make = function() return lutra.recipe.block{} end,
    scaling = { input = "block_1d", weight = "block_2d" } },
}

-- References in double. Matrices are flat Lua arrays, row-major.
-- y[n][o] = sum_k x[n][k] w[o][k] + b[o]; also returns scale[n][o] = sum |x w| + |b|
local function ref_forward(x, w, b, N, IN, OUT)
  local y, scale = {}, {}
  for n = 0, N - 1 do
    for o = 0, OUT - 1 do
      local s, a = 0, 0
      for k = 1, IN do
        local t = x[n * IN + k] * w[o * IN + k]
        s, a = s + t, a + math.abs(t)
      end
      if b then s, a = s + b[o + 1], a + math.abs(b[o + 1]) end
      y[n * OUT + o + 1], scale[n * OUT + o + 1] = s, a
    end
  end
  return y, scale
end

-- dx[n][k] = sum_o dy[n][o] w[o][k]
local function ref_dgrad(dy, w, N, IN, OUT)
  local dx, scale = {}, {}
  for n = 0, N - 1 do
    for k = 1, IN do
      local s, a = 0, 0
      for o = 0, OUT - 1 do
        local t = dy[n * OUT + o + 1] * w[o * IN + k]
        s, a = s + t, a + math.abs(t)
      end
      dx[n * IN + k], scale[n * IN + k] = s, a
    end
  end
  return dx, scale
end

-- dW[o][k] = sum_n dy[n][o] x[n][k]
local function ref_wgrad(dy, x, N, IN, OUT)
  local dw, scale = {}, {}
  for o = 0, OUT - 1 do
    for k = 1, IN do
      local s, a = 0, 0
      for n = 0, N - 1 do
        local t = dy[n * OUT + o + 1] * x[n * IN + k]
        s, a = s + t, a + math.abs(t)
      end
      dw[o * IN + k], scale[o * IN + k] = s, a
    end
  end
  return dw, scale
end

-- db[o] = sum_n dy[n][o]
local function ref_bgrad(dy, N, OUT)
  local db, scale = {}, {}
  for o = 1, OUT do
    local s, a = 0, 0
    for n = 0, N - 1 do
      s, a = s + dy[n * OUT + o], a + math.abs(dy[n * OUT + o])
    end
    db[o], scale[o] = s, a
  end
  return db, scale
end

local function add(a, b)
  local out = {}
  for i = 1, #a do out[i] = a[i] + b[i] end
  return out
end

-- |got - ref| <= rel * |ref| + rtol * scale + atol for every element
local function assert_close(got, ref, scale, what, rtol, atol, rel)
  rtol, atol, rel = rtol or F32_RTOL, atol or F32_ATOL, rel or 0
  assert.are.equal(#ref, #got, what .. ": element count")
  for i = 1, #ref do
    local tol = rel * math.abs(ref[i]) + rtol * scale[i] + atol
    if not (math.abs(got[i] - ref[i]) <= tol) then
      assert.is_true(false, string.format("%s: element %d is %.9g, reference %.9g (tolerance %.3g)",
                                          what, i, got[i], ref[i], tol))
    end
  end
end

local function rel_norm_err(got, ref)
  local num, den = 0, 0
  for i = 1, #ref do
    num = num + (got[i] - ref[i]) ^ 2
    den = den + ref[i] ^ 2
  end
  return math.sqrt(num / den)
end

local function assert_all_zero(t, what)
  for i, v in ipairs(t) do
    if v ~= 0 then
      assert.is_true(false, string.format("%s: element %d is %g, expected 0", what, i, v))
    end
  end
end

local function assert_equal_tables(a, b, what)
  assert.are.equal(#a, #b, what .. ": element count")
  for i = 1, #a do
    if a[i] ~= b[i] then
      assert.is_true(false, string.format("%s: element %d differs (%.9g vs %.9g)", what, i, a[i],
                                          b[i]))
    end
  end
end

local function differs(a, b)
  for i = 1, #a do if a[i] ~= b[i] then return true end end
  return false
end

describe("nn.Linear", function()
  it("f32 forward and backward match double references", function()
    local N, IN, OUT = 9, 24, 13
    local m = lutra.nn.Linear(IN, OUT, { seed = 7 })
    local p = m:parameters()
    assert.are.equal(2, #p)
    assert.are.same({ OUT, IN }, p[1].value:dims())
    assert.are.same({ OUT }, p[2].value:dims())
    local x = lutra.tensor({ N, IN }):randn(2001)
    local dy = lutra.tensor({ N, OUT }):randn(2002)
    local xv, w, b, g = x:to_table(), p[1].value:to_table(), p[2].value:to_table(), dy:to_table()

    local y = m:forward(x)
    assert.are.same({ N, OUT }, y:dims())
    local ry, sy = ref_forward(xv, w, b, N, IN, OUT)
    assert_close(y:to_table(), ry, sy, "y")

    local dx = m:backward(dy)
    assert.are.same({ N, IN }, dx:dims())
    local rdx, sdx = ref_dgrad(g, w, N, IN, OUT)
    assert_close(dx:to_table(), rdx, sdx, "dx")
    local rdw, sdw = ref_wgrad(g, xv, N, IN, OUT)
    assert_close(p[1].grad:to_table(), rdw, sdw, "dW")
    local rdb, sdb = ref_bgrad(g, N, OUT)
    assert_close(p[2].grad:to_table(), rdb, sdb, "db")
  end)

  it("initial weights follow torch: uniform(-1/sqrt(in), 1/sqrt(in)), seeded", function()
    local IN, OUT = 64, 16
    local a = lutra.nn.Linear(IN, OUT, { seed = 5 })
    local b = lutra.nn.Linear(IN, OUT, { seed = 5 })
    local c = lutra.nn.Linear(IN, OUT, { seed = 6 })
    local wa = a:parameters()[1].value:to_table()
    assert_equal_tables(wa, b:parameters()[1].value:to_table(), "same seed")
    assert.is_true(differs(wa, c:parameters()[1].value:to_table()), "different seeds agree")
    local bound, amax = 1 / math.sqrt(IN), 0
    for _, v in ipairs(wa) do amax = math.max(amax, math.abs(v)) end
    for _, v in ipairs(a:parameters()[2].value:to_table()) do amax = math.max(amax, math.abs(v)) end
    assert.is_true(amax <= bound * (1 + 1e-6) and amax > 0.8 * bound)
  end)

  it("bf16 parameters: forward and backward match double references within bf16 rounding",
     function()
    local N, IN, OUT = 8, 32, 12
    local m = lutra.nn.Linear(IN, OUT, { dtype = "bf16", seed = 8 })
    local p = m:parameters()
    assert.are.equal("bf16", p[1].value:dtype_name())
    assert.are.equal("bf16", p[2].value:dtype_name())
    local x = lutra.tensor({ N, IN }, "bf16"):randn(2011)
    local dy = lutra.tensor({ N, OUT }, "bf16"):randn(2012)
    local xv, w, b, g = x:to_table(), p[1].value:to_table(), p[2].value:to_table(), dy:to_table()

    local y = m:forward(x)
    assert.are.equal("bf16", y:dtype_name())
    assert.are.equal(2 * N * OUT, #y:bytes())
    local ry, sy = ref_forward(xv, w, b, N, IN, OUT)
    assert_close(y:to_table(), ry, sy, "bf16 y", F32_RTOL, F32_ATOL, BF16_RTOL)

    local dx = m:backward(dy)
    assert.are.equal("bf16", dx:dtype_name())
    local rdx, sdx = ref_dgrad(g, w, N, IN, OUT)
    assert_close(dx:to_table(), rdx, sdx, "bf16 dx", F32_RTOL, F32_ATOL, BF16_RTOL)
    local rdw, sdw = ref_wgrad(g, xv, N, IN, OUT)
    assert_close(p[1].grad:to_table(), rdw, sdw, "bf16 dW", F32_RTOL, F32_ATOL, BF16_RTOL)
    local rdb, sdb = ref_bgrad(g, N, OUT)
    assert_close(p[2].grad:to_table(), rdb, sdb, "bf16 db", F32_RTOL, F32_ATOL, BF16_RTOL)
  end)

  it("without bias: one parameter, y = x W^T, and backward gives dx and dW", function()
    local N, IN, OUT = 6, 10, 7
    local m = lutra.nn.Linear(IN, OUT, { bias = false, seed = 9 })
    local p = m:parameters()
    assert.are.equal(1, #p)
    local x = lutra.tensor({ N, IN }):randn(2021, 1, 2)
    local dy = lutra.tensor({ N, OUT }):randn(2022)
    local xv, w, g = x:to_table(), p[1].value:to_table(), dy:to_table()
    local ry, sy = ref_forward(xv, w, nil, N, IN, OUT)
    assert_close(m:forward(x):to_table(), ry, sy, "y (no bias)")
    local rdx, sdx = ref_dgrad(g, w, N, IN, OUT)
    assert_close(m:backward(dy):to_table(), rdx, sdx, "dx (no bias)")
    local rdw, sdw = ref_wgrad(g, xv, N, IN, OUT)
    assert_close(p[1].grad:to_table(), rdw, sdw, "dW (no bias)")
  end)

  it("a 3-D input [2, 8, in] is treated as [16, in]", function()
    local IN, OUT = 12, 5
    local m = lutra.nn.Linear(IN, OUT, { seed = 10 })
    local p = m:parameters()
    local x3 = lutra.tensor({ 2, 8, IN }):randn(2031)
    local dy3 = lutra.tensor({ 2, 8, OUT }):randn(2032)
    local xv, w, b, g = x3:to_table(), p[1].value:to_table(), p[2].value:to_table(), dy3:to_table()

    local y3 = m:forward(x3)
    assert.are.same({ 2, 8, OUT }, y3:dims())
    local y3v = y3:to_table()
    local ry, sy = ref_forward(xv, w, b, 16, IN, OUT)
    assert_close(y3v, ry, sy, "3-D y")
    local dx3 = m:backward(dy3)
    assert.are.same({ 2, 8, IN }, dx3:dims())
    local dx3v = dx3:to_table()
    local rdx, sdx = ref_dgrad(g, w, 16, IN, OUT)
    assert_close(dx3v, rdx, sdx, "3-D dx")
    local dw3 = p[1].grad:to_table()
    local rdw, sdw = ref_wgrad(g, xv, 16, IN, OUT)
    assert_close(dw3, rdw, sdw, "3-D dW")
    local rdb, sdb = ref_bgrad(g, 16, OUT)
    assert_close(p[2].grad:to_table(), rdb, sdb, "3-D db")

    -- the same data as [16, in] gives the same numbers
    local x2 = lutra.from_table(xv, { 16, IN })
    local y2 = m:forward(x2)
    assert.are.same({ 16, OUT }, y2:dims())
    assert_equal_tables(y2:to_table(), y3v, "[16, in] vs [2, 8, in] forward")
    assert_equal_tables(m:backward(lutra.from_table(g, { 16, OUT })):to_table(), dx3v,
                        "[16, in] vs [2, 8, in] dx")
    assert_equal_tables(p[1].grad:to_table(), dw3, "[16, in] vs [2, 8, in] dW")
  end)

  it("backward overwrites grad on each call", function()
    local N, IN, OUT = 4, 6, 3
    local m = lutra.nn.Linear(IN, OUT, { seed = 11 })
    local p = m:parameters()
    local x = lutra.tensor({ N, IN }):randn(2041)
    local dy1 = lutra.tensor({ N, OUT }):randn(2042)
    local dy2 = lutra.tensor({ N, OUT }):randn(2043)
    m:forward(x)
    m:backward(dy1)
    m:backward(dy2)
    local rdw, sdw = ref_wgrad(dy2:to_table(), x:to_table(), N, IN, OUT)
    assert_close(p[1].grad:to_table(), rdw, sdw, "dW after two backwards")
    local rdb, sdb = ref_bgrad(dy2:to_table(), N, OUT)
    assert_close(p[2].grad:to_table(), rdb, sdb, "db after two backwards")
  end)

  for _, dtype in ipairs({ "f32", "bf16" }) do
    it("accumulate_main_grad (" .. dtype .. " params): f32 main_grad sums two backwards, "
       .. "zero_grad clears it", function()
      local N, IN, OUT = 5, 16, 8
      local m = lutra.nn.Linear(IN, OUT, { dtype = dtype, seed = 12, accumulate_main_grad = true })
      local p = m:parameters()
      assert.is_not_nil(p[1].main_grad)
      assert.is_not_nil(p[2].main_grad)
      assert.are.equal("f32", p[1].main_grad:dtype_name())
      assert.are.equal("f32", p[2].main_grad:dtype_name())
      assert.are.same({ OUT, IN }, p[1].main_grad:dims())
      assert_all_zero(p[1].main_grad:to_table(), "fresh main_grad")

      local x1 = lutra.tensor({ N, IN }, dtype):randn(2051)
      local x2 = lutra.tensor({ N, IN }, dtype):randn(2052)
      local dy1 = lutra.tensor({ N, OUT }, dtype):randn(2053)
      local dy2 = lutra.tensor({ N, OUT }, dtype):randn(2054)
      m:forward(x1); m:backward(dy1)
      m:forward(x2); m:backward(dy2)
      local w1, sw1 = ref_wgrad(dy1:to_table(), x1:to_table(), N, IN, OUT)
      local w2, sw2 = ref_wgrad(dy2:to_table(), x2:to_table(), N, IN, OUT)
      local b1, sb1 = ref_bgrad(dy1:to_table(), N, OUT)
      local b2, sb2 = ref_bgrad(dy2:to_table(), N, OUT)
      -- f32 tolerance also for bf16 params: main_grad is accumulated in f32
      assert_close(p[1].main_grad:to_table(), add(w1, w2), add(sw1, sw2), "main_grad W")
      assert_close(p[2].main_grad:to_table(), add(b1, b2), add(sb1, sb2), "main_grad b")
      -- the plain grads are not written in this mode
      assert_all_zero(p[1].grad:to_table(), "grad W with accumulate_main_grad")
      assert_all_zero(p[2].grad:to_table(), "grad b with accumulate_main_grad")

      m:zero_grad()
      assert_all_zero(p[1].main_grad:to_table(), "main_grad W after zero_grad")
      assert_all_zero(p[2].main_grad:to_table(), "main_grad b after zero_grad")

      m:forward(x2); m:backward(dy1)
      local w3, sw3 = ref_wgrad(dy1:to_table(), x2:to_table(), N, IN, OUT)
      assert_close(p[1].main_grad:to_table(), w3, sw3, "main_grad W after zero_grad + backward")
      assert_close(p[2].main_grad:to_table(), b1, sb1, "main_grad b after zero_grad + backward")
    end)
  end

  it("zero_grad clears the plain grads", function()
    local m = lutra.nn.Linear(8, 4, { seed = 13 })
    m:forward(lutra.tensor({ 3, 8 }):randn(2061))
    m:backward(lutra.tensor({ 3, 4 }):randn(2062))
    local p = m:parameters()
    local nonzero = 0
    for _, v in ipairs(p[1].grad:to_table()) do if v ~= 0 then nonzero = nonzero + 1 end end
    assert.is_true(nonzero > 0, "backward left grad W all zero")
    m:zero_grad()
    assert_all_zero(p[1].grad:to_table(), "grad W after zero_grad")
    assert_all_zero(p[2].grad:to_table(), "grad b after zero_grad")
  end)

  describe("FP8", function()
    local N, IN, OUT = 32, 64, 32

    for ri, rc in ipairs(recipes) do
      it(rc.name .. ": forward equals a double GEMM of the dequantized quantizer outputs",
         function()
        local m = lutra.nn.Linear(IN, OUT, { seed = 20 + ri })
        local p = m:parameters()
        local x = lutra.tensor({ N, IN }):randn(2100 + ri)
        local s = lutra.autocast{ recipe = rc.make() }
        s:enter()
        local y = m:forward(x):to_table()
        -- re-quantize x and W with the module's own quantizers (same scales inside the scope)
        local xq = m:quantizer("input"):quantize(x)
        assert.are.equal("e4m3", xq:dtype_name())
        assert.are.equal(rc.scaling.input, xq:scaling_name())
        local xd = lutra.dequantize(xq, lutra.tensor({ N, IN })):to_table()
        local wq = m:quantizer("weight"):quantize(p[1].value)
        assert.are.equal("e4m3", wq:dtype_name())
        assert.are.equal(rc.scaling.weight, wq:scaling_name())
        local wd = lutra.dequantize(wq, lutra.tensor({ OUT, IN })):to_table()
        s:exit()

        local xv, w, b = x:to_table(), p[1].value:to_table(), p[2].value:to_table()
        -- the operands really are quantized: close to, but not equal to, the f32 values
        assert.is_true(differs(xd, xv), "dequantized input equals the f32 input")
        assert.is_true(differs(wd, w), "dequantized weight equals the f32 weight")
        for i = 1, #xv do
          assert.is_true(math.abs(xd[i] - xv[i]) <= 2 ^ -4 * math.abs(xv[i]) + 2 ^ -9,
            string.format("input element %d: %.7g dequantized to %.7g", i, xv[i], xd[i]))
        end

        local ry, sy = ref_forward(xd, wd, b, N, IN, OUT)
        assert_close(y, ry, sy, rc.name .. " y vs dequantized operands")

        local r32, s32 = ref_forward(xv, w, b, N, IN, OUT)
        assert_close(y, r32, s32, rc.name .. " y vs f32 (elementwise worst case)", 0.13, 1e-3)
        local e = rel_norm_err(y, r32)
        assert.is_true(e <= 0.08, string.format("%s: relative error %.4f vs f32", rc.name, e))
      end)

      it(rc.name .. ": is_first_microbatch=false reuses the cached FP8 weight", function()
        local m = lutra.nn.Linear(IN, OUT, { seed = 30 + ri })
        local W = m:parameters()[1].value
        local x = lutra.tensor({ N, IN }):randn(2200 + ri)
        local w0 = W:to_table()
        local w1 = lutra.tensor({ OUT, IN }):uniform(2210 + ri, -0.125, 0.125):to_table()
        local w2 = lutra.tensor({ OUT, IN }):uniform(2220 + ri, -0.125, 0.125):to_table()
        local s = lutra.autocast{ recipe = rc.make() }
        s:enter()
        local y_first = m:forward(x, true):to_table()
        W:set(w1)
        local y_reuse = m:forward(x, false):to_table()
        local y_none = m:forward(x):to_table()
        W:set(w2)
        local y_true = m:forward(x, true):to_table()
        s:exit()
        assert_equal_tables(y_reuse, y_first, rc.name .. ": false after a weight change")
        assert.is_true(differs(y_none, y_first), rc.name .. ": nil did not requantize the weight")
        assert.is_true(differs(y_true, y_none), rc.name .. ": true did not requantize the weight")
        -- each output follows the weight it was computed from (FP8-level agreement)
        local b = m:parameters()[2].value:to_table()
        local xv = x:to_table()
        for _, c in ipairs({ { y_first, w0, "true" }, { y_none, w1, "nil" },
                             { y_true, w2, "true again" } }) do
          local ref = ref_forward(xv, c[2], b, N, IN, OUT)
          local e = rel_norm_err(c[1], ref)
          assert.is_true(e <= 0.08, string.format("%s (%s): relative error %.4f", rc.name, c[3], e))
        end
      end)

      it(rc.name .. ": backward dx and dW are close to the f32 reference, db is exact", function()
        local m = lutra.nn.Linear(IN, OUT, { seed = 40 + ri })
        local p = m:parameters()
        local x = lutra.tensor({ N, IN }):randn(2300 + ri)
        local dy = lutra.tensor({ N, OUT }):randn(2310 + ri)
        local s = lutra.autocast{ recipe = rc.make() }
        s:enter()
        m:forward(x)
        local dx = m:backward(dy):to_table()
        s:exit()
        local xv, w, g = x:to_table(), p[1].value:to_table(), dy:to_table()
        local rdx, sdx = ref_dgrad(g, w, N, IN, OUT)
        local rdw, sdw = ref_wgrad(g, xv, N, IN, OUT)
        local dw = p[1].grad:to_table()
        assert_close(dx, rdx, sdx, rc.name .. " FP8 dx (elementwise worst case)", 0.20, 1e-3)
        assert_close(dw, rdw, sdw, rc.name .. " FP8 dW (elementwise worst case)", 0.20, 1e-3)
        local edx, edw = rel_norm_err(dx, rdx), rel_norm_err(dw, rdw)
        assert.is_true(edx <= 0.12, string.format("%s: dx relative error %.4f", rc.name, edx))
        assert.is_true(edw <= 0.12, string.format("%s: dW relative error %.4f", rc.name, edw))
        assert.is_true(edx > 0 and edw > 0, rc.name .. ": backward did not run in FP8")
        -- the bias gradient is a high-precision reduction of dy, FP8 or not
        local rdb, sdb = ref_bgrad(g, N, OUT)
        assert_close(p[2].grad:to_table(), rdb, sdb, rc.name .. " db")
      end)
    end

    it("outside an FP8 scope is_first_microbatch=false does not freeze the weight", function()
      local m = lutra.nn.Linear(IN, OUT, { seed = 50 })
      local W = m:parameters()[1].value
      local x = lutra.tensor({ N, IN }):randn(2401)
      m:forward(x, true)
      local w1 = lutra.tensor({ OUT, IN }):uniform(2402, -0.1, 0.1):to_table()
      W:set(w1)
      local y = m:forward(x, false):to_table()
      local ry, sy = ref_forward(x:to_table(), w1, m:parameters()[2].value:to_table(), N, IN, OUT)
      assert_close(y, ry, sy, "f32 forward with false after a weight change")
    end)
  end)

  it("C defaults draw each layer's seed from the global generator", function()
    local ffi = require("ffi")
    local C = lutra.C or ffi.C
    local a, b = ffi.new("lutra_linear_desc"), ffi.new("lutra_linear_desc")
    lutra.manual_seed(77)
    C.lutra_linear_defaults(a)
    C.lutra_linear_defaults(b)
    assert.are_not.equal(tostring(a.seed), tostring(b.seed))
    lutra.manual_seed(77)
    local again = ffi.new("lutra_linear_desc")
    C.lutra_linear_defaults(again)
    assert.are.equal(tostring(a.seed), tostring(again.seed))
  end)
end)
