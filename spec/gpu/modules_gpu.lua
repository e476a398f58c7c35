-- GPU modules and losses against the CPU backend: GELU, MSE and softmax cross-entropy (value and
-- gradient), nn.Linear under every recipe with f32 and bf16 parameters (y, dx, dW, db; weight
-- caching across micro-batches; main_grad accumulation) and a Sequential step. Optimizers,
-- autocast with modules and device errors: spec/gpu/module_steps_gpu.lua; the shared checks:
-- spec/gpu/modules_support.lua.
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
local M = require("spec.gpu.modules_support")
local randn_pair, keep, f32 = M.randn_pair, M.keep, M.f32
local assert_nmse, assert_scalar, all_zero = M.assert_nmse, M.assert_scalar, M.all_zero
local same_values, hp_bound, RECIPES = M.same_values, M.hp_bound, M.RECIPES
local linear_bound, linear_pair, fwd_bwd = M.linear_bound, M.linear_pair, M.fwd_bwd
local compare_params, compare_scales = M.compare_params, M.compare_scales

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
