-- GroupedLinear's grouped GEMMs replayed as cached CUDA graphs (src/backend/cuda/call_graphs.c,
-- src/backend/cuda/grouped_cuda.c): a grouped GEMM call seen again with the same arguments (the
-- module's buffers, the caller's x and device splits, the same workspace and stream) runs as
-- one cudaGraphLaunch of its setup and CUTLASS kernels. The graph's setup kernel reads the
-- splits and the FP8 scales from device memory when it runs, so a replay must give what a direct
-- call gives: the CPU backend's results (the bounds of spec/gpu/grouped_linear_gpu.lua: NMSE
-- <= 1e-4) after x, dy, the device splits and (delayed scaling) the scales have changed in place,
-- and, for repeated inputs, the first call's values bit for bit (the grouped kernels are
-- deterministic). The module's outputs are poisoned with NaN before every call, so an output a
-- replay did not write shows up. On cuda, lutra.gemm_graph_stats() must show the calls served by
-- graphs.
local lutra = require("lutra")
local ffi = require("ffi")
local nn, R = lutra.nn, lutra.recipe
local S = require("spec.gpu.support")
local DEV, REF, hold = S.DEV, S.REF, S.hold
local function test(name, fn) S.test(it, name, fn) end

local NUM, IN, OUT, ROWS = 6, 64, 96, 200

local function served()
  local _, launches = lutra.gemm_graph_stats()
  return launches
end

local function values(t) return t:to_table() end


local same_values = S.same_values

local function grads_of(m)
  local out = {}
  for i, p in ipairs(m:parameters()) do out[i] = values(p.grad) end
  return out
end

