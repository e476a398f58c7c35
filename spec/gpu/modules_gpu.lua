-- GPU modules, losses, optimizers and autocast against the CPU backend: GELU, MSE and softmax
-- cross-entropy (value and gradient), nn.Linear under every recipe with f32 and bf16
-- parameters (y, dx, dW, db; weight caching across micro-batches; main_grad accumulation),
-- Sequential, SGD and AdamW steps (bf16 parameters with f32 masters), delayed-scaling update
-- counts under autocast, and device-mismatch errors.
--
-- Every case runs the same module on both devices from the same parameters (initialized on the
-- host from the seed: checked bit-identical) and the same inputs, and compares the results in
-- NMSE = ||dev - cpu||^2 / ||cpu||^2, with the bound stated at each test. Module outputs belong
-- to the module and cannot be poisoned beforehand; every value read from the device is checked
-- finite (a non-finite value fails with its index), and modules run more than once so that their
-- reused buffers hold the previous call's values.
--
-- The device is LUTRA_TEST_DEVICE (default "cuda"); LUTRA_TEST_DEVICE=cpu dry-runs the
-- suite CPU against CPU. When the device is not available, every test fails saying so.

-- ---- helpers (the device choice and test wrapper are shared: spec/gpu/support.lua) ---------
-- (globals are read through busted's sandbox environment, which is slow in hot loops: keep
-- local copies)
local math, string, table, type, tostring, ipairs, pairs, pcall, error =
  math, string, table, type, tostring, ipairs, pairs, pcall, error
local HUGE = math.huge
local lutra = require("lutra")
local C = lutra.C
local R = lutra.recipe
local nn = lutra.nn

local S = require("spec.gpu.support")
local DEV, REF, note, hold, fail, isfinite = S.DEV, S.REF, S.note, S.hold, S.fail, S.isfinite
-- it() that fails at once, saying why, when the device under test cannot run
local function test(name, fn) S.test(it, name, fn) end

-- the same random tensor on both devices (generated on the host from the seed)
local randn_pair, keep, f32 = S.randn_pair, S.keep, S.f32

-- dims and dtype as the reference's, and the result on the device under test
local function same_meta(got, want, what)
  S.same_meta(got, want, what)
  assert.are.equal(DEV, got:device_name(), what .. ": device of the result")
end

local assert_same_bytes = require("spec.support.fp8_bytes").same_bytes

-- NMSE of got (on DEV) against want (on REF) <= bound; every element of got must be finite
local function assert_nmse(got, want, bound, what)
  same_meta(got, want, what)
  return S.assert_nmse(got, want, bound, what)
end

-- relative squared error of two scalars (a loss value)
local function assert_scalar(got, want, bound, what)
  if not isfinite(got) then fail("%s: %s on %s (reference %.9g)", what, tostring(got), DEV, want) end
  local e = (got - want) ^ 2 / math.max(want * want, 1e-300)
  if not (e <= bound) then
    fail("%s: %.9g on %s, reference %.9g (relative squared error %.3e > %.1e)", what, got, DEV,
         want, e, bound)
  end
end

local function all_zero(t, what)
  local v = t:read()
  for i = 0, t:size() - 1 do
    if v[i] ~= 0 then fail("%s: element %d is %.9g, expected 0", what, i, v[i]) end
  end
end

-- bit-identical tensors on the same device (reuse and caching checks)
local function same_values(a, b, what)
  assert_same_bytes(a:bytes(), b:bytes(), what)
end


-- f32 outputs / bf16 outputs (see each test for why)
local function hp_bound(dtype) return dtype == "bf16" and 1e-5 or 1e-10 end

-- ---- GELU and losses -----------------------------------------------------------------------

