-- Eager GEMMs replayed as cached one-GEMM CUDA graphs (src/backend/cuda/call_graphs.c): a call seen
-- again with the same pointers runs as a graph launch. A graph reads and writes memory when it
-- runs, so a replay must give what a direct call gives: the CPU backend's result, within the
-- plain GEMM's bounds (spec/gpu/ops_gpu.lua: bf16 D 2e-5, FP8 1e-6 for f32 D), after the
-- operands, the output, and an FP8 operand's scale have changed in place (same pointers). Every
-- D is poisoned with NaN before the call, so an output the graph did not write shows up; the
-- replays of one call must be bit-identical. On cuda, lutra.gemm_graph_stats() must show the
-- calls served by graphs.
local lutra = require("lutra")
local R = lutra.recipe
local S = require("spec.gpu.support")
local DEV, REF, assert_nmse, hold = S.DEV, S.REF, S.assert_nmse, S.hold
local function test(name, fn) S.test(it, name, fn) end

local function pair(shape, dtype, seed, std) return S.randn_pair(shape, dtype, seed, std, 0) end

local function served()
  local _, launches = lutra.gemm_graph_stats()
  return launches
end

local function same_values(x, b, what)
  local a = x:to_table()
  assert.are.equal(#b, #a, what)
  for i = 1, #a do
    if not (a[i] == b[i] or (a[i] ~= a[i] and b[i] ~= b[i])) then
      error(string.format("%s: element %d differs: %.9g vs %.9g", what, i, a[i], b[i]))
    end
  end
end

describe("GEMMs replayed as cached graphs on " .. DEV, function()
  test("repeated calls, operands changed in place, accumulate: the CPU's results", function()
    local m, n, k = 96, 128, 160
    local seed = math.random(1, 2 ^ 30)
    local Aa, Ab = pair({ n, k }, "bf16", seed, 1)
    local Ba, Bb = pair({ m, k }, "bf16", seed + 1, 1)
    local Da, Db = lutra.tensor({ m, n }, "bf16", REF), lutra.tensor({ m, n }, "bf16", DEV)
    local before = served()
    local first
    for call = 1, 4 do
      Db:fill(0 / 0)
      lutra.gemm(Ab, true, Bb, false, Db)
      if call == 1 then
        lutra.gemm(Aa, true, Ba, false, Da)
        assert_nmse(Db, Da, 2e-5, "first call")
        first = Db:to_table()
      else
        same_values(Db, first, "call " .. call .. " against the first")
      end
    end
    if DEV == "cuda" then
      assert.is_true(served() - before >= 2, "calls 3 and 4 ran as graph launches")
    end
    -- new values in the same buffers: the replay reads them
    Aa:randn(seed + 2)
    Ab:randn(seed + 2)
    Ba:randn(seed + 3, 0, 3)
    Bb:randn(seed + 3, 0, 3)
    Db:fill(0 / 0)
    lutra.gemm(Ab, true, Bb, false, Db)
    lutra.gemm(Aa, true, Ba, false, Da)
    assert_nmse(Db, Da, 2e-5, "after the operands changed in place")
    -- accumulate (another beta: another call) onto what D holds, twice
    for call = 1, 2 do
      lutra.gemm(Ab, true, Bb, false, Db, nil, true)
      lutra.gemm(Aa, true, Ba, false, Da, nil, true)
      assert_nmse(Db, Da, 2e-5, "accumulate, call " .. call)
    end
  end)

  test("FP8 (current scaling): a replay reads the operands' new scales", function()
    local m, n, k = 64, 96, 128
    local r = R.current()
    local seed = math.random(1, 2 ^ 30)
    local qa = { hold(lutra.quantizer(r, "weight", { device = REF })),
                 hold(lutra.quantizer(r, "input", { device = REF })) }
    local qb = { hold(lutra.quantizer(r, "weight", { device = DEV })),
                 hold(lutra.quantizer(r, "input", { device = DEV })) }
    local Da, Db = lutra.tensor({ m, n }, "f32", REF), lutra.tensor({ m, n }, "f32", DEV)
    for round = 1, 4 do
      -- the quantizers write their outputs (codes and scale) into the same buffers each time;
      -- the scale moves with the inputs' range (std 1, 10, 100, 1000)
      local std = 10 ^ (round - 1)
      local Aa, Ab = pair({ n, k }, "f32", seed + round, std)
      local Ba, Bb = pair({ m, k }, "f32", seed + 10 + round, 1 / std)
      local fa, ga = qa[1]:quantize(Aa), qa[2]:quantize(Ba)
      local fb, gb = qb[1]:quantize(Ab), qb[2]:quantize(Bb)
      Db:fill(0 / 0)
      lutra.gemm(fb, true, gb, false, Db)
      lutra.gemm(fa, true, ga, false, Da)
      assert_nmse(Db, Da, 1e-6, "round " .. round .. " (input std " .. std .. ")")
    end
  end)
end)
