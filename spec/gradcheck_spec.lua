-- Central finite-difference gradient checks of every backward the library has.
--
-- Method: an input element v (f32) is set to fl(v + h) and fl(v - h); the objective L is
-- evaluated in double on the Lua side from the library's f32 outputs (or taken from the loss
-- module when the loss itself is under test), and the numerical derivative is
--   (L(v+) - L(v-)) / (v+ - v-)
-- with v+ and v- read back from the tensor, so the f32 rounding of v +- h does not enter.
-- Where there is no loss, L = sum(y * r) for a fixed random r (then dL/dy = r).
--
-- Step and tolerances (stable in f32):
--   h = 1e-2.  Linear layers and MSE are linear/quadratic in the perturbed value, so central
--   differences are exact up to f32 rounding of the forward (~1e-7 relative, i.e. ~1e-5 after
--   dividing by 2h); GELU and softmax add a truncation error of order h^2 |f'''| / 6 ~ 2e-5.
--   Each element must satisfy  |num - ana| <= RTOL * |ana| + ATOL_FRAC * max_j |ana_j|
--   with RTOL = 1e-2 and ATOL_FRAC = 1e-3 (the absolute part covers elements whose gradient
--   is near zero). Every element of every checked tensor is compared.
local lutra = require("lutra")

local H = 1e-2
local RTOL = 1e-2
local ATOL_FRAC = 1e-3

local function sum_prod(y, r)
  local vals, s = y:to_table(), 0.0
  for i = 1, #vals do s = s + vals[i] * r[i] end
  return s
end

local function rand_table(n, seed, std)
  return lutra.tensor({ n }):randn(seed, 0, std or 1):to_table()
end

-- Numerical derivative of objective() w.r.t. every element of tensor t (values restored after).
local function numerical_grad(t, objective)
  local vals = t:to_table()
  local g = {}
  for i = 1, #vals do
    local orig = vals[i]
    vals[i] = orig + H
    t:set(vals)
    local vp = t:to_table()[i]
    local lp = objective()
    vals[i] = orig - H
    t:set(vals)
    local vm = t:to_table()[i]
    local lm = objective()
    vals[i] = orig
    t:set(vals)
    g[i] = (lp - lm) / (vp - vm)
  end
  return g
end

local function check_grad(num, ana, what)
  assert.are.equal(#num, #ana, what .. ": element count")
  local amax = 0
  for i = 1, #ana do amax = math.max(amax, math.abs(ana[i])) end
  assert.is_true(amax > 0, what .. ": analytic gradient is all zero")
  local worst, worst_i = -1, 0
  for i = 1, #ana do
    local err = math.abs(num[i] - ana[i])
    local tol = RTOL * math.abs(ana[i]) + ATOL_FRAC * amax
    if err / tol > worst then worst, worst_i = err / tol, i end
  end
  assert.is_true(worst <= 1, string.format(
    "%s: element %d numerical %.8g vs analytic %.8g (error %.3g of the tolerance)", what,
    worst_i, num[worst_i], ana[worst_i], worst))
end

local function gelu_ref(x)
  return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ^ 3)))
end

describe("gradcheck", function()
  it("Linear: dx, dW and db match central differences of sum(y * r)", function()
    local N, IN, OUT = 7, 12, 9
    local m = lutra.nn.Linear(IN, OUT, { seed = 41 })
    local x = lutra.tensor({ N, IN }):randn(1001)
    local r = rand_table(N * OUT, 1002)
    local function L() return sum_prod(m:forward(x), r) end

    m:forward(x)
    local dx = m:backward(lutra.from_table(r, { N, OUT })):to_table()
    local p = m:parameters()
    local dw, db = p[1].grad:to_table(), p[2].grad:to_table()

    check_grad(numerical_grad(x, L), dx, "Linear dx")
    check_grad(numerical_grad(p[1].value, L), dw, "Linear dW")
    check_grad(numerical_grad(p[2].value, L), db, "Linear db")
  end)

  it("Linear without bias: dx and dW match central differences", function()
    local N, IN, OUT = 5, 8, 6
    local m = lutra.nn.Linear(IN, OUT, { bias = false, seed = 42 })
    local x = lutra.tensor({ N, IN }):randn(1011, 0, 2)
    local r = rand_table(N * OUT, 1012)
    local function L() return sum_prod(m:forward(x), r) end
    m:forward(x)
    local dx = m:backward(lutra.from_table(r, { N, OUT })):to_table()
    local p = m:parameters()
    assert.are.equal(1, #p)
    check_grad(numerical_grad(x, L), dx, "Linear(no bias) dx")
    check_grad(numerical_grad(p[1].value, L), p[1].grad:to_table(), "Linear(no bias) dW")
  end)

  it("GELU: forward is the tanh approximation and dx matches central differences", function()
    local N, C = 6, 16
    local g = lutra.nn.GELU()
    local x = lutra.tensor({ N, C }):randn(1021, 0, 2)
    -- a few fixed points: zero, the minimum of GELU, both tails
    local xv = x:to_table()
    xv[1], xv[2], xv[3], xv[4], xv[5] = 0, -0.7517916, -6, 6, -3
    x:set(xv)
    xv = x:to_table()
    local y = g:forward(x):to_table()
    for i = 1, #xv do
      local ref = gelu_ref(xv[i])
      assert.is_true(math.abs(y[i] - ref) <= 2e-6 * math.abs(ref) + 1e-6,
        string.format("gelu(%.7g) = %.9g, reference %.9g", xv[i], y[i], ref))
    end
    local r = rand_table(N * C, 1022)
    local function L() return sum_prod(g:forward(x), r) end
    g:forward(x)
    local dx = g:backward(lutra.from_table(r, { N, C })):to_table()
    check_grad(numerical_grad(x, L), dx, "GELU dx")
  end)

  it("MSE: value is the mean squared error and dpred matches central differences", function()
    local N, C = 6, 10
    local loss = lutra.nn.MSELoss()
    local pred = lutra.tensor({ N, C }):randn(1031)
    local target = lutra.tensor({ N, C }):randn(1032, 0.5, 1)
    local p, t = pred:to_table(), target:to_table()
    local ref = 0
    for i = 1, #p do ref = ref + (p[i] - t[i]) ^ 2 end
    ref = ref / #p
    local v = loss:forward(pred, target):item()
    assert.is_true(math.abs(v - ref) <= 1e-6 * ref, string.format("mse %.9g vs %.9g", v, ref))
    assert.are.equal(v, loss:value())
    local ana = loss:backward():to_table()
    local function L() loss:forward(pred, target); return loss:value() end
    check_grad(numerical_grad(pred, L), ana, "MSE dpred")
  end)

  it("softmax cross-entropy: value matches a double reference and dlogits central differences",
     function()
    local N, C = 8, 10
    local loss = lutra.nn.CrossEntropyLoss()
    local logits = lutra.tensor({ N, C }):randn(1041, 0, 2)
    local labels = {}
    local u = lutra.tensor({ N }):uniform(1042, 0, C):to_table()
    for i = 1, N do labels[i] = math.floor(u[i]) end
    labels[1], labels[2] = 0, C - 1 -- both ends of the label range
    local target = lutra.from_table(labels, { N }, "i32")
    local z = logits:to_table()
    local ref = 0
    for i = 0, N - 1 do
      local mx = -math.huge
      for j = 1, C do mx = math.max(mx, z[i * C + j]) end
      local s = 0
      for j = 1, C do s = s + math.exp(z[i * C + j] - mx) end
      ref = ref + (mx + math.log(s) - z[i * C + labels[i + 1] + 1])
    end
    ref = ref / N
    loss:forward(logits, target)
    local v = loss:value()
    assert.is_true(math.abs(v - ref) <= 1e-5 * ref, string.format("xent %.9g vs %.9g", v, ref))
    local ana = loss:backward():to_table()
    local function L() loss:forward(logits, target); return loss:value() end
    check_grad(numerical_grad(logits, L), ana, "cross-entropy dlogits")
  end)

  it("Sequential(Linear, GELU, Linear) + MSE: dx and every parameter gradient", function()
    local N, IN, HID, OUT = 6, 12, 16, 5
    local net = lutra.nn.Sequential(lutra.nn.Linear(IN, HID, { seed = 51 }), lutra.nn.GELU(),
                                    lutra.nn.Linear(HID, OUT, { seed = 52 }))
    local loss = lutra.nn.MSELoss()
    local x = lutra.tensor({ N, IN }):randn(1051, 0, 1.5)
    local target = lutra.tensor({ N, OUT }):randn(1052)
    local function L() loss:forward(net:forward(x), target); return loss:value() end

    L()
    local dx = net:backward(loss:backward()):to_table()
    local p = net:parameters()
    assert.are.equal(4, #p)
    local ana = {}
    for i = 1, 4 do ana[i] = p[i].grad:to_table() end

    check_grad(numerical_grad(x, L), dx, "chain dx")
    local names = { "W1", "b1", "W2", "b2" }
    for i = 1, 4 do
      check_grad(numerical_grad(p[i].value, L), ana[i], "chain d" .. names[i])
    end
  end)

  it("Sequential(Linear, GELU, Linear) + cross-entropy: dx, dW1 and db2", function()
    local N, IN, HID, C = 8, 10, 16, 6
    local net = lutra.nn.Sequential(lutra.nn.Linear(IN, HID, { seed = 61 }), lutra.nn.GELU(),
                                    lutra.nn.Linear(HID, C, { seed = 62 }))
    local loss = lutra.nn.CrossEntropyLoss()
    local x = lutra.tensor({ N, IN }):randn(1061, 0, 2)
    local labels = {}
    for i = 1, N do labels[i] = (i * 5) % C end
    local target = lutra.from_table(labels, { N }, "i32")
    local function L() loss:forward(net:forward(x), target); return loss:value() end
    L()
    local dx = net:backward(loss:backward()):to_table()
    local p = net:parameters()
    local dw1, db2 = p[1].grad:to_table(), p[4].grad:to_table()
    check_grad(numerical_grad(x, L), dx, "xent chain dx")
    check_grad(numerical_grad(p[1].value, L), dw1, "xent chain dW1")
    check_grad(numerical_grad(p[4].value, L), db2, "xent chain db2")
  end)
end)
