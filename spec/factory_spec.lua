-- Quantizers chosen per module by a Lua factory (lutra.recipe.custom{factory = fn};
-- lua/lutra/factory.lua, src/fp8/factory.c): a factory that returns what a built-in recipe uses
-- trains bit for bit as that recipe (the first forward's retry changes nothing); a choice by
-- module name is honoured; the factory is asked once per module and recipe, never per call;
-- bad choices are refused with the module and role named.
local lutra = require("lutra")
local nn = lutra.nn
local C = lutra.C

local function bits_of(t)
  local v = t:to_table()
  return v
end

-- trains a 3-Linear MLP for `steps` AdamW steps under recipe; returns every step's output values
-- and loss; enter(i) / leave(i) may wrap the i-th Linear's forward (default: nothing)
local function train(recipe, steps, opts)
  opts = opts or {}
  local ls = { nn.Linear(32, 64, { seed = 11, name = "first" }),
               nn.Linear(64, 64, { seed = 12, name = "mid" }),
               nn.Linear(64, 16, { seed = 13, name = "head" }) }
  local net = nn.Sequential(ls[1], nn.GELU(), ls[2], nn.GELU(), ls[3])
  local loss = nn.MSELoss()
  local opt = lutra.optim.AdamW(net, { lr = 1e-2 })
  local scope = lutra.autocast { recipe = recipe }
  local out = {}
  for s = 1, steps do
    local x = lutra.tensor({ 32, 32 }):randn(300 + s, 0, s)
    local t = lutra.tensor({ 32, 16 }):randn(400 + s)
    local y
    if opts.manual then y = opts.manual(ls, x) else
      scope:enter()
      y = net:forward(x)
      scope:exit()
    end
    loss:forward(y, t)
    if opts.manual_backward then opts.manual_backward(ls, loss:backward()) else
      net:backward(loss:backward())
    end
    opt:step()
    out[s] = { bits_of(y), loss:value() }
  end
  return out, ls
end

describe("factory recipes", function()
  it("a factory returning the built-in delayed and current choices trains bit for bit as them", function()
    local calls = 0
    local delayed_f = lutra.recipe.custom { amax_history_len = 8, factory = function(role)
      calls = calls + 1
      return { kind = "delayed", format = role == "grad_output" and "e5m2" or "e4m3" }
    end }
    local want = train(lutra.recipe.delayed { amax_history_len = 8 }, 5)
    local got = train(delayed_f, 5)
    for s = 1, 5 do assert.are.same(want[s], got[s], "delayed step " .. s) end
    assert.are.equal(9, calls) -- three modules, three roles, once
    local current_f = lutra.recipe.custom { factory = function(role)
      return { kind = "current", format = role == "grad_output" and "e5m2" or "e4m3" }
    end }
    want = train(lutra.recipe.current(), 4)
    got = train(current_f, 4)
    for s = 1, 4 do assert.are.same(want[s], got[s], "current step " .. s) end
  end)

  it("chooses by module name: the head in high precision, the rest current scaling", function()
    local seen = {}
    local f = lutra.recipe.custom { factory = function(role, kind, name)
      seen[#seen + 1] = role .. ":" .. kind .. ":" .. name
      if name == "head" then return { kind = "none" } end
      return { kind = "current", format = role == "grad_output" and "e5m2" or "e4m3" }
    end }
    local got, ls = train(f, 4)
    assert.is_nil(ls[3]:quantizer("input"))
    assert.is_not_nil(ls[1]:quantizer("input"))
    table.sort(seen)
    assert.are.same({ "grad_output:linear:first", "grad_output:linear:head", "grad_output:linear:mid",
                      "input:linear:first", "input:linear:head", "input:linear:mid",
                      "weight:linear:first", "weight:linear:head", "weight:linear:mid" }, seen)
    -- the same by hand: the first two Linears under current scaling, the head outside FP8
    local cur = lutra.autocast { recipe = lutra.recipe.current() }
    local gelu1, gelu2 = nn.GELU(), nn.GELU()
    local want = train(nil, 4, {
      manual = function(ls2, x)
        cur:enter()
        local h = gelu1:forward(ls2[1]:forward(x))
        h = gelu2:forward(ls2[2]:forward(h))
        cur:exit()
        return ls2[3]:forward(h)
      end,
      manual_backward = function(ls2, dy)
        local d = ls2[3]:backward(dy)
        d = ls2[2]:backward(gelu2:backward(d))
        ls2[1]:backward(gelu1:backward(d))
      end })
    for s = 1, 4 do assert.are.same(want[s], got[s], "step " .. s) end
  end)

  it("asks once per module and recipe, never per call, and again for a new recipe", function()
    local calls = 0
    local function fac(role)
      calls = calls + 1
      return { kind = "current", format = role == "grad_output" and "e5m2" or "e4m3" }
    end
    local r1 = lutra.recipe.custom { factory = fac }
    local lin = nn.Linear(16, 16, { seed = 2 })
    local s1 = lutra.autocast { recipe = r1 }
    local x = lutra.tensor({ 16, 16 }):randn(1)
    for _ = 1, 10 do
      s1:enter()
      local y = lin:forward(x)
      s1:exit()
      lin:backward(y)
    end
    assert.are.equal(3, calls)
    local r2 = lutra.recipe.custom { factory = fac }
    local s2 = lutra.autocast { recipe = r2 }
    for _ = 1, 3 do s2:run(function() lin:forward(x) end) end
    assert.are.equal(6, calls)
    assert.are.equal("custom", r2:kind())
  end)

  it("refuses bad choices and options, naming the module and role", function()
    local function try(fac)
      local lin = nn.Linear(16, 16, { seed = 2, name = "blk3" })
      local scope = lutra.autocast { recipe = lutra.recipe.custom { factory = fac } }
      local ok, err = pcall(function()
        scope:run(function() lin:forward(lutra.tensor({ 16, 16 }):randn(1)) end)
      end)
      assert.is_false(ok)
      assert.are.equal(0, (lutra.autocast_state()))
      return tostring(err)
    end
    local e = try(function() return nil end)
    assert.truthy(e:find("factory (for linear 'blk3') returned nil for input", 1, true), e)
    e = try(function() return { kind = "fancy" } end)
    assert.truthy(e:find("unknown kind 'fancy'", 1, true), e)
    e = try(function() return { kind = "current", colour = 1 } end)
    assert.truthy(e:find("unknown option 'colour'", 1, true), e)
    e = try(function() return { kind = "current", format = "e5m2" } end)
    assert.truthy(e:find("cannot both be e5m2", 1, true), e)
    e = try(function(role) return { kind = role == "weight" and "none" or "current" } end)
    assert.truthy(e:find("both be quantized or both be kept in high precision", 1, true), e)
    e = try(function() error("factory broke") end)
    assert.truthy(e:find("factory broke", 1, true), e)
    -- after a refused choice a good factory's recipe still runs the module
    local ok = pcall(lutra.recipe.custom, { factory = 3 })
    assert.is_false(ok)
    assert.has_error(function() nn.Linear(4, 4, { name = 5 }) end)
    assert.has_error(function() nn.Linear(4, 4, { name = string.rep("n", 64) }) end)
    assert.has_error(function() lutra.recipe.custom { factory = function() end, input = {} } end)
    assert.are.equal(C.LUTRA_OK, C.lutra_factory_status())
  end)
end)
