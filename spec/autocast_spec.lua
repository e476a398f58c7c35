-- Autocast scopes: nesting and restoring the thread's state, misuse errors that change
-- nothing, disabled and calibrating scopes, and when the delayed-scaling updates run
-- (ONE backend call per outermost exit for forward, one when the first Linear of the forward
-- finishes backward).
--
-- States are compared relative to the depth found at the start of each test, so a scope left
-- open by another spec file in the same busted run cannot hide or fake a failure here.
local lutra = require("lutra")
local ffi = require("ffi")
local C = lutra.C
local R = lutra.recipe

local fbox = ffi.new("float[1]")
local function f32(x) fbox[0] = x return fbox[0] end

local function state() return { lutra.autocast_state() } end

local function err_of(fn, ...)
  local ok, msg = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(msg)
end

local function contains(msg, frag)
  assert.is_truthy(msg:find(frag, 1, true), string.format("%q does not contain %q", msg, frag))
end

local function amax_of(t)
  local m = 0
  for i = 1, #t do m = math.max(m, math.abs(t[i])) end
  return m
end

local function copy_table(t)
  local out = {}
  for i = 1, #t do out[i] = t[i] end
  return out
end

-- y = x W^T + b in double precision, from the module's own parameters (an independent
-- reference: Lua loops, not the library's GEMM).
local function linear_ref(m, xv, n, in_f, out_f)
  local p = m:parameters()
  local w = p[1].value:to_table()
  local b = p[2] and p[2].value:to_table()
  local y = {}
  for r = 0, n - 1 do
    for o = 0, out_f - 1 do
      local s = b and b[o + 1] or 0
      for i = 0, in_f - 1 do s = s + xv[r * in_f + i + 1] * w[o * in_f + i + 1] end
      y[r * out_f + o + 1] = s
    end
  end
  return y
end

-- max |a - b| / max(max |b|, tiny)
local function rel_diff(a, b)
  local d, m = 0, 1e-30
  for i = 1, #b do
    d = math.max(d, math.abs(a[i] - b[i]))
    m = math.max(m, math.abs(b[i]))
  end
  return d / m
end