describe("GELU and losses on " .. DEV, function()
  -- GELU (tanh form, elementwise in f32): the devices may differ by an ulp or two of expf, so
  -- f32 NMSE <= 1e-10 (measured ~1e-14); bf16 outputs are rounded to bf16, where an ulp of
  -- difference in f32 can flip the rounding: NMSE <= 1e-5.
  for _, dt in ipairs { "f32", "bf16" } do
    test("GELU forward and backward (" .. dt .. ")", function()
      for _, c in ipairs { { { 128, 256 }, 1 }, { { 37, 53 }, 4 }, { { 4, 33, 64 }, 8 }, { { 256, 1000 }, 2 } } do
        local shape, std = c[1], c[2]
        local what = string.format("GELU %s %s std %g", dt, table.concat(shape, "x"), std)
        local ga, gb = hold(nn.GELU()), hold(nn.GELU())
        for round = 1, 2 do -- the second round writes over the first round's buffers
          local xa, xb = randn_pair(shape, dt, 100 * round + #shape, std, 0.2)
          local dya, dyb = randn_pair(shape, dt, 100 * round + 7, 1)
          local ya, yb = ga:forward(xa), gb:forward(xb)
          assert_nmse(yb, ya, hp_bound(dt), what .. " forward, round " .. round)
          local dxa, dxb = ga:backward(dya), gb:backward(dyb)
          assert_nmse(dxb, dxa, hp_bound(dt), what .. " backward, round " .. round)
        end
      end
    end)
  end

  -- Loss values are f32 means computed in f32 from the (f32 or bf16) predictions: the devices
  -- differ only in summation order, relative ~1e-7: relative squared error <= 1e-10 for both
  -- dtypes. Gradients have pred's dtype: f32 NMSE <= 1e-10, bf16 NMSE <= 1e-5.
  for _, dt in ipairs { "f32", "bf16" } do
    test("MSE loss value and gradient (" .. dt .. ")", function()
      for _, shape in ipairs { { 128, 32 }, { 37, 53 }, { 512, 500 } } do
        local what = string.format("MSE %s %s", dt, table.concat(shape, "x"))
        local la, lb = hold(nn.MSELoss()), hold(nn.MSELoss())
        for round = 1, 2 do
          local pa, pb = randn_pair(shape, dt, 300 + round, 2)
          local ta, tb = randn_pair(shape, dt, 310 + round, 1, 0.5)
          local lossa, lossb = la:forward(pa, ta), lb:forward(pb, tb)
          assert.are.same({ 1 }, lossb:dims())
          assert_scalar(lb:value(), la:value(), 1e-10, what .. " value")
          assert_scalar(lossb:item(), lossa:item(), 1e-10, what .. " loss tensor")
          assert_nmse(lb:backward(), la:backward(), hp_bound(dt), what .. " gradient")
        end
      end
    end)

    test("softmax cross-entropy value and gradient (" .. dt .. ", logits up to |50|)", function()
      -- a row per warp up to 2048 columns, a row per block above (GPT-2's vocabulary: the row
      -- staged in shared memory in bf16, read from global memory three times in f32; 3001: no
      -- 16-byte vectors)
      for _, c in ipairs { { 128, 32, 1 }, { 128, 32, 10 }, { 37, 1000, 50 }, { 512, 10, 3 },
                           { 48, 50304, 3 }, { 16, 4104, 2 }, { 9, 3001, 5 } } do
        local N, K, std = c[1], c[2], c[3]
        local what = string.format("cross-entropy %s %dx%d std %g", dt, N, K, std)
        local labels = lutra.tensor({ N }, "f32", REF):uniform(N + K, 0, K):to_table()
        for i = 1, N do labels[i] = math.min(K - 1, math.floor(labels[i])) end
        local lab_a = lutra.from_table(labels, { N }, "i32", REF)
        local lab_b = lutra.from_table(labels, { N }, "i32", DEV)
        local la, lb = hold(nn.CrossEntropyLoss()), hold(nn.CrossEntropyLoss())
        for round = 1, 2 do
          local pa, pb = randn_pair({ N, K }, dt, 400 + round + K, std)
          la:forward(pa, lab_a)
          lb:forward(pb, lab_b)
          assert_scalar(lb:value(), la:value(), 1e-10, what .. " value")
          assert_nmse(lb:backward(), la:backward(), hp_bound(dt), what .. " gradient")
        end
      end
    end)
  end
end)

-- ---- Linear ------------------------------------------------------------------------------------

local RECIPES = {
  { name = "none" },
  { name = "delayed", make = function() return R.delayed { amax_history_len = 4 } end, delayed = true },
  { name = "current", make = function() return R.current() end },
  { name = "mxfp8", make = function() return R.mxfp8() end },
  { name = "block", make = function() return R.block() end },
}

-- Bounds for Linear outputs (y, dx, dW) and db:
--   recipe none, f32: NMSE <= 1e-10 (f32 GEMMs on identical operands; order only)
--   FP8 recipes, f32: NMSE <= 1e-6: the quantized operands are identical on both devices
--     (same inputs, same scales, bit-exact quantizers; delayed scales are compared exactly
--     below), so only accumulation differs: f32 on the CPU, cuBLASLt's FP8 accumulation or a
--     bf16 GEMM of exactly dequantized operands on the GPU (~1e-8 at most)
--   bf16 outputs (bf16 params), any recipe: NMSE <= 1e-5 (rare one-ulp bf16 rounding flips)
--   db is a high-precision column sum of dy in every recipe: 1e-10 (f32), 1e-5 (bf16)
local function linear_bound(rc, dtype)
  if dtype == "bf16" then return 1e-5 end
  return rc.make and 1e-6 or 1e-10
end

-- the same Linear on both devices; parameters are generated on the host from the seed
local function linear_pair(IN, OUT, dtype, seed, extra)
  local function opts(device)
    local o = { seed = seed, dtype = dtype, device = device }
    for k, v in pairs(extra or {}) do o[k] = v end
    return o
  end
  local a, b = hold(nn.Linear(IN, OUT, opts(REF))), hold(nn.Linear(IN, OUT, opts(DEV)))
  local pa, pb = a:parameters(), b:parameters()
  assert.are.equal(#pa, #pb)
  for i = 1, #pa do
    assert.are.equal(DEV, pb[i].value:device_name())
    assert_same_bytes(pb[i].value:bytes(), pa[i].value:bytes(), "initial parameter " .. i)
  end
  return a, b
end

-- one step of a module under a scope (nil: no autocast): forward in the scope, backward after
local function fwd_bwd(m, scope, x, dy, first_microbatch)
  if scope then scope:enter() end
  local ok, y = pcall(m.forward, m, x, first_microbatch)
  if scope then scope:exit() end
  if not ok then error(y, 0) end
  local dx = m:backward(dy)
  return y, dx
end

local function compare_params(ma, mb, bound_w, bound_b, what, field)
  field = field or "grad"
  local pa, pb = ma:parameters(), mb:parameters()
  assert_nmse(pb[1][field], pa[1][field], bound_w, what .. " dW" .. (field == "grad" and "" or " (" .. field .. ")"))
  if pa[2] then
    assert_nmse(pb[2][field], pa[2][field], bound_b, what .. " db" .. (field == "grad" and "" or " (" .. field .. ")"))
  end
end

-- delayed/current scales of a Linear's quantizers: identical on both devices
local function compare_scales(ma, mb, what, history_len)
  for _, role in ipairs { "input", "weight", "grad_output" } do
    local qa, qb = ma:quantizer(role), mb:quantizer(role)
    assert.are.equal(qa == nil, qb == nil, what .. ": " .. role .. " quantizer exists on one device only")
    if qa ~= nil then
      local sa, sia = qa:scale()
      local sb, sib = qb:scale()
      if sa ~= sb or sia ~= sib then
        fail("%s: %s scale %.9g / %.9g on %s, reference %.9g / %.9g", what, role, sb, sib, DEV, sa, sia)
      end
      if history_len then
        assert.are.same(qa:history(history_len), qb:history(history_len), what .. ": " .. role .. " history")
      end
    end
  end
end

describe("nn.Linear on " .. DEV, function()
  for _, rc in ipairs(RECIPES) do
    for _, dt in ipairs { "f32", "bf16" } do
      test(string.format("recipe %s, %s params: y, dx, dW, db over three steps", rc.name, dt), function()
        for _, sz in ipairs { { 128, 160, 96 }, { 256, 512, 384 } } do
          local N, IN, OUT = sz[1], sz[2], sz[3]
          local ma, mb = linear_pair(IN, OUT, dt, N + IN)
          local sa = rc.make and lutra.autocast { recipe = rc.make() }
          local sb = rc.make and lutra.autocast { recipe = rc.make() }
          local bound = linear_bound(rc, dt)
          for step = 1, 3 do
            local what = string.format("%s %s %dx%d->%d step %d", rc.name, dt, N, IN, OUT, step)
            local xa, xb = randn_pair({ N, IN }, dt, 5000 + step, step == 2 and 10 or 1)
            local dya, dyb = randn_pair({ N, OUT }, dt, 5100 + step, step == 3 and 1e-3 or 0.1)
            local ya, dxa = fwd_bwd(ma, sa, xa, dya)
            local yb, dxb = fwd_bwd(mb, sb, xb, dyb)
            assert_nmse(yb, ya, bound, what .. " y")
            assert_nmse(dxb, dxa, bound, what .. " dx")
            compare_params(ma, mb, bound, hp_bound(dt), what)
            if rc.delayed then
              compare_scales(ma, mb, what, 4)
            elseif rc.name == "current" then
              compare_scales(ma, mb, what)
            end
          end
        end
      end)
    end
  end

  test("a 3-D input [2, 64, in] and a Linear without bias", function()
    for _, rc in ipairs { RECIPES[1], RECIPES[3] } do
      local ma, mb = linear_pair(96, 64, "f32", 77, { bias = false })
      assert.are.equal(1, #mb:parameters())
      local sa = rc.make and lutra.autocast { recipe = rc.make() }
      local sb = rc.make and lutra.autocast { recipe = rc.make() }
      local xa, xb = randn_pair({ 2, 64, 96 }, "f32", 78, 1)
      local dya, dyb = randn_pair({ 2, 64, 64 }, "f32", 79, 1)
      local ya, dxa = fwd_bwd(ma, sa, xa, dya)
      local yb, dxb = fwd_bwd(mb, sb, xb, dyb)
      assert.are.same({ 2, 64, 64 }, yb:dims())
      assert_nmse(yb, ya, linear_bound(rc, "f32"), rc.name .. " 3-D y")
      assert_nmse(dxb, dxa, linear_bound(rc, "f32"), rc.name .. " 3-D dx")
      compare_params(ma, mb, linear_bound(rc, "f32"), 1e-10, rc.name .. " 3-D")
    end
  end)

  -- is_first_microbatch: true quantizes and caches the weight, false reuses the cache even after
  -- the weight changed, nil requantizes. On each device the reused output must equal the first
  -- bit for bit (same kernels on the same operands), and each device must match the other.
  for ri = 2, #RECIPES do
    local rc = RECIPES[ri]
    test(rc.name .. ": is_first_microbatch caching works as on the CPU", function()
      local N, IN, OUT = 64, 128, 96
      local ma, mb = linear_pair(IN, OUT, "f32", 30 + ri)
      local xa, xb = randn_pair({ N, IN }, "f32", 2200 + ri, 1)
      local w1 = lutra.tensor({ OUT, IN }, "f32", REF):uniform(2210 + ri, -0.125, 0.125):read()
      local w2 = lutra.tensor({ OUT, IN }, "f32", REF):uniform(2220 + ri, -0.125, 0.125):read()
      local function run(m, x, device)
        local W = m:parameters()[1].value
        local s = lutra.autocast { recipe = rc.make() }
        s:enter()
        local ok, res = pcall(function()
          local r = {}
          r.first = keep(m:forward(x, true))
          W:set(w1)
          r.reuse = keep(m:forward(x, false))
          r.none = keep(m:forward(x))
          W:set(w2)
          r.again = keep(m:forward(x, true))
          r.reuse2 = keep(m:forward(x, false))
          return r
        end)
        s:exit()
        if not ok then error(res, 0) end
        return res
      end
      local ra, rb = run(ma, xa, REF), run(mb, xb, DEV)
      same_values(rb.reuse, rb.first, rc.name .. " on " .. DEV .. ": false after a weight change")
      same_values(rb.reuse2, rb.again, rc.name .. " on " .. DEV .. ": false after true again")
      assert.are_not.equal(rb.none:bytes(), rb.first:bytes(), rc.name .. ": nil did not requantize the weight")
      assert.are_not.equal(rb.again:bytes(), rb.none:bytes(), rc.name .. ": true did not requantize the weight")
      for _, k in ipairs { "first", "reuse", "none", "again", "reuse2" } do
        assert_nmse(rb[k], ra[k], 1e-6, rc.name .. " " .. k)
      end
    end)
  end

  for _, dt in ipairs { "f32", "bf16" } do
    test("accumulate_main_grad (" .. dt .. " params): f32 main_grad sums two backwards, zero_grad clears it",
         function()
      for _, rc in ipairs { RECIPES[1], RECIPES[3] } do
        local N, IN, OUT = 64, 96, 64
        local ma, mb = linear_pair(IN, OUT, dt, 12, { accumulate_main_grad = true })
        local sa = rc.make and lutra.autocast { recipe = rc.make() }
        local sb = rc.make and lutra.autocast { recipe = rc.make() }
        for k = 1, 2 do
          local xa, xb = randn_pair({ N, IN }, dt, 2050 + k, 1)
          local dya, dyb = randn_pair({ N, OUT }, dt, 2060 + k, 1)
          fwd_bwd(ma, sa, xa, dya)
          fwd_bwd(mb, sb, xb, dyb)
        end
        local pb = mb:parameters()
        assert.are.equal("f32", pb[1].main_grad:dtype_name())
        -- main_grad accumulates in f32 on both devices (bf16 params too); dW itself is a
        -- bf16 GEMM output for bf16 params, so that case has the bf16 bound
        local bound = dt == "bf16" and 1e-5 or linear_bound(rc, dt)
        compare_params(ma, mb, bound, dt == "bf16" and 1e-5 or 1e-10, rc.name .. " " .. dt, "main_grad")
        all_zero(pb[1].grad, "grad W with accumulate_main_grad")
        all_zero(pb[2].grad, "grad b with accumulate_main_grad")
        mb:zero_grad()
        all_zero(pb[1].main_grad, "main_grad W after zero_grad")
        all_zero(pb[2].main_grad, "main_grad b after zero_grad")
      end
    end)
  end

  test("Sequential(Linear, GELU, Linear): one step, f32 and under current scaling", function()
    -- recipe none: 1e-10. Current scaling: the second Linear quantizes GELU's output, whose
    -- amax (so its scale) can differ in the last bit between devices, flipping a few codes at
    -- rounding boundaries: NMSE <= 1e-5 (measured far lower).
    for _, rc in ipairs { RECIPES[1], RECIPES[3] } do
      local function net(device)
        return hold(nn.Sequential(nn.Linear(64, 128, { seed = 61, device = device }), nn.GELU(),
                                  nn.Linear(128, 32, { seed = 62, device = device })))
      end
      local na, nb = net(REF), net(DEV)
      local sa = rc.make and lutra.autocast { recipe = rc.make() }
      local sb = rc.make and lutra.autocast { recipe = rc.make() }
      local bound = rc.make and 1e-5 or 1e-10
      for step = 1, 2 do
        local xa, xb = randn_pair({ 128, 64 }, "f32", 630 + step, 1)
        local dya, dyb = randn_pair({ 128, 32 }, "f32", 640 + step, 0.1)
        local ya, dxa = fwd_bwd(na, sa, xa, dya)
        local yb, dxb = fwd_bwd(nb, sb, xb, dyb)
        local what = rc.name .. " Sequential step " .. step
        assert_nmse(yb, ya, bound, what .. " y")
        assert_nmse(dxb, dxa, bound, what .. " dx")
        local pa, pb = na:parameters(), nb:parameters()
        assert.are.equal(4, #pb)
        for i = 1, 4 do assert_nmse(pb[i].grad, pa[i].grad, bound, what .. " grad " .. i) end
      end
    end
  end)
end)

-- ---- optimizers ----------------------------------------------------------------------------

describe("optimizers on " .. DEV, function()
  -- Parameters and gradients are set to the same values on both devices; after each step the
  -- parameters must agree. f32: NMSE <= 1e-10 (the update formulas are elementwise f32; only
  -- sqrt/division rounding can differ, by an ulp: ~1e-14). bf16 parameters are rounded from
  -- f32 masters: an ulp of master difference can flip a bf16 rounding: NMSE <= 1e-5 (and the
  -- masters themselves must exist on the device: see the small-update test).
  local function setup(dt, seed, extra)
    local ma, mb = linear_pair(48, 32, dt, seed, extra)
    return ma, mb
  end

  local function set_grads(ma, mb, seed, scale, field)
    field = field or "grad"
    local pa, pb = ma:parameters(), mb:parameters()
    for i = 1, #pa do
      local g = lutra.tensor(pa[i].value:dims(), "f32", REF):randn(seed + i, 0, scale):read()
      pa[i][field]:set(g)
      pb[i][field]:set(g)
    end
  end

  local function compare_values(ma, mb, dt, what)
    local pa, pb = ma:parameters(), mb:parameters()
    for i = 1, #pa do
      assert_nmse(pb[i].value, pa[i].value, hp_bound(dt), what .. " param " .. i)
    end
  end

  for _, dt in ipairs { "f32", "bf16" } do
    test("SGD with momentum and weight decay, five steps (" .. dt .. " params)", function()
      local ma, mb = setup(dt, 71)
      local oa = lutra.optim.SGD(ma, { lr = 0.05, momentum = 0.9, weight_decay = 0.1 })
      local ob = lutra.optim.SGD(mb, { lr = 0.05, momentum = 0.9, weight_decay = 0.1 })
      for step = 1, 5 do
        set_grads(ma, mb, 7100 + 10 * step, 1)
        if step == 4 then oa:set_lr(0.01) ob:set_lr(0.01) end
        oa:step()
        ob:step()
        compare_values(ma, mb, dt, "SGD step " .. step)
      end
    end)

    test("AdamW with weight decay, five steps, mixed gradient sizes (" .. dt .. " params)", function()
      local ma, mb = setup(dt, 72)
      local opts = { lr = 0.01, weight_decay = 0.1, beta1 = 0.8, beta2 = 0.95, eps = 1e-3 }
      local oa, ob = lutra.optim.AdamW(ma, opts), lutra.optim.AdamW(mb, opts)
      for step = 1, 5 do
        set_grads(ma, mb, 7200 + 10 * step, step == 2 and 0.01 or 1)
        oa:step()
        ob:step()
        compare_values(ma, mb, dt, "AdamW step " .. step)
      end
    end)

    test("AdamW steps on main_grad (accumulate_main_grad, " .. dt .. " params)", function()
      local ma, mb = setup(dt, 73, { accumulate_main_grad = true })
      local oa = lutra.optim.AdamW(ma, { lr = 0.003 })
      local ob = lutra.optim.AdamW(mb, { lr = 0.003 })
      for step = 1, 3 do
        set_grads(ma, mb, 7300 + 10 * step, 1, "main_grad")
        oa:step()
        ob:step()
        compare_values(ma, mb, dt, "AdamW on main_grad step " .. step)
      end
    end)
  end

  test("bf16 parameters keep f32 masters on the device (small updates are not lost)", function()
    -- the CPU spec's hand-computed case: each update (1e-3) is below half a bf16 ulp at 1.0, so
    -- without f32 masters nothing would move
    for _, kind in ipairs { "SGD", "AdamW" } do
      local function build(device)
        local m = nn.Linear(4, 2, { dtype = "bf16", seed = 1, device = device })
        local p = m:parameters()
        p[1].value:set({ 1, -1, 0.5, 2, 1, 1, 1, 1 })
        p[2].value:set({ 1, -2 })
        local o = kind == "SGD" and lutra.optim.SGD(m, { lr = 1e-3 })
                                or lutra.optim.AdamW(m, { lr = 1e-3, weight_decay = 0 })
        p[1].grad:set({ 1, 1, 1, 1, 1, 1, 1, 1 })
        p[2].grad:set({ 1, -1 })
        for _ = 1, 10 do o:step() end
        return m, p
      end
      local ma, pa = build(REF)
      local mb, pb = build(DEV)
      -- SGD: w - 10 * 1e-3 * g; AdamW with a constant gradient: each step moves lr * sign(g)
      -- (m_hat / sqrt(v_hat) = +-1 up to eps), the same ten 1e-3 moves
      assert.are.same({ 0.98828125, -1.0078125, 0.490234375, 1.9921875,
                        0.98828125, 0.98828125, 0.98828125, 0.98828125 }, pb[1].value:to_table(),
                      kind .. " weights on " .. DEV)
      assert.are.same({ 0.98828125, -1.9921875 }, pb[2].value:to_table(), kind .. " bias on " .. DEV)
      assert.are.same(pa[1].value:to_table(), pb[1].value:to_table())
      assert.is_true(ma ~= nil and mb ~= nil)
    end
  end)
end)

-- ---- autocast ------------------------------------------------------------------------------

describe("autocast with modules on " .. DEV, function()
  local function stack(device)
    local l1 = nn.Linear(64, 48, { seed = 301, device = device })
    local l2 = nn.Linear(48, 32, { seed = 302, device = device })
    local l3 = nn.Linear(32, 16, { seed = 303, device = device })
    return hold(nn.Sequential(l1, l2, l3)), { l1, l2, l3 }
  end

  test("ONE delayed-scaling update per outermost exit and one per backward, none at inner exits",
       function()
    local x = lutra.tensor({ 32, 64 }, "f32", DEV):randn(3030, 0, 1)
    local dy = lutra.tensor({ 32, 16 }, "f32", DEV):randn(3031, 0, 0.01)
    local net, ls = stack(DEV)
    local outer = lutra.autocast { recipe = R.delayed() }
    local inner = lutra.autocast { recipe = R.delayed() }
    for iter = 1, 3 do
      local u0 = lutra.update_stats()
      outer:enter()
      inner:enter()
      local ok, err = pcall(net.forward, net, x)
      inner:exit()
      local u_inner = lutra.update_stats()
      outer:exit()
      assert.is_true(ok, tostring(err))
      assert.are.equal(u0, u_inner, "an inner exit ran an update")
      local u1, n1 = lutra.update_stats()
      assert.are.equal(u0 + 1, u1, "iteration " .. iter .. ": updates at the outermost exit")
      assert.are.equal(6, n1, "quantizers covered by the forward update")
      net:backward(dy)
      local u2, n2 = lutra.update_stats()
      assert.are.equal(u1 + 1, u2, "iteration " .. iter .. ": updates after backward")
      assert.are.equal(3, n2, "quantizers covered by the backward update")
    end
    -- the update ran on the device's state: scales are fp8_max / amax, exactly
    local xv, wv, gv = x:to_table(), ls[1]:parameters()[1].value:to_table(), dy:to_table()
    local function amax(t)
      local m = 0
      for i = 1, #t do m = math.max(m, math.abs(t[i])) end
      return m
    end
    assert.are.equal(f32(448 / amax(xv)), (ls[1]:quantizer("input"):scale()))
    assert.are.equal(f32(448 / amax(wv)), (ls[1]:quantizer("weight"):scale()))
    assert.are.equal(f32(57344 / amax(gv)), (ls[3]:quantizer("grad_output"):scale()))
  end)

  test("delayed scales after autocast steps match the CPU's", function()
    -- first layer (input, weight) and last layer (grad_output) see identical tensors on both
    -- devices: identical scales and histories. Inner tensors (outputs of an earlier GEMM) may
    -- differ in the last bits: their scales must agree to 1e-5 relative.
    local xa, xb = randn_pair({ 32, 64 }, "f32", 3130, 1)
    local dya, dyb = randn_pair({ 32, 16 }, "f32", 3131, 0.01)
    local na, la = stack(REF)
    local nb, lb = stack(DEV)
    local sa = lutra.autocast { recipe = R.delayed { amax_history_len = 4 } }
    local sb = lutra.autocast { recipe = R.delayed { amax_history_len = 4 } }
    for _ = 1, 3 do
      fwd_bwd(na, sa, xa, dya)
      fwd_bwd(nb, sb, xb, dyb)
    end
    for i = 1, 3 do
      for _, role in ipairs { "input", "weight", "grad_output" } do
        local a, b = (la[i]:quantizer(role):scale()), (lb[i]:quantizer(role):scale())
        local exact = (i == 1 and role ~= "grad_output") or (i == 3 and role == "grad_output")
           or role == "weight"
        if exact then
          assert.are.equal(a, b, string.format("layer %d %s scale", i, role))
          assert.are.same(la[i]:quantizer(role):history(4), lb[i]:quantizer(role):history(4))
        else
          -- later layers see activations computed with another f32 summation order (and
          -- FP8 rounding flips that follow from it): measured 6.7e-5 relative on the H200
          assert.is_true(math.abs(a - b) <= 1e-3 * a,
                         string.format("layer %d %s scale %.9g vs reference %.9g", i, role, b, a))
        end
      end
    end
  end)

  test("recipes without delayed scaling run no update calls on " .. DEV, function()
    local m = nn.Linear(32, 32, { seed = 55, device = DEV })
    local x = lutra.tensor({ 32, 32 }, "f32", DEV):randn(56)
    local dy = lutra.tensor({ 32, 32 }, "f32", DEV):randn(57)
    for _, r in ipairs { R.current(), R.mxfp8(), R.block() } do
      local u0, n0 = lutra.update_stats()
      lutra.autocast { recipe = r }:run(function() m:forward(x) end)
      m:backward(dy)
      assert.are.same({ u0, n0 }, { lutra.update_stats() })
    end
  end)

  test("calibration computes in high precision and sets the CPU's scales", function()
    local ma, mb = linear_pair(48, 32, "f32", 91)
    local xa, xb = randn_pair({ 16, 48 }, "f32", 1091, 3)
    local y_hp = keep(mb:forward(xb))
    local function calibrate(m, x)
      local u0 = lutra.update_stats()
      local cal = lutra.autocast { recipe = R.delayed { amax_history_len = 4 }, enabled = false,
                                   calibrating = true }
      local y
      cal:run(function() y = keep(m:forward(x)) end)
      local u1, n1 = lutra.update_stats()
      assert.are.equal(u0 + 1, u1)
      assert.are.equal(2, n1)
      return y
    end
    calibrate(ma, xa)
    local y_cal = calibrate(mb, xb)
    same_values(y_cal, y_hp, "calibrating forward vs plain forward on " .. DEV)
    compare_scales(ma, mb, "after calibration", 4)
  end)
end)

-- ---- errors --------------------------------------------------------------------------------

describe("device errors on " .. DEV, function()
  local function err_of(fn)
    local ok, msg = pcall(fn)
    assert.is_false(ok, "expected an error, the call succeeded")
    return (tostring(msg):gsub("^[^%s:]+%.lua:%d+: ", "", 1))
  end
  local function expect(fn, text)
    local msg = err_of(fn)
    assert.is_truthy(msg:find(text, 1, true), string.format("%q does not contain %q", msg, text))
  end

  test("a CPU tensor given to a " .. DEV .. " Linear (and the reverse) is a clear error naming the call",
       function()
    local m = nn.Linear(32, 16, { seed = 5, device = DEV })
    local mc = nn.Linear(32, 16, { seed = 5, device = REF })
    local x_dev = lutra.tensor({ 8, 32 }, "f32", DEV):randn(1)
    local x_cpu = lutra.tensor({ 8, 32 }, "f32", REF):randn(1)
    local dy_dev = lutra.tensor({ 8, 16 }, "f32", DEV):randn(2)
    local dy_cpu = lutra.tensor({ 8, 16 }, "f32", REF):randn(2)
    if DEV ~= REF then
      expect(function() m:forward(x_cpu) end,
             "lutra_linear_forward: input is on another device than the module")
      expect(function() mc:forward(x_dev) end,
             "lutra_linear_forward: input is on another device than the module")
      m:forward(x_dev)
      expect(function() m:backward(dy_cpu) end,
             "lutra_linear_backward: grad_output is on another device than the module")
      local q = lutra.quantizer(R.current(), "input", { device = DEV })
      expect(function() q:quantize(x_cpu) end,
             "lutra_quantize: input is on another device than the quantizer")
      expect(function() lutra.gemm(x_dev, true, x_cpu, false, lutra.tensor({ 8, 8 }, "f32", DEV)) end,
             "lutra_gemm: operands on different devices")
      expect(function() lutra.tensor({ 8, 32 }, "f32", DEV):copy(x_cpu) end,
             "lutra_tensor_copy: dst and src are on different devices")
      expect(function() nn.MSELoss():forward(dy_dev, dy_cpu) end,
             "lutra_loss_forward: target is on another device than pred")
      expect(function()
        lutra.optim.SGD(nn.Sequential(nn.Linear(4, 4, { device = REF }), nn.Linear(4, 4, { device = DEV })))
      end, "lutra_optim_new: parameters on different devices")
      local g = nn.GELU()
      g:forward(x_dev)
      expect(function() g:backward(x_cpu) end, "lutra_gelu_backward: grad_output does not match")
    end
    -- the refused calls changed nothing: the module still computes what the CPU's does
    local ya, dxa = fwd_bwd(mc, nil, x_cpu, dy_cpu)
    local yb, dxb = fwd_bwd(m, nil, x_dev, dy_dev)
    assert_nmse(yb, ya, 1e-10, "y after refused calls")
    assert_nmse(dxb, dxa, 1e-10, "dx after refused calls")
    compare_params(mc, m, 1e-10, 1e-10, "after refused calls")
  end)
end)
