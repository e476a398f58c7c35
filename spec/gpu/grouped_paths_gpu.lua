-- GroupedLinear's other cuda paths against the CPU backend, with new splits every call, empty
-- experts and splits that are no multiple of anything:
--   f32          one cuBLASLt f32 GEMM per expert from host m_splits; device m_splits refused,
--                naming why
--   MXFP8,       the split quantization in one launch per role (codes and scales bit for bit the
--   1x128 and    CPU's: make sim-grouped checks the kernels byte for byte), then, as Linear does
--   128x128      on Hopper, each operand dequantized to bf16 in one launch for all experts and
--   blocks       the bf16 grouped GEMM
--
-- Tolerances: f32 on both sides (cuBLASLt's CUBLAS_COMPUTE_32F, OpenBLAS's sgemm): only the
-- summation order differs, NMSE <= 1e-10 (an f32 rounding is ~1e-15; a wrong expert offset
-- gives ~1). Block-scaled: the same codes and scales on both sides, and the dequantized
-- operands are exact in bf16 (power-of-two scales), so the GEMMs see the same values; they sum
-- in another order (f32 accumulation in CUTLASS's tiles against OpenBLAS), and y, dx and dW are
-- rounded to bf16: NMSE <= 1e-4, as for the per-tensor FP8 grouped path (a wrong scale block
-- or expert offset gives >= 1e-2).
--
-- Run: LUTRA_TEST_DEVICE=cuda make test-gpu (or the CPU smoke test: LUTRA_TEST_DEVICE=cpu).
local lutra = require("lutra")
local nn = lutra.nn
local S = require("spec.gpu.support")
local DEV, REF, hold = S.DEV, S.REF, S.hold
local function test(name, fn) S.test(it, name, fn) end

local NUM, IN, OUT = 5, 48, 80

-- a quarter of the experts empty
local function random_splits(num, total, seed) return S.random_splits(num, total, seed, 0.25) end

local function pair(opts)
  local a = { bias = opts.bias, dtype = opts.dtype, seed = opts.seed,
              accumulate_main_grad = opts.amg }
  local ref = hold(nn.GroupedLinear(NUM, IN, OUT, a))
  a.device = DEV
  return ref, hold(nn.GroupedLinear(NUM, IN, OUT, a))
end

local compare_params = S.assert_grads_nmse

describe("nn.GroupedLinear's f32 path on " .. DEV .. " against " .. REF, function()
  for ci, case in ipairs { { name = "f32 with bias" }, { name = "f32 without bias", bias = false },
                           { name = "f32 into main_grad", amg = true } } do
    test(case.name .. ": forward and backward with new host splits every call", function()
      local ref, dev = pair { dtype = "f32", bias = case.bias, amg = case.amg, seed = 60 + ci }
      -- host splits as a Lua table on one side, a CPU tensor on the other
      S.assert_grouped_steps(ref, dev, {
        steps = 4, rows = 150, in_ = IN, out = OUT, dtype = "f32", host_splits = true,
        splits = function(step) return random_splits(NUM, 150, 700 * ci + step) end,
        seeds = function(step) return 31 * step + ci, 37 * step + ci end,
        bound = 1e-10, amg = case.amg, what = case.name })
    end)
  end

  test("f32 with device splits is refused on cuda, naming the reason", function()
    if DEV == "cpu" then return end
    local _, dev = pair { dtype = "f32", seed = 5 }
    local x = lutra.tensor({ 32, IN }, "f32", DEV):randn(2)
    local sp = lutra.from_table({ 8, 0, 8, 16, 0 }, { NUM }, "i32", DEV)
    local ok, err = pcall(function() dev:forward(x, sp) end)
    assert.is_false(ok)
    assert.matches("needs host m_splits", tostring(err), 1, true)
    -- the refusal changed nothing: host splits still run
    local y = dev:forward(x, { 8, 0, 8, 16, 0 })
    assert.are.equal(32, y:dims()[1])
  end)
end)

describe("nn.GroupedLinear under the block-scaled recipes on " .. DEV .. " against " .. REF,
         function()
  local R = lutra.recipe
  local BIN, BOUT = 64, 96 -- MXFP8 needs multiples of 32
  local CASES = {
    { name = "MXFP8", recipe = function() return R.mxfp8 {} end },
    { name = "MXFP8 into main_grad", amg = true, recipe = function() return R.mxfp8 {} end },
    { name = "1x128 / 128x128 blocks", recipe = function() return R.block {} end },
    { name = "1x128 / 128x128 blocks into main_grad, no bias", amg = true, bias = false,
      recipe = function() return R.block {} end },
  }
  for ci, case in ipairs(CASES) do
    test(case.name .. ": forward and backward with new device splits every call", function()
      local a = { bias = case.bias, dtype = "bf16", seed = 80 + ci, accumulate_main_grad = case.amg }
      local ref = hold(nn.GroupedLinear(NUM, BIN, BOUT, a))
      a.device = DEV
      local dev = hold(nn.GroupedLinear(NUM, BIN, BOUT, a))
      S.assert_grouped_steps(ref, dev, {
        steps = 3, rows = 230, in_ = BIN, out = BOUT, dtype = "bf16", recipe = case.recipe,
        splits = function(step) return random_splits(NUM, 230, 900 * ci + step) end,
        seeds = function(step) return 13 * step + ci, 17 * step + ci end,
        check = DEV ~= "cpu", bound = 1e-4, amg = case.amg, what = case.name })
    end)
  end
end)

describe("nn.GroupedLinear's per-expert path as graphs per host split pattern on " .. DEV,
         function()
  -- a graph replays the kernels the eager pass ran, on the same plans: bit for bit the eager
  -- results (the cache off), whatever the patterns do
  for _, dt in ipairs { "bf16", "f32" } do
    test(dt .. ": changing and returning patterns replayed equal eager, within the bound",
         function()
      local function make(capacity)
        local m = hold(nn.GroupedLinear(NUM, IN, OUT, { dtype = dt, device = DEV, seed = 21 }))
        m:set_path("per_expert")
        m:set_graph_capacity(capacity)
        return m, hold(lutra.optim.SGD(m, { lr = 1e-2 }))
      end
      local cached, opt_c = make(2)
      local eager, opt_e = make(0)
      local T = 120
      local pats = {}
      for i = 1, 4 do pats[i] = random_splits(NUM, T, 4000 + i) end
      -- returning (1, 2), changing (3, 4: more patterns than the cache holds)
      local order = { 1, 1, 2, 1, 2, 2, 3, 1, 4, 2, 1, 1, 3, 3, 4, 1 }
      local x = lutra.tensor({ T, IN }, dt, DEV)
      local dy = lutra.tensor({ T, OUT }, dt, DEV)
      for step, p in ipairs(order) do
        x:randn(100 + step)
        dy:randn(200 + step)
        local yc, ye = cached:forward(x, pats[p]), eager:forward(x, pats[p])
        assert.are.equal(ye:bytes(), yc:bytes(), "y, step " .. step)
        local dxc, dxe = cached:backward(dy), eager:backward(dy)
        assert.are.equal(dxe:bytes(), dxc:bytes(), "dx, step " .. step)
        local pc, pe = cached:parameters(), eager:parameters()
        for i = 1, #pc do
          assert.are.equal(pe[i].grad:bytes(), pc[i].grad:bytes(), "grad " .. i .. ", step " .. step)
        end
        opt_c:step()
        opt_e:step() -- the graphs read the weights as they are at each replay
      end
      local s = cached:graph_stats()
      assert.is_true(s.entries <= 2, "entries within the capacity")
      assert.is_true(s.evictions > 0, "the changing patterns evicted")
      if DEV == "cuda" then
        assert.is_true(s.captures > 0, "patterns were captured")
        assert.is_true(s.replays > 0, "patterns were replayed")
      else
        assert.are.equal(0, s.captures)
      end
    end)
  end

  test("host splits reach the device in order without the host waiting (the pinned ring)",
       function()
    -- more forwards than the staging ring has slots, nothing read back until the end: every
    -- step's splits must have reached its own kernels (main_grad sums all steps)
    local a = { dtype = "bf16", seed = 33, accumulate_main_grad = true }
    local ref = hold(nn.GroupedLinear(NUM, IN, OUT, a))
    a.device = DEV
    local dev = hold(nn.GroupedLinear(NUM, IN, OUT, a))
    local T = 64
    local xr, xd = S.randn_pair({ T, IN }, "bf16", 5)
    local dyr, dyd = S.randn_pair({ T, OUT }, "bf16", 6)
    for step = 1, 80 do
      local sp = random_splits(NUM, T, 7000 + step)
      ref:forward(xr, sp)
      ref:backward(dyr)
      dev:forward(xd, sp)
      dev:backward(dyd)
    end
    compare_params(ref, dev, 1e-4, "after 80 steps of host splits", "main_grad")
  end)
end)
