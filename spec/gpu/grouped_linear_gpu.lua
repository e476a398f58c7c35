-- nn.GroupedLinear on the device under test against the CPU backend: forward, backward (dx, every
-- expert's dW and db, main_grad accumulation), in bf16 and under per-tensor FP8 (delayed and
-- current scaling), with device m_splits that change every call (empty experts, sizes that are
-- no multiple of anything); a bad device split reported by check_splits; and a CUDA graph of the
-- training step replayed with new device splits each replay equal to the same steps run eagerly.
--
-- Tolerances: both sides quantize with the same scales to the same codes (the quantization is
-- bit-exact), so only the GEMMs differ: f32 accumulation in another order (the bias is added in
-- f32 before the one rounding into bf16 on both: FPROP's epilogue on cuda): NMSE <= 1e-4 (bf16 output
-- rounding is ~1e-6 NMSE; a wrong expert offset or scale gives ~1). The graph check is bitwise:
-- the grouped kernels are deterministic (no split-K, order-free atomics for amaxes).
--
-- Run: LUTRA_TEST_DEVICE=cuda make test-gpu (or the CPU smoke test: LUTRA_TEST_DEVICE=cpu).
-- MXFP8 and the 1x128 / 128x128 block recipes: spec/gpu/grouped_paths_gpu.lua.
local lutra = require("lutra")
local nn, R = lutra.nn, lutra.recipe
local S = require("spec.gpu.support")
local DEV, REF, hold = S.DEV, S.REF, S.hold
local function test(name, fn) S.test(it, name, fn) end

local NUM, IN, OUT = 6, 64, 96

local random_splits = S.random_splits

local function pair(opts)
  local a = { bias = opts.bias, dtype = "bf16", seed = opts.seed, accumulate_main_grad = opts.amg }
  local ref = hold(nn.GroupedLinear(NUM, IN, OUT, a))
  a.device = DEV
  local dev = hold(nn.GroupedLinear(NUM, IN, OUT, a))
  return ref, dev
end

