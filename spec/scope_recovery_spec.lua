-- Autocast scopes and failed steps: an error inside scope:run, a scope left entered and
-- collected, lutra.autocast_unwind, and a failed forward that must not feed the scale update.
local lutra = require("lutra")
local nn = lutra.nn
local E = require("spec.support.errors")

local function depth()
  return (lutra.autocast_state())
end

describe("scope recovery", function()
  local recipe = lutra.recipe.delayed { amax_history_len = 4 }

  it("scope:run whose fn enters an inner scope and raises leaves the thread at its depth", function()
    local outer, inner = lutra.autocast { recipe = recipe }, lutra.autocast { recipe = recipe }
    assert.are.equal(0, depth())
    local ok, err = pcall(function()
      outer:run(function()
        inner:enter()
        error("boom", 0)
      end)
    end)
    assert.is_false(ok)
    assert.are.equal("boom", err)
    assert.are.equal(0, depth())
    -- both scopes can be entered again
    outer:run(function() inner:run(function() assert.are.equal(2, depth()) end) end)
    assert.are.equal(0, depth())
  end)

  it("scope:run whose fn returns inside a scope it entered is an error and unwinds", function()
    local outer, inner = lutra.autocast { recipe = recipe }, lutra.autocast { recipe = recipe }
    E.expect_error(function() outer:run(function() inner:enter() end) end, "scope:run",
                   "not the innermost")
    assert.are.equal(0, depth())
  end)

  it("an entered scope that is garbage-collected takes the thread out of it", function()
    do
      local s = lutra.autocast { recipe = recipe }
      s:enter()
      assert.are.equal(1, depth())
      local _, enabled = lutra.autocast_state()
      assert.is_true(enabled)
    end
    collectgarbage()
    collectgarbage()
    local d, enabled = lutra.autocast_state()
    assert.are.equal(0, d)
    assert.is_false(enabled)
  end)

  it("lutra.autocast_unwind exits every scope above a depth", function()
    local a, b, c = lutra.autocast { recipe = recipe }, lutra.autocast { recipe = recipe },
        lutra.autocast { enabled = false }
    a:enter()
    local saved = depth()
    b:enter()
    c:enter()
    assert.are.equal(3, depth())
    lutra.autocast_unwind(saved)
    assert.are.equal(1, depth())
    a:exit()
    assert.are.equal(0, depth())
    E.expect_error(function() b:exit() end, "lutra_autocast_exit", "not entered")
    E.expect_error(function() lutra.autocast_unwind(-1) end, "lutra.autocast_unwind")
  end)

  it("a Sequential whose second layer fails does not change the first layer's scale", function()
    local l1 = nn.Linear(32, 32, { seed = 5 })
    local net = nn.Sequential(l1, nn.Linear(48, 16, { seed = 6 }))
    local scope = lutra.autocast { recipe = recipe }
    local good = nn.Sequential(l1) -- the first layer alone, to give it quantizers and a scale
    local x = lutra.tensor({ 32, 32 }):randn(7, 0, 3)
    scope:run(function() good:forward(x) end)
    local q = l1:quantizer("input")
    local s0, si0 = q:scale()
    local h0 = q:history(4)
    local big = lutra.tensor({ 32, 32 }):randn(8, 0, 100) -- a very different amax
    E.expect_error(function() scope:run(function() net:forward(big) end) end,
                   "lutra_linear_forward", "features")
    local s1, si1 = q:scale()
    assert.are.equal(s0, s1)
    assert.are.equal(si0, si1)
    assert.are.same(h0, q:history(4))
    -- and the layer still trains normally afterwards
    scope:run(function() good:forward(big) end)
    local s2 = q:scale()
    assert.are_not.equal(s0, s2)
  end)

  it("a module listed twice in a Sequential is refused", function()
    local l = nn.Linear(8, 8, { seed = 1 })
    E.expect_error(function() nn.Sequential(l, nn.GELU(), l) end, "lutra_sequential_new",
                   "module 3 is module 1 again")
    local g = nn.GELU()
    E.expect_error(function() nn.Sequential(g, nn.Linear(8, 8), g) end, "lutra_sequential_new",
                   "appear only once")
  end)
end)