describe("GroupedLinear's grouped GEMMs replayed as cached graphs on " .. DEV, function()
  local CASES = {
    { name = "bf16 with bias" },
    { name = "FP8 current scaling", recipe = function() return R.current {} end },
    { name = "FP8 delayed scaling", recipe = function() return R.delayed { amax_history_len = 4 } end },
  }
  for ci, case in ipairs(CASES) do
    test(case.name .. ": repeated calls, inputs and device splits changed in place", function()
      local a = { bias = true, dtype = "bf16", seed = 300 + ci }
      local ref = hold(nn.GroupedLinear(NUM, IN, OUT, a))
      a.device = DEV
      local dev = hold(nn.GroupedLinear(NUM, IN, OUT, a))
      local scope_r, scope_d = S.autocast_pair(case.recipe)
      local xr, xd = S.randn_pair({ ROWS, IN }, "bf16", 310 + ci)
      local dyr, dyd = S.randn_pair({ ROWS, OUT }, "bf16", 320 + ci)
      local splits = S.random_splits(NUM, ROWS, 330 + ci)
      local dsplits = lutra.tensor({ NUM }, "i32", DEV):set(splits)
      local before = served()
      local first, yd, dxd
      local steps = 6
      for step = 1, steps do
        if step == 4 then -- new values in the same buffers: a replay reads them
          xr:randn(340 + ci)
          xd:randn(340 + ci)
          dyr:randn(350 + ci, 0, 2)
          dyd:randn(350 + ci, 0, 2)
          splits = S.random_splits(NUM, ROWS, 360 + ci)
          dsplits:set(splits)
        end
        if yd then yd:fill(0 / 0) end
        if dxd then dxd:fill(0 / 0) end
        local what = case.name .. ", call " .. step
        local yr = S.under(scope_r, function() return ref:forward(xr, splits) end)
        yd = S.under(scope_d, function() return dev:forward(xd, dsplits) end)
        local dxr
        dxr, dxd = ref:backward(dyr), dev:backward(dyd)
        dev:check_splits()
        S.assert_nmse(yd, yr, 1e-4, what .. ": y")
        S.assert_nmse(dxd, dxr, 1e-4, what .. ": dx")
        S.assert_grads_nmse(ref, dev, 1e-4, what, "grad")
        -- current scaling takes its scales from these inputs alone, bf16 has none: the calls
        -- before the inputs change are the same computation; delayed scaling's scales move
        if not case.recipe or case.name:find("current") then
          if step == 1 then
            first = { y = values(yd), dx = values(dxd), grads = grads_of(dev) }
          elseif step < 4 then
            same_values(values(yd), first.y, what .. ": y against call 1")
            same_values(values(dxd), first.dx, what .. ": dx against call 1")
            for i, g in ipairs(grads_of(dev)) do
              same_values(g, first.grads[i], what .. ": grad " .. i .. " against call 1")
            end
          end
        end
      end
      if DEV == "cuda" then
        -- three grouped GEMMs a step (FPROP, DGRAD, WGRAD); from the second step on each is a
        -- graph launch unless a key changed
        local got = served() - before
        assert.is_true(got >= 3 * (steps - 1), string.format(
          "%s: %d grouped GEMM calls served by graphs, expected at least %d", case.name, got,
          3 * (steps - 1)))
      end
    end)
  end

  -- CUDA refuses a cudaGraphLaunch on a capturing stream: a cached call made while someone else
  -- captures lutra's stream (here a plain cudaStreamBeginCapture, not lutra.graph) must go into
  -- that capture as a child graph, and the captured graph must then compute what the calls would
  test("inside someone else's capture of lutra's stream a cached call goes in as a child graph",
       function()
    if DEV ~= "cuda" then return end -- a CUDA stream capture: nothing to check on the CPU
    S.with_caller_stream(function(rt, stream)
      local a = { bias = true, dtype = "bf16", seed = 500 }
      local ref = hold(nn.GroupedLinear(NUM, IN, OUT, a))
      a.device = DEV
      local dev = hold(nn.GroupedLinear(NUM, IN, OUT, a))
      local xr, xd = S.randn_pair({ ROWS, IN }, "bf16", 501)
      local splits = S.random_splits(NUM, ROWS, 502)
      local dsplits = lutra.tensor({ NUM }, "i32", DEV):set(splits)
      local Ar, Ad = S.randn_pair({ 128, 96 }, "bf16", 503)
      local Br, Bd = S.randn_pair({ 64, 96 }, "bf16", 504)
      local Dr, Dd = lutra.tensor({ 64, 128 }, "bf16", REF), lutra.tensor({ 64, 128 }, "bf16", DEV)
      local yd
      for _ = 1, 3 do -- seen, captured into its cached graph, launched from it
        yd = dev:forward(xd, dsplits)
        lutra.gemm(Ad, true, Bd, false, Dd)
      end
      lutra.synchronize(DEV)
      local before = served()
      assert.are.equal(0, rt.cudaStreamBeginCapture(stream, 1))
      local okc, errc = pcall(function()
        dev:forward(xd, dsplits)
        lutra.gemm(Ad, true, Bd, false, Dd)
      end)
      local gbox, ebox = ffi.new("void *[1]"), ffi.new("void *[1]")
      local rc = rt.cudaStreamEndCapture(stream, gbox)
      assert(okc, errc)
      assert.are.equal(0, rc, "cudaStreamEndCapture")
      assert.are.equal(2, served() - before, "both calls served by their cached graphs")
      assert.are.equal(0, rt.cudaGraphInstantiate(ebox, gbox[0], 0))
      -- new inputs in the same buffers, outputs poisoned: the captured graph reads and writes them
      xr:randn(505)
      xd:randn(505)
      splits = S.random_splits(NUM, ROWS, 506)
      dsplits:set(splits)
      Ar:randn(507)
      Ad:randn(507)
      yd:fill(0 / 0)
      Dd:fill(0 / 0)
      lutra.synchronize(DEV)
      assert.are.equal(0, rt.cudaGraphLaunch(ebox[0], stream))
      assert.are.equal(0, rt.cudaStreamSynchronize(stream))
      S.assert_nmse(yd, ref:forward(xr, splits), 1e-4, "the captured grouped forward: y")
      lutra.gemm(Ar, true, Br, false, Dr)
      S.assert_nmse(Dd, Dr, 2e-5, "the captured GEMM: D")
      rt.cudaGraphExecDestroy(ebox[0])
      rt.cudaGraphDestroy(gbox[0])
    end)
  end)

  test("a module freed and made again: its graphs go with it, the new one runs correctly",
       function()
    for round = 1, 2 do
      local a = { bias = true, dtype = "bf16", seed = 400 + round }
      local ref = nn.GroupedLinear(NUM, IN, OUT, a)
      a.device = DEV
      local dev = nn.GroupedLinear(NUM, IN, OUT, a)
      local xr, xd = S.randn_pair({ ROWS, IN }, "bf16", 410 + round)
      local splits = S.random_splits(NUM, ROWS, 420 + round)
      local dsplits = lutra.tensor({ NUM }, "i32", DEV):set(splits)
      for call = 1, 3 do
        local yd = dev:forward(xd, dsplits)
        S.assert_nmse(yd, ref:forward(xr, splits), 1e-4,
                      string.format("round %d, call %d: y", round, call))
        yd:fill(0 / 0)
      end
      dev:destroy()
      ref:destroy()
      collectgarbage()
    end
  end)
end)