describe("nn.GroupedLinear on " .. DEV .. " against " .. REF, function()
  local CASES = {
    { name = "bf16" },
    { name = "bf16 without bias", bias = false },
    { name = "bf16 into main_grad", amg = true },
    { name = "FP8 delayed scaling", recipe = function() return R.delayed { amax_history_len = 4 } end },
    { name = "FP8 current scaling", recipe = function() return R.current {} end },
    { name = "FP8 delayed scaling without bias", bias = false,
      recipe = function() return R.delayed { amax_history_len = 4 } end },
    { name = "FP8 delayed scaling, E4M3 gradients", bias = false,
      recipe = function() return R.delayed { amax_history_len = 4, fp8_format = "e4m3" } end },
    { name = "FP8 current scaling into main_grad", amg = true,
      recipe = function() return R.current {} end },
  }
  for ci, case in ipairs(CASES) do
    test(case.name .. ": forward and backward with new device splits every call", function()
      local ref, dev = pair { bias = case.bias, amg = case.amg, seed = 40 + ci }
      S.assert_grouped_steps(ref, dev, {
        steps = 4, rows = 200, in_ = IN, out = OUT, dtype = "bf16", recipe = case.recipe,
        splits = function(step) return random_splits(NUM, 200, 1000 * ci + step) end,
        seeds = function(step) return 77 * step + ci, 91 * step + ci end,
        check = true, bound = 1e-4, amg = case.amg, what = case.name })
    end)
  end

  -- 40 experts under delayed scaling: 80 metas in the scope's forward update, 40 in the
  -- backward's, more than the 16 of the update's small graph key (backend_cuda.c: the wide key
  -- of up to 128). From the second step the updates replay as graphs; the scales they leave must
  -- still be the CPU's, step after step (the outputs follow from them; bench/grouped_bench.lua
  -- counts what runs as graphs).
  test("FP8 delayed scaling, 40 experts: the scope's wide updates replayed as graphs", function()
    local num = 40
    local a = { dtype = "bf16", seed = 71 }
    local ref = hold(nn.GroupedLinear(num, IN, OUT, a))
    a.device = DEV
    local dev = hold(nn.GroupedLinear(num, IN, OUT, a))
    S.assert_grouped_steps(ref, dev, {
      steps = 5, rows = 400, in_ = IN, out = OUT, dtype = "bf16",
      recipe = function() return R.delayed { amax_history_len = 4 } end,
      splits = function(step) return random_splits(num, 400, 700 + step) end,
      seeds = function(step) return 31 * step, 37 * step end,
      bound = 1e-4, what = "40 experts, delayed" })
  end)

  -- more experts than the GEMM setup kernel's threads (kernels/grouped/grouped_gemm_sm90.cu:
  -- each thread sums a run of experts before one block-wide scan places the runs), many empty
  test("300 experts: the row offsets of runs of experts", function()
    local num = 300
    local a = { dtype = "bf16", seed = 75 }
    local ref = hold(nn.GroupedLinear(num, 16, 32, a))
    a.device = DEV
    local dev = hold(nn.GroupedLinear(num, 16, 32, a))
    S.assert_grouped_steps(ref, dev, {
      steps = 2, rows = 700, in_ = 16, out = 32, dtype = "bf16",
      splits = function(step) return random_splits(num, 700, 750 + step) end,
      seeds = function(step) return 41 * step, 43 * step end,
      check = true, bound = 1e-4, what = "300 experts" })
  end)

  -- current scaling's one-launch cast (kernels/grouped/grouped_quantize.cu, k_amax_cast) with
  -- far more tiles than the device holds at once (40000 rows: ~5000 blocks for the input's cast
  -- and as many for the output gradient's): casts wait for their experts' maxima while later
  -- maxima are still read; every scale and code must still be the CPU's
  test("FP8 current scaling, more tiles than resident blocks: the one-launch cast", function()
    local ref, dev = pair { seed = 81 }
    S.assert_grouped_steps(ref, dev, {
      steps = 2, rows = 40000, in_ = IN, out = OUT, dtype = "bf16",
      recipe = function() return R.current {} end,
      splits = function(step) return random_splits(NUM, 40000, 810 + step) end,
      seeds = function(step) return 83 * step, 89 * step end,
      bound = 1e-4, what = "40000 rows, current" })
  end)

  -- the forward reads the caller's device splits in place and its GEMM keeps the copy the
  -- backward reads: splits overwritten between the two must not reach the backward
  for _, case in ipairs { { name = "bf16" },
                          { name = "FP8 delayed scaling",
                            recipe = function() return R.delayed { amax_history_len = 4 } end } } do
    test(case.name .. ": the backward takes the forward's splits, not the caller's tensor since",
         function()
      local ref, dev = pair { seed = 60 }
      local scope_r, scope_d = S.autocast_pair(case.recipe)
      local T = 150
      local splits, other = random_splits(NUM, T, 61), random_splits(NUM, T, 62)
      local dsplits = lutra.from_table(splits, { NUM }, "i32", DEV)
      local xr, xd = S.randn_pair({ T, IN }, "bf16", 63)
      local dyr, dyd = S.randn_pair({ T, OUT }, "bf16", 64)
      S.under(scope_r, function() return ref:forward(xr, splits) end)
      S.under(scope_d, function() return dev:forward(xd, dsplits) end)
      dsplits:set(other)
      local dxr, dxd = ref:backward(dyr), dev:backward(dyd)
      dev:check_splits()
      S.assert_nmse(dxd, dxr, 1e-4, case.name .. ": dx")
      S.assert_grads_nmse(ref, dev, 1e-4, case.name, "grad")
    end)
  end

  test("reports a bad device split at the next check, and writes nothing", function()
    local _, dev = pair { seed = 3 }
    local x = lutra.tensor({ 40, IN }, "bf16", DEV):randn(5)
    local bad = lutra.from_table({ 10, 10, 10, 10, 10, 10 }, { NUM }, "i32", DEV)
    if DEV == "cpu" then
      -- on the CPU the device is the host: refused at once
      assert.has_error(function() dev:forward(x, bad) end)
      return
    end
    dev:forward(x, bad)
    local ok, err = pcall(dev.check_splits, dev)
    assert.is_false(ok)
    assert.matches("lutra_grouped_check: device m_splits", tostring(err), 1, true)
    dev:check_splits() -- cleared by the report
  end)

  test("a CUDA graph of the training step replayed with new device splits equals eager", function()
    if DEV ~= "cuda" then return end
    local T, N = 256, 5
    local function trainer(recipe)
      local t = {}
      t.net = hold(nn.GroupedLinear(NUM, IN, OUT, { dtype = "bf16", device = DEV, seed = 11 }))
      t.opt = hold(lutra.optim.SGD(t.net, { lr = 1e-2 }))
      t.loss = hold(nn.MSELoss())
      t.scope = recipe and hold(lutra.autocast { recipe = recipe }) or nil
      t.x = lutra.tensor({ T, IN }, "bf16", DEV)
      t.target = lutra.tensor({ T, OUT }, "bf16", DEV)
      t.splits = lutra.tensor({ NUM }, "i32", DEV)
      t.step = S.training_step(t, function() return t.net:forward(t.x, t.splits) end)
      return t
    end
    for _, recipe in ipairs { false, R.delayed { amax_history_len = 4 } } do
      local eager, graphed = trainer(recipe or nil), trainer(recipe or nil)
      local xs, ts, ss = {}, {}, {}
      for i = 1, N do
        xs[i] = lutra.tensor({ T, IN }, "bf16", DEV):randn(300 + i)
        ts[i] = lutra.tensor({ T, OUT }, "bf16", DEV):randn(400 + i)
        ss[i] = random_splits(NUM, T, 500 + i)
      end
      local function feed(t, i)
        t.x:copy(xs[i]); t.target:copy(ts[i]); t.splits:set(ss[i])
      end
      S.eager_steps(eager, N, feed)
      local g = S.replayed_steps(graphed, N, feed)
      graphed.net:check_splits()
      S.assert_same_params(eager, graphed, string.format("%s, after %d replays",
                                                         recipe and "FP8" or "bf16", N - 1))
      g:destroy()
    end
  end)
end)
