-- LayerNorm and RMSNorm on the CPU backend.
--   forward: against an f64 Lua reference of the same formula (statistics in f64), f32 module:
--            |y - ref| <= 1e-5 (1 + |ref|) per element (the library's element math is f32);
--   backward: dx, dgamma, dbeta against central finite differences (h = 1e-4) of the f64
--            reference of L = sum(y * r), r fixed random: per element
--            |got - num| <= 1e-3 * max|num| + 1e-3 |num| (f32 backward vs. f64 truncation
--            error ~h^2 and cancellation ~1e-16 / h, both far below the bound);
--   bf16 modules against the same reference with 2e-2 relative to max|ref| (bf16 rounding).
local lutra = require("lutra")
local nn = lutra.nn

local function ref_forward(x, g, b, rows, h, eps, rms, zc)
  local y = {}
  for r = 0, rows - 1 do
    local mean, var = 0, 0
    if not rms then
      for c = 1, h do mean = mean + x[r * h + c] end
      mean = mean / h
    end
    for c = 1, h do
      local d = x[r * h + c] - mean
      var = var + d * d
    end
    local rstd = 1 / math.sqrt(var / h + eps)
    for c = 1, h do
      local gg = zc and g[c] + 1 or g[c]
      y[r * h + c] = (x[r * h + c] - mean) * rstd * gg + (rms and 0 or b[c])
    end
  end
  return y
end

local function loss(x, g, b, r, rows, h, eps, rms, zc)
  local y, s = ref_forward(x, g, b, rows, h, eps, rms, zc), 0
  for i = 1, #y do s = s + y[i] * r[i] end
  return s
end

local function fd(vec, f)
  local out, H = {}, 1e-4
  for i = 1, #vec do
    local v = vec[i]
    vec[i] = v + H
    local lp = f()
    vec[i] = v - H
    local lm = f()
    vec[i] = v
    out[i] = (lp - lm) / (2 * H)
  end
  return out
end

local function assert_close(got, want, rel, what)
  local m = 0
  for i = 1, #want do m = math.max(m, math.abs(want[i])) end
  for i = 1, #want do
    local tol = rel * m + rel * math.abs(want[i])
    if not (math.abs(got[i] - want[i]) <= tol) then
      error(string.format("%s[%d]: got %.9g, want %.9g (tol %.3g)", what, i, got[i], want[i], tol), 2)
    end
  end
end

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
        local m = k.new(h, { zero_centered_gamma = zc, eps = eps })
        local p = m:parameters()
        assert.are.equal(k.rms and 1 or 2, #p)
        p[1].value:randn(7, zc and 0 or 1, 0.3)
        if not k.rms then p[2].value:randn(8, 0, 0.5) end
        local x = lutra.tensor({ rows, h }):randn(3, 0.5, 2)
        local y = m:forward(x):to_table()
        local want = ref_forward(x:to_table(), p[1].value:to_table(),
                                 not k.rms and p[2].value:to_table() or nil, rows, h, eps, k.rms, zc)
        for i = 1, #want do
          assert.is_true(math.abs(y[i] - want[i]) <= 1e-5 * (1 + math.abs(want[i])),
                         string.format("y[%d] = %.9g, want %.9g", i, y[i], want[i]))
        end
      end)

      it("backward matches finite differences of the f64 reference" .. tag, function()
        local rows, h, eps = 4, 16, 1e-5
        local m = k.new(h, { zero_centered_gamma = zc, eps = eps })
        local p = m:parameters()
        p[1].value:randn(11, zc and 0 or 1, 0.3)
        if not k.rms then p[2].value:randn(12, 0, 0.5) end
        local x = lutra.tensor({ rows, h }):randn(13, 0.2, 1.5)
        local rt = lutra.tensor({ rows, h }):randn(14)
        m:forward(x)
        local dx = m:backward(rt):to_table()
        local xv, gv, r = x:to_table(), p[1].value:to_table(), rt:to_table()
        local bv = not k.rms and p[2].value:to_table() or nil
        local f = function() return loss(xv, gv, bv, r, rows, h, eps, k.rms, zc) end
        assert_close(dx, fd(xv, f), 1e-3, "dx")
        assert_close(p[1].grad:to_table(), fd(gv, f), 1e-3, "dgamma")
        if bv then assert_close(p[2].grad:to_table(), fd(bv, f), 1e-3, "dbeta") end
      end)
    end

    it("bf16 module: forward and backward near the f64 reference", function()
      local rows, h = 3, 32
      local m = k.new(h, { dtype = "bf16" })
      local x = lutra.tensor({ rows, h }, "bf16"):randn(21)
      local y = m:forward(x):to_table()
      local p = m:parameters()
      local want = ref_forward(x:to_table(), p[1].value:to_table(),
                               not k.rms and p[2].value:to_table() or nil, rows, h, 1e-5, k.rms)
      assert_close(y, want, 2e-2, "y")
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
