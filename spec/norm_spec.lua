-- LayerNorm and RMSNorm on the CPU backend.
--   forward: against an f64 Lua reference of the same formula (statistics in f64), f32 module:
--            |y - ref| <= 1e-5 (1 + |ref|) per element (the library's element math is f32);
--   backward: dx, dgamma, dbeta against central finite differences (h = 1e-4) of the f64
--            reference of L = sum(y * r), r fixed random: per element
--            |got - num| <= 1e-3 * max|num| + 1e-3 |num| (f32 backward vs. f64 truncation
--            error ~h^2 and cancellation ~1e-16 / h, both far below the bound), y as well
--            (1e-5 relative to max|ref|);
--   bf16 modules against the same reference with 2e-2 relative to max|ref| (bf16 rounding).
local lutra = require("lutra")
local nn = lutra.nn
local N = require("spec.support.norm_modules")

local KINDS = {
  { name = "LayerNorm", new = nn.LayerNorm, rms = false },
  { name = "RMSNorm", new = nn.RMSNorm, rms = true },
}

for _, k in ipairs(KINDS) do
  describe("nn." .. k.name, function()
    for _, zc in ipairs { false, true } do
      local tag = zc and " (zero_centered_gamma)" or ""
      it("forward matches the f64 reference" .. tag, function()
        local rows, h, eps = 5, 24, 1e-5
        local m, g, b = N.new_norm(k.rms, h, { zero_centered_gamma = zc, eps = eps }, 7)
        assert.are.equal(k.rms and 1 or 2, #m:parameters())
        local x = lutra.tensor({ rows, h }):randn(3, 0.5, 2)
        local y = m:forward(x):to_table()
        local want = N.ref_norm(x:to_table(), g:to_table(), b and b:to_table(), rows, h, eps, k.rms,
                                zc)
        for i = 1, #want do
          assert.is_true(math.abs(y[i] - want[i]) <= 1e-5 * (1 + math.abs(want[i])),
                         string.format("y[%d] = %.9g, want %.9g", i, y[i], want[i]))
        end
      end)

      it("backward matches finite differences of the f64 reference" .. tag, function()
        local rows, h, eps = 4, 16, 1e-5
        local m = N.new_norm(k.rms, h, { zero_centered_gamma = zc, eps = eps }, 11)
        local x = lutra.tensor({ rows, h }):randn(13, 0.2, 1.5)
        local rt = lutra.tensor({ rows, h }):randn(14)
        N.check_reference(m, x, rt, function(xv, v)
          return N.ref_norm(xv, v[1], v[2], rows, h, eps, k.rms, zc)
        end, k.name .. " (grad 1: dgamma, 2: dbeta)")
      end)
    end

    -- rows far from zero (offset 1e4, spread 1; one row with an outlier element): LayerNorm's
    -- variance is a sum of squared deviations from the row's mean (two passes), so nothing
    -- cancels; sum(x^2)/n - mean^2 in f32 would lose it (1e8 - 1e8 at 7 digits) and put y off
    -- by O(1). Bound: the f32 rounding of a mean near 1e4 (ulp 1e-3) moves y by about
    -- 1e-3 / sigma; 4e-3 absolute per element.
    it("rows far from zero: y near the f64 reference (no cancellation in the statistics)",
       function()
      local rows, h, eps = 3, 4096, 1e-5
      local m, g, b = N.new_norm(k.rms, h, { eps = eps }, 31)
      local x = lutra.tensor({ rows, h }):randn(math.random(1, 2 ^ 30), 1e4, 1)
      local xt = x:to_table()
      xt[2 * h + 7] = 1e4 + 300 -- row 3: one element 300 sigma out
      x = lutra.from_table(xt, { rows, h })
      local y = m:forward(x):to_table()
      local want = N.ref_norm(xt, g:to_table(), b and b:to_table(), rows, h, eps, k.rms)
      local worst = 0
      for i = 1, #want do worst = math.max(worst, math.abs(y[i] - want[i])) end
      assert.is_true(worst <= 4e-3, string.format("max |y - ref| = %.3g", worst))
    end)

    it("bf16 module: forward and backward near the f64 reference", function()
      local rows, h = 3, 32
      local m = k.new(h, { dtype = "bf16" })
      local x = lutra.tensor({ rows, h }, "bf16"):randn(21)
      local y = m:forward(x):to_table()
      local p = m:parameters()
      local want = N.ref_norm(x:to_table(), p[1].value:to_table(),
                              not k.rms and p[2].value:to_table() or nil, rows, h, 1e-5, k.rms)
      N.assert_close(y, want, 2e-2, "y")
      local dx = m:backward(lutra.tensor({ rows, h }, "bf16"):fill(1))
      assert.are.equal("bf16", dx:dtype_name())
    end)

    it("reuses its output buffer while the shape stays; 3-d inputs normalize the last dim", function()
      local m = k.new(8)
      local a = m:forward(lutra.tensor({ 2, 3, 8 }):randn(1))
      local b = m:forward(lutra.tensor({ 2, 3, 8 }):randn(2))
      assert.are.equal(a.data, b.data)
      assert.are.same({ 2, 3, 8 }, b:dims())
    end)

    it("a grad = false forward keeps nothing for a backward", function()
      local m = k.new(8)
      m:forward(lutra.tensor({ 2, 8 }):randn(1), { grad = false })
      assert.has_error(function() m:backward(lutra.tensor({ 2, 8 }):fill(1)) end)
      local ok, err = pcall(m.backward, m, lutra.tensor({ 2, 8 }):fill(1))
      assert.is_false(ok)
      assert.matches("grad = false", err, 1, true)
    end)

    it("refuses bad inputs naming the call", function()
      local m = k.new(8)
      local fwd = k.rms and "lutra_rmsnorm_forward" or "lutra_layernorm_forward"
      local ok, err = pcall(m.forward, m, lutra.tensor({ 2, 7 }):randn(1))
      assert.is_false(ok)
      assert.matches(fwd, err, 1, true)
      assert.matches("expects 8", err, 1, true)
      ok, err = pcall(m.forward, m, lutra.tensor({ 2, 8 }, "bf16"):randn(1))
      assert.is_false(ok)
      assert.matches(fwd, err, 1, true)
      assert.matches("dtype", err, 1, true)
      ok, err = pcall(m.backward, m, lutra.tensor({ 2, 8 }):fill(1))
      assert.is_false(ok)
      assert.matches("before forward", err, 1, true)
      local where = "lutra.nn." .. k.name
      for _, bad in ipairs {
        function() k.new(0) end, function() k.new(2.5) end,
        function() k.new(8, { dtype = "e4m3" }) end, function() k.new(8, { eps = -1 }) end,
        function() k.new(8, { eps = 0 / 0 }) end, function() k.new(8, { zero_centered_gamma = 1 }) end,
        function() k.new(8, { bias = true }) end,
      } do
        ok, err = pcall(bad)
        assert.is_false(ok)
        assert.is_truthy(err:find(where, 1, true) or err:find("lutra_layernorm_new", 1, true), err)
      end
    end)
  end)
end
