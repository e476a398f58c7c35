-- The activation modules (src/nn/activation.c) on the CPU backend, the reference of
-- kernels/activation/activation.cu: each kind's forward against an f64 Lua formula, its backward
-- against central finite differences, the gated kinds' shapes and TE's halves, and the refusals.
--
-- Tolerances (f32 tensors):
--   forward   |y - ref| <= 1e-5 |ref| + 1e-6. The kernels round a handful of f32 operations
--             (~1e-7 relative) and expf/erff (an ulp); the erf GELU's 1 + erf(x / sqrt 2)
--             cancels for negative x, where erff's ulp of 1 (6e-8) is what the absolute term
--             covers (inputs are in [-4, 4]).
--   backward  (a) against finite differences of the f64 formula, h = 1e-4: truncation
--             ~h^2 |f'''| / 6 < 1e-8, so |dx - num| <= 1e-4 |num| + 1e-5;
--             (b) against finite differences of the module's own f32 forward, h = 1e-2, as
--             spec/gradcheck_spec.lua: |dx - num| <= 1e-2 |num| + 1e-3 max |dx|.
--   Inputs keep |x| >= 0.05, away from the kinks of ReLU and SquaredReLU at 0.
local lutra = require("lutra")
local nn = lutra.nn
local math = math

local SQRT1_2, INV_SQRT_2PI = math.sqrt(0.5), 1 / math.sqrt(2 * math.pi)

-- erf in double: Maclaurin series for |x| <= 3 (terms peak near 1e2: ~1e-14 left), and the
-- continued fraction of erfc beyond (Lentz)
local function erf(x)
  local ax = math.abs(x)
  if ax <= 3 then
    local sum, term, n = 0, ax, 0
    repeat
      local t = term / (2 * n + 1)
      sum = sum + t
      n = n + 1
      term = -term * ax * ax / n
    until math.abs(t) < 1e-17 * math.abs(sum)
    return (x < 0 and -1 or 1) * sum * 2 / math.sqrt(math.pi)
  end
  -- erfc(x) = exp(-x^2) / sqrt(pi) * 1 / (x + 1/2 / (x + 1 / (x + 3/2 / (x + ...))))
  local f = ax
  for k = 60, 1, -1 do f = ax + (k / 2) / f end
  local erfc = math.exp(-ax * ax) / math.sqrt(math.pi) / f
  return (x < 0 and -1 or 1) * (1 - erfc)
end

local function sigmoid(x) return 1 / (1 + math.exp(-x)) end
local function gelu_tanh(x)
  return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ^ 3)))
end
local function relu(x) return x > 0 and x or 0 end

-- kind: constructor, f64 element function (the gate's for gated kinds), gated
local KINDS = {
  { name = "GELU (tanh)", new = function() return nn.GELU() end, f = gelu_tanh },
  { name = "GELU (none: erf)", new = function() return nn.GELU({ approximate = "none" }) end,
    f = function(x) return 0.5 * x * (1 + erf(x * SQRT1_2)) end },
  { name = "ReLU", new = nn.ReLU, f = relu },
  { name = "SiLU", new = nn.SiLU, f = function(x) return x * sigmoid(x) end },
  { name = "QuickGELU", new = nn.QuickGELU, f = function(x) return x * sigmoid(1.702 * x) end },
  { name = "SquaredReLU", new = nn.SquaredReLU, f = function(x) return relu(x) ^ 2 end },
  { name = "Tanh", new = nn.Tanh, f = math.tanh },
  { name = "SwiGLU", new = nn.SwiGLU, f = function(x) return x * sigmoid(x) end, gated = true },
  { name = "GeGLU", new = nn.GeGLU, f = gelu_tanh, gated = true },
  { name = "ReGLU", new = nn.ReGLU, f = relu, gated = true },
}

-- deterministic inputs in [-4, 4] with |x| >= 0.05
local function inputs(n, seed)
  local v = {}
  for i = 1, n do
    local u = ((i + seed) * 0.6180339887498949) % 1
    local x = -4 + 8 * u
    if math.abs(x) < 0.05 then x = x < 0 and -0.05 - u or 0.05 + u end
    v[i] = x
  end
  return v
end

local function f32(values, shape) return lutra.tensor(shape, "f32", "cpu"):set(values) end

-- the f64 reference of y and of dL/dx for L = sum(y * r); the f32 inputs as the module saw them
local function reference(k, xs, rows, cols, r)
  local y, dx = {}, {}
  if not k.gated then
    for i = 1, #xs do
      local x = xs[i]
      y[i] = k.f(x)
      dx[i] = r[i] * (k.f(x + 1e-4) - k.f(x - 1e-4)) / 2e-4
    end
    return y, dx
  end
  local h = cols / 2
  for row = 0, rows - 1 do
    for j = 1, h do
      local a, b = xs[row * cols + j], xs[row * cols + h + j]
      local ri = r[row * h + j]
      y[row * h + j] = k.f(a) * b
      dx[row * cols + j] = ri * b * (k.f(a + 1e-4) - k.f(a - 1e-4)) / 2e-4
      dx[row * cols + h + j] = ri * k.f(a)
    end
  end
  return y, dx
end

local function assert_close(got, want, rtol, atol, what)
  assert.are.equal(#want, #got, what .. ": element count")
  for i = 1, #want do
    local err = math.abs(got[i] - want[i])
    if not (err <= rtol * math.abs(want[i]) + atol) then
      error(string.format("%s: element %d: got %.9g, want %.9g (|err| %.3g)", what, i, got[i],
                          want[i], err), 2)
    end
  end
end

describe("activation modules", function()
  for _, k in ipairs(KINDS) do
    local shape = { 3, 2, 8 }
    local yshape = k.gated and { 3, 2, 4 } or shape
    local rows, cols = 6, 8

    it(k.name .. ": forward matches the f64 formula, backward its finite differences", function()
      local m = k.new()
      local x = f32(inputs(48, 7), shape)
      local xs = x:to_table()
      local ny = k.gated and 24 or 48
      local r = lutra.tensor({ ny }):randn(5, 0, 1):to_table()
      local y = m:forward(x)
      assert.are.same(yshape, { y.shape[0], y.shape[1], y.shape[2] })
      local ry, rdx = reference(k, xs, rows, cols, r)
      assert_close(y:to_table(), ry, 1e-5, 1e-6, k.name .. " forward")
      local dx = m:backward(f32(r, yshape))
      assert.are.same(shape, { dx.shape[0], dx.shape[1], dx.shape[2] })
      assert_close(dx:to_table(), rdx, 1e-4, 1e-5, k.name .. " backward vs f64 differences")
    end)

    it(k.name .. ": backward matches finite differences of its own f32 forward", function()
      local m = k.new()
      local xshape = k.gated and { 2, 6 } or { 12 }
      local ny = k.gated and 6 or 12
      local vals = inputs(12, 3)
      local x = f32(vals, xshape)
      local r = lutra.tensor({ ny }):randn(9, 0, 1):to_table()
      local function objective()
        local y = m:forward(x):to_table()
        local s = 0
        for i = 1, #y do s = s + y[i] * r[i] end
        return s
      end
      objective()
      local ana = m:backward(f32(r, k.gated and { 2, 3 } or { 12 })):to_table()
      local amax = 0
      for i = 1, #ana do amax = math.max(amax, math.abs(ana[i])) end
      for i = 1, #vals do
        local v = vals[i]
        vals[i] = v + 1e-2
        x:set(vals)
        local vp, lp = x:to_table()[i], objective()
        vals[i] = v - 1e-2
        x:set(vals)
        local vm, lm = x:to_table()[i], objective()
        vals[i] = v
        x:set(vals)
        local num = (lp - lm) / (vp - vm)
        assert.is_true(math.abs(ana[i] - num) <= 1e-2 * math.abs(num) + 1e-3 * amax,
                       string.format("%s element %d: analytic %.7g, numerical %.7g", k.name, i,
                                     ana[i], num))
      end
    end)
  end

  it("gated kinds: the first half is the gate, the second the linear part (TE's order)", function()
    local x = f32({ 1, 2, 10, 20 }, { 1, 4 })
    local y = nn.ReGLU():forward(x):to_table()
    assert.are.same({ 10, 40 }, y)
    local y2 = nn.ReGLU():forward(f32({ -1, 2, 10, 20 }, { 1, 4 })):to_table()
    assert.are.same({ 0, 40 }, y2)
  end)

  it("gated kinds refuse an odd last dim, naming the call", function()
    for _, c in ipairs({ { nn.SwiGLU, "lutra_swiglu_forward" }, { nn.GeGLU, "lutra_geglu_forward" },
                         { nn.ReGLU, "lutra_reglu_forward" } }) do
      local ok, err = pcall(function() return c[1]():forward(f32({ 1, 2, 3, 4, 5, 6 }, { 2, 3 })) end)
      assert.is_false(ok)
      assert.matches(c[2], tostring(err), 1, true)
      assert.matches("odd", tostring(err), 1, true)
    end
  end)

  it("nn.GELU: tanh by default, approximate = \"none\" is the erf GELU, others refused", function()
    local x = f32(inputs(16, 1), { 16 })
    local a = nn.GELU():forward(x):to_table()
    local b = nn.GELU({ approximate = "tanh" }):forward(x):to_table()
    assert.are.same(a, b)
    assert.are.equal("gelu", nn.GELU():kind())
    assert.are.equal("gelu_erf", nn.GELU({ approximate = "none" }):kind())
    assert.has_error(function() nn.GELU({ approximate = "fast" }) end,
                     "lutra.nn.GELU: approximate must be \"tanh\" or \"none\" (got fast)")
    assert.has_error(function() nn.GELU({ approx = "tanh" }) end,
                     "lutra.nn.GELU: unknown option 'approx'")
    assert.has_error(function() nn.SiLU(1) end, "lutra.nn.SiLU: takes no arguments")
  end)

  it("lutra_activation_new refuses a kind that is not LUTRA_ACTIVATION_*", function()
    local box = require("ffi").new("lutra_module*[1]")
    for _, kind in ipairs({ 0, 11, -1 }) do
      assert.are_not.equal(0, lutra.C.lutra_activation_new(kind, box))
      assert.matches("lutra_activation_new: activation kind " .. kind,
                     require("ffi").string(lutra.C.lutra_last_error()), 1, true)
    end
  end)

  it("Tanh: the tails keep their digits (1 - tanh(x)^2 from x, not from the rounded tanh)", function()
    -- tanhf(x) rounds to +-1 for |x| >= 9.1, where 1 - t^2 would give 0; 4 e / (1 + e)^2,
    -- e = exp(-2 |x|), is the derivative to a few f32 roundings: |dx - ref| <= 1e-5 |ref|
    local xs = { 0.5, -0.5, 3, -3, 6, -6, 9.5, -9.5, 12, -12, 20, -20, 40, -40 }
    local m = nn.Tanh()
    local y = m:forward(f32(xs, { #xs })):to_table()
    local dx = m:backward(f32((function()
      local ones = {}
      for i = 1, #xs do ones[i] = 1 end
      return ones
    end)(), { #xs })):to_table()
    local want_y, want_dx = {}, {}
    for i, x in ipairs(xs) do
      local e = math.exp(-2 * math.abs(x))
      want_y[i], want_dx[i] = math.tanh(x), 4 * e / (1 + e) ^ 2
    end
    assert_close(y, want_y, 1e-6, 0, "Tanh forward")
    assert_close(dx, want_dx, 1e-5, 0, "Tanh backward tails")
    assert.is_true(dx[#xs] > 0, "the derivative at -40 (~7e-35) is not flushed to 0")
  end)

  it("bf16: gated and element-wise kinds keep shapes and agree with f32 to bf16 rounding", function()
    for _, k in ipairs(KINDS) do
      local shape = { 4, 6 }
      local xb = lutra.tensor(shape, "bf16", "cpu"):set(inputs(24, 2))
      local xf = lutra.tensor(shape, "f32", "cpu"):set(xb:to_table())
      local yb = k.new():forward(xb):to_table()
      local yf = k.new():forward(xf):to_table()
      assert_close(yb, yf, 2 ^ -8, 1e-6, k.name .. " bf16")
    end
  end)

  it("Linear + non-tanh activations run unfused in a Sequential (only the tanh GELU fuses)", function()
    for _, mk in ipairs({ nn.ReLU, nn.SiLU, nn.SwiGLU }) do
      local gated = mk == nn.SwiGLU
      local net = nn.Sequential(nn.Linear(8, 16, { seed = 1 }), mk(),
                                nn.Linear(gated and 8 or 16, 4, { seed = 2 }))
      local x = lutra.tensor({ 5, 8 }):randn(3, 0, 1)
      local y = net:forward(x)
      assert.are.same({ 5, 4 }, { y.shape[0], y.shape[1] })
      net:backward(lutra.tensor({ 5, 4 }):randn(4, 0, 1))
      local f, b = net:fusions()
      assert.are.equal(0, f)
      assert.are.equal(0, b)
    end
  end)
end)