local function same_bits(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

describe("autocast state", function()
  it("starts with FP8 off", function()
    local d0, en, cal = lutra.autocast_state()
    if d0 == 0 then
      assert.is_false(en)
      assert.is_false(cal)
    end
  end)

  it("nesting sets each scope's flags and restores the outer state at each exit", function()
    local base = state()
    local d0 = base[1]
    local outer = lutra.autocast { recipe = R.delayed() }           -- enabled by default
    local mid = lutra.autocast { recipe = R.delayed(), calibrating = true } -- enabled=false
    local inner = lutra.autocast { recipe = R.current(), enabled = true }
    local off = lutra.autocast { enabled = false }                   -- no recipe
    outer:enter()
    assert.are.same({ d0 + 1, true, false }, state())
    mid:enter()
    assert.are.same({ d0 + 2, false, true }, state())
    inner:enter()
    assert.are.same({ d0 + 3, true, false }, state())
    off:enter()
    assert.are.same({ d0 + 4, false, false }, state())
    off:exit()
    assert.are.same({ d0 + 3, true, false }, state())
    inner:exit()
    assert.are.same({ d0 + 2, false, true }, state())
    mid:exit()
    assert.are.same({ d0 + 1, true, false }, state())
    outer:exit()
    assert.are.same(base, state())
  end)

  it("a scope object can be entered again after it exited", function()
    local base = state()
    local s = lutra.autocast { recipe = R.current() }
    for _ = 1, 3 do
      s:enter()
      assert.are.same({ base[1] + 1, true, false }, state())
      s:exit()
      assert.are.same(base, state())
    end
  end)

  it("an enabled or calibrating scope needs a recipe", function()
    contains(err_of(lutra.autocast, { enabled = true }),
             "lutra_autocast_new: a recipe is needed when the scope is enabled or calibrating")
    contains(err_of(lutra.autocast, { calibrating = true }), "lutra_autocast_new: a recipe is needed")
    contains(err_of(lutra.autocast, { recipe = R.current(), enable = true }),
             "lutra.autocast: unknown option 'enable'")
  end)
end)

describe("autocast run", function()
  it("returns fn's results and runs fn inside the scope", function()
    local base = state()
    local s = lutra.autocast { recipe = R.mxfp8() }
    local inside
    local a, b, c = s:run(function(x, y)
      inside = state()
      return x + y, "two", nil
    end, 2, 3)
    assert.are.same({ 5, "two" }, { a, b })
    assert.is_nil(c)
    assert.are.same({ base[1] + 1, true, false }, inside)
    assert.are.same(base, state())
  end)

  it("restores the state on error and re-raises the error message", function()
    local base = state()
    local s = lutra.autocast { recipe = R.delayed(), calibrating = true }
    local ok, msg = pcall(s.run, s, function() error("boom-4711") end)
    assert.is_false(ok)
    contains(tostring(msg), "boom-4711")
    assert.are.same(base, state())
    -- a non-string error value comes back as the same object
    local obj = { code = 17 }
    local ok2, got = pcall(s.run, s, function() error(obj) end)
    assert.is_false(ok2)
    assert.is_true(rawequal(obj, got))
    assert.are.same(base, state())
    -- the scope was exited, so it can be entered again
    s:enter()
    assert.are.same({ base[1] + 1, false, true }, state())
    s:exit()
  end)

  it("an error from a library call inside nested runs restores both scopes", function()
    local base = state()
    local outer = lutra.autocast { recipe = R.delayed() }
    local inner = lutra.autocast { recipe = R.current() }
    local m = lutra.nn.Linear(64, 32, { seed = 5 })
    local ok, msg = pcall(outer.run, outer, function()
      return inner:run(function()
        return m:forward(lutra.tensor({ 8, 64 })) -- 8 rows: not a multiple of 16 under FP8
      end)
    end)
    assert.is_false(ok)
    contains(tostring(msg), "multiples of 16")
    assert.are.same(base, state())
  end)
end)

describe("autocast misuse", function()
  it("entering a scope that is already entered errors and changes nothing", function()
    local base = state()
    local s = lutra.autocast { recipe = R.delayed(), enabled = false, calibrating = true }
    local other = lutra.autocast { recipe = R.current() }
    s:enter()
    local before = state()
    contains(err_of(s.enter, s), "lutra_autocast_enter: scope is already entered")
    assert.are.same(before, state())
    -- also when another scope is innermost
    other:enter()
    local before2 = state()
    contains(err_of(s.enter, s), "lutra_autocast_enter: scope is already entered")
    assert.are.same(before2, state())
    other:exit()
    assert.are.same(before, state())
    s:exit() -- one exit is enough: the failed enter did not nest
    assert.are.same(base, state())
  end)

  it("exiting a scope that is not the innermost errors and changes nothing", function()
    local base = state()
    local u0 = lutra.update_stats()
    local outer = lutra.autocast { recipe = R.delayed() }
    local inner = lutra.autocast { recipe = R.delayed(), enabled = false }
    local m = lutra.nn.Linear(32, 16, { seed = 9 })
    local x = lutra.tensor({ 16, 32 }):randn(31, 0, 1)
    outer:enter()
    m:forward(x) -- leaves an update pending for the outermost exit
    inner:enter()
    local before = state()
    contains(err_of(outer.exit, outer),
             "lutra_autocast_exit: scope is not the innermost one")
    assert.are.same(before, state())
    assert.are.equal(u0, (lutra.update_stats())) -- the failed exit ran no update
    inner:exit()
    assert.are.same({ base[1] + 1, true, false }, state())
    outer:exit()
    assert.are.same(base, state())
    local u1, n1 = lutra.update_stats()
    assert.are.equal(u0 + 1, u1)
    assert.are.equal(2, n1)
  end)

  it("exiting a scope that was not entered errors", function()
    local base = state()
    local s = lutra.autocast { recipe = R.current() }
    contains(err_of(s.exit, s), "lutra_autocast_exit: scope is not entered")
    assert.are.same(base, state())
    s:enter()
    s:exit()
    contains(err_of(s.exit, s), "lutra_autocast_exit: scope is not entered") -- exited twice
    assert.are.same(base, state())
  end)
end)

describe("autocast FP8 on and off", function()
  for _, seed in ipairs { 3, 44, 505 } do
    it("a disabled scope inside an enabled one computes in high precision, seed " .. seed, function()
      local n, in_f, out_f = 32, 64, 48
      local m = lutra.nn.Linear(in_f, out_f, { seed = seed })
      local x = lutra.tensor({ n, in_f }):randn(seed * 7 + 1, 0, 1)
      local xv = x:to_table()
      local ref = linear_ref(m, xv, n, in_f, out_f)
      local y_hp = copy_table(m:forward(x):to_table()) -- no autocast
      -- the HP output is the f32 GEMM: within f32 accumulation error of the double reference
      assert.is_true(rel_diff(y_hp, ref) < 1e-5)

      local u0 = lutra.update_stats()
      local outer = lutra.autocast { recipe = R.delayed() }
      local off_plain = lutra.autocast { enabled = false }
      local off_recipe = lutra.autocast { recipe = R.current(), enabled = false }
      local y_fp8, y_off1, y_off2
      outer:run(function()
        -- prime the delayed scales so the FP8 output is meaningful
        m:forward(x)
      end)
      outer:run(function()
        y_fp8 = copy_table(m:forward(x):to_table())
        off_plain:run(function() y_off1 = copy_table(m:forward(x):to_table()) end)
        off_recipe:run(function() y_off2 = copy_table(m:forward(x):to_table()) end)
      end)
      -- bit for bit the high-precision output
      assert.is_true(same_bits(y_off1, y_hp))
      assert.is_true(same_bits(y_off2, y_hp))
      -- while the enabled scope really ran FP8: not bit-equal, but within e4m3's error
      -- (each operand element has relative error <= 2^-4; 2 operands -> well under 25%)
      assert.is_false(same_bits(y_fp8, y_hp))
      local d = rel_diff(y_fp8, ref)
      assert.is_true(d > 1e-4 and d < 0.25, "FP8 vs reference relative difference " .. d)
      -- two outermost exits, each one update of input and weight quantizers
      local u1, n1 = lutra.update_stats()
      assert.are.equal(u0 + 2, u1)
      assert.are.equal(2, n1)
    end)
  end

  it("a forward only in a disabled inner scope runs no update at the outer exit", function()
    local m = lutra.nn.Linear(32, 32, { seed = 71 })
    local x = lutra.tensor({ 16, 32 }):randn(72, 0, 1)
    local u0, n0 = lutra.update_stats()
    local outer = lutra.autocast { recipe = R.delayed() }
    local off = lutra.autocast { enabled = false }
    outer:run(function() off:run(function() m:forward(x) end) end)
    assert.are.same({ u0, n0 }, { lutra.update_stats() })
    assert.is_nil(m:quantizer("input")) -- FP8 never ran: no quantizers were built
  end)
end)

describe("autocast calibration", function()
  for _, seed in ipairs { 8, 91, 777 } do
    it("computes in high precision and sets delayed scales from the amaxes, seed " .. seed, function()
      local n, in_f, out_f = 16, 48, 32
      local m = lutra.nn.Linear(in_f, out_f, { seed = seed })
      local x = lutra.tensor({ n, in_f }):randn(seed + 1000, 0, 1 + seed % 5)
      local xv = x:to_table()
      local wv = m:parameters()[1].value:to_table()
      local y_hp = copy_table(m:forward(x):to_table())
      local u0 = lutra.update_stats()
      local cal = lutra.autocast { recipe = R.delayed { amax_history_len = 4 }, enabled = false,
                                   calibrating = true }
      local y_cal
      cal:run(function()
        local d, en, calib = lutra.autocast_state()
        assert.is_true(d > 0)
        assert.is_false(en)
        assert.is_true(calib)
        y_cal = copy_table(m:forward(x):to_table())
      end)
      assert.is_true(same_bits(y_cal, y_hp))
      -- one update at exit, covering input and weight
      local u1, n1 = lutra.update_stats()
      assert.are.equal(u0 + 1, u1)
      assert.are.equal(2, n1)
      -- scales = fp8_max / amax (f32 division), history rolled with the amax at the end
      local qi, qw = m:quantizer("input"), m:quantizer("weight")
      local ax, aw = amax_of(xv), amax_of(wv)
      assert.are.equal(f32(448 / ax), (qi:scale()))
      assert.are.equal(f32(448 / aw), (qw:scale()))
      assert.are.same({ 0, 0, 0, ax }, qi:history(4))
      assert.are.same({ 0, 0, 0, aw }, qw:history(4))
      -- grad_output saw nothing: scale still 1
      assert.are.equal(1, (m:quantizer("grad_output"):scale()))
    end)
  end
end)

describe("delayed-scaling update calls", function()
  local function linears(n, dims, seed)
    local ms = {}
    for i = 1, n do ms[i] = lutra.nn.Linear(dims[i], dims[i + 1], { seed = seed + i }) end
    return ms
  end

  it("ONE update call per outermost exit, covering 2 quantizers per Linear; none at inner exits", function()
    local dims = { 64, 48, 32, 16, 32 }
    local ms = linears(4, dims, 100)
    local x = lutra.tensor({ 32, 64 }):randn(4321, 0, 2)
    local outer = lutra.autocast { recipe = R.delayed() }
    local inner = lutra.autocast { recipe = R.delayed { margin = 0 } }
    local inner2 = lutra.autocast { recipe = R.current(), enabled = false, calibrating = false }
    for _, nlin in ipairs { 1, 2, 4, 3 } do
      local u0 = lutra.update_stats()
      local inputs = {}
      outer:enter()
      inner:enter()
      local h = x
      for i = 1, math.min(nlin, 2) do
        inputs[i] = copy_table(h:to_table())
        h = ms[i]:forward(h)
      end
      inner:exit()
      assert.are.equal(u0, (lutra.update_stats()), "an inner exit ran an update")
      inner2:run(function() end)
      assert.are.equal(u0, (lutra.update_stats()), "an inner exit ran an update")
      for i = 3, nlin do
        inputs[i] = copy_table(h:to_table())
        h = ms[i]:forward(h)
      end
      -- a second forward of the same Linear in the scope does not add it twice
      ms[1]:forward(x)
      assert.are.equal(u0, (lutra.update_stats()))
      outer:exit()
      local u1, n1 = lutra.update_stats()
      assert.are.equal(u0 + 1, u1)
      assert.are.equal(2 * nlin, n1)
      -- and that one call did update every Linear's quantizers (fresh ones: max over the
      -- history is this forward's amax)
      if nlin == 1 then
        assert.are.equal(f32(448 / amax_of(inputs[1])), (ms[1]:quantizer("input"):scale()))
        local w = ms[1]:parameters()[1].value:to_table()
        assert.are.equal(f32(448 / amax_of(w)), (ms[1]:quantizer("weight"):scale()))
      end
    end
  end)

  it("the whole scope's updates: new Linears of later steps join the one call", function()
    local ms = linears(3, { 32, 32, 32, 32 }, 200)
    local x = lutra.tensor({ 16, 32 }):randn(99, 0, 1)
    local s = lutra.autocast { recipe = R.delayed() }
    for step = 1, 3 do
      local u0 = lutra.update_stats()
      s:run(function()
        local h = x
        for i = 1, step do h = ms[i]:forward(h) end
      end)
      local u1, n1 = lutra.update_stats()
      assert.are.equal(u0 + 1, u1)
      assert.are.equal(2 * step, n1)
    end
  end)

  it("one backward update when the first Linear of the forward finishes backward (Sequential)", function()
    local l1 = lutra.nn.Linear(64, 48, { seed = 301 })
    local l2 = lutra.nn.Linear(48, 32, { seed = 302 })
    local l3 = lutra.nn.Linear(32, 16, { seed = 303 })
    local net = lutra.nn.Sequential(l1, l2, l3)
    local x = lutra.tensor({ 32, 64 }):randn(3030, 0, 1)
    local dy = lutra.tensor({ 32, 16 }):randn(3031, 0, 0.01)
    local s = lutra.autocast { recipe = R.delayed() }
    for iter = 1, 2 do
      local u0 = lutra.update_stats()
      s:run(function() net:forward(x) end)
      local u1, n1 = lutra.update_stats()
      assert.are.equal(u0 + 1, u1)
      assert.are.equal(6, n1)
      net:backward(dy)
      local u2, n2 = lutra.update_stats()
      assert.are.equal(u1 + 1, u2, "iteration " .. iter)
      assert.are.equal(3, n2)
      -- l3's grad_output is dy itself: its scale is fp8_max(e5m2) / amax(dy) after the update
      if iter == 1 then
        assert.are.equal(f32(57344 / amax_of(dy:to_table())), (l3:quantizer("grad_output"):scale()))
      end
      -- a second backward without a new forward runs no further update (first iteration
      -- only: its grad_output amaxes stay pending until the next trigger, which the second
      -- iteration's backward is, so nothing is left pending for later tests)
      if iter == 1 then
        net:backward(dy)
        assert.are.equal(u2, (lutra.update_stats()))
      end
    end
  end)

  it("the backward update runs after the first Linear's backward, not before (by hand)", function()
    local l1 = lutra.nn.Linear(32, 48, { seed = 401 })
    local l2 = lutra.nn.Linear(48, 32, { seed = 402 })
    local l3 = lutra.nn.Linear(32, 16, { seed = 403 })
    local x = lutra.tensor({ 16, 32 }):randn(4040, 0, 1)
    local dy = lutra.tensor({ 16, 16 }):randn(4041, 0, 0.1)
    local s = lutra.autocast { recipe = R.delayed { amax_history_len = 2 } }
    s:run(function() l3:forward(l2:forward(l1:forward(x))) end)
    local u0 = lutra.update_stats()
    local dx3 = l3:backward(dy)
    local a2 = amax_of(dx3:to_table()) -- l2's grad_output
    assert.are.equal(u0, (lutra.update_stats()))
    local dx2 = l2:backward(dx3)
    local a1 = amax_of(dx2:to_table()) -- l1's grad_output
    assert.are.equal(u0, (lutra.update_stats()))
    -- before the update, the grad_output quantizers recorded their amaxes in history[0]
    assert.are.equal(a2, l2:quantizer("grad_output"):history(1)[1])
    l1:backward(dx2)
    local u1, n1 = lutra.update_stats()
    assert.are.equal(u0 + 1, u1)
    assert.are.equal(3, n1)
    assert.are.equal(f32(57344 / amax_of(dy:to_table())), (l3:quantizer("grad_output"):scale()))
    assert.are.equal(f32(57344 / a2), (l2:quantizer("grad_output"):scale()))
    assert.are.equal(f32(57344 / a1), (l1:quantizer("grad_output"):scale()))
    assert.are.same({ 0, a1 }, l1:quantizer("grad_output"):history(2))
  end)

  it("recipes without delayed scaling run no update calls", function()
    local m = lutra.nn.Linear(32, 32, { seed = 55 })
    local x = lutra.tensor({ 32, 32 }):randn(56, 0, 1)
    local dy = lutra.tensor({ 32, 32 }):randn(57, 0, 1)
    for _, r in ipairs { R.current(), R.mxfp8(), R.block() } do
      local u0, n0 = lutra.update_stats()
      lutra.autocast { recipe = r }:run(function() m:forward(x) end)
      m:backward(dy)
      assert.are.same({ u0, n0 }, { lutra.update_stats() })
    end
  end)
end)
