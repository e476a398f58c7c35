-- The GEMM front's plan cache is bounded (src/gemm/gemm.c: 4096 plans per thread and device):
-- shapes that change every step, as the per-expert GEMMs of a GroupedLinear on host splits that
-- change every step, drop the plans past the bound instead of adding them forever, and every
-- GEMM still computes what it should (checked against a float64 reference here, 1e-5 relative,
-- on fresh random inputs, outputs poisoned first).
local lutra = require("lutra")

local BOUND = 4096

local function check_gemm(w, x, y, m, n, k, what)
  local wv, xv, yv = w:to_table(), x:to_table(), y:to_table()
  for r = 0, m - 1 do
    for c = 0, n - 1 do
      local s = 0
      for i = 1, k do s = s + xv[r * k + i] * wv[c * k + i] end
      local got = yv[r * n + c + 1]
      assert(math.abs(got - s) <= 1e-5 * math.max(1, math.abs(s)),
             string.format("%s: y[%d, %d] = %.9g, want %.9g", what, r, c, got, s))
    end
  end
end

describe("the GEMM plan cache", function()
  it("stays within its bound when shapes keep changing, and plans again what it dropped", function()
    local K, N = 8, 4
    local w = lutra.tensor({ N, K }):randn(math.random(1, 2 ^ 20))
    -- a GEMM of m rows for every m up to past the bound: without it the cache would hold one
    -- plan per m
    for m = 1, BOUND + 50 do
      local x = lutra.tensor({ m, K }):fill(1)
      local y = lutra.tensor({ m, N })
      lutra.gemm(w, true, x, false, y)
    end
    local plans = lutra.gemm_cache_stats()
    assert.is_true(plans <= BOUND, string.format("%d plans cached", plans))
    -- shapes from before the drop and after it still compute right
    for _, m in ipairs { 1, 3, 77, BOUND + 49, BOUND + 200 } do
      local x = lutra.tensor({ m, K }):randn(math.random(1, 2 ^ 20))
      local y = lutra.tensor({ m, N }):fill(0 / 0)
      lutra.gemm(w, true, x, false, y)
      check_gemm(w, x, y, m, N, K, string.format("m = %d", m))
    end
  end)
end)
