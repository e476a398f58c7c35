-- Scaling rules written in Lua (lutra.recipe.delayed{amax_compute_algo = fn,
-- scaling_factor_compute_algo = fn}; lua/lutra/rules.lua, src/fp8/rules.c): the rule equal to
-- a built-in one gives the built-in's scales and histories bit for bit; an EMA rule gives the
-- scales of a Lua reference computed from the amaxes of the tensors themselves, at the update
-- points (scope exit for input and weight, backward for grad_output); a bad rule is an error
-- naming it and its quantizer keeps the old scale.
local lutra = require("lutra")
local ffi = require("ffi")
local C = lutra.C
local nn = lutra.nn

local f32box = ffi.new("float[1]")
local function f32(x) f32box[0] = x return f32box[0] end

local function bits(x)
  f32box[0] = x
  return ffi.cast("uint32_t*", f32box)[0]
end

local ROLES = { "input", "weight", "grad_output" }

-- A two-layer MLP trained with AdamW under one recipe; returns per-step losses and, after each
-- step, the scale and history of every quantizer of both Linears.
local function train(recipe, steps, hist_len)
  local l1 = nn.Linear(32, 64, { seed = 7 })
  local l2 = nn.Linear(64, 16, { seed = 8 })
  local net = nn.Sequential(l1, nn.GELU(), l2)
  local loss = nn.MSELoss()
  local opt = lutra.optim.AdamW(net, { lr = 3e-2 })
  local scope = lutra.autocast { recipe = recipe }
  local trace = {}
  for s = 1, steps do
    local x = lutra.tensor({ 32, 32 }):randn(100 + s, 0, 1 + s)
    local t = lutra.tensor({ 32, 16 }):randn(200 + s)
    scope:enter()
    local y = net:forward(x)
    scope:exit()
    loss:forward(y, t)
    net:backward(loss:backward())
    opt:step()
    local row = { loss = loss:value() }
    for li, l in ipairs { l1, l2 } do
      for _, role in ipairs(ROLES) do
        local q = l:quantizer(role)
        local sc, inv = q:scale()
        row[li .. role] = { bits(sc), bits(inv), q:history(hist_len) }
      end
    end
    trace[s] = row
  end
  return trace
end

local function lua_max(h, n)
  local m = 0
  for i = 0, n - 1 do
    if h[i] > m then m = h[i] end
  end
  return m
end
local function lua_most_recent(h) return h[0] end
local function lua_scale(amax, _, fp8_max, margin) return fp8_max / 2 ^ margin / amax end

describe("Lua scaling rules", function()
  it("equal to the built-in max / most_recent rules give the same scales and histories bit for bit",
     function()
    for _, case in ipairs {
      { algo = "max", rule = lua_max, margin = 0 },
      { algo = "most_recent", rule = lua_most_recent, margin = 1 },
    } do
      local n = 3
      local ref = train(lutra.recipe.delayed { amax_history_len = n, amax_compute_algo = case.algo,
                                               margin = case.margin }, 6, n)
      local got = train(lutra.recipe.delayed { amax_history_len = n, amax_compute_algo = case.rule,
                                               margin = case.margin }, 6, n)
      local both = train(lutra.recipe.delayed { amax_history_len = n, amax_compute_algo = case.rule,
                                                scaling_factor_compute_algo = lua_scale,
                                                margin = case.margin }, 6, n)
      for s = 1, 6 do
        assert.are.same(ref[s], got[s], case.algo .. " step " .. s)
        assert.are.same(ref[s], both[s], case.algo .. " (both rules) step " .. s)
      end
      -- the scales moved (the comparison is not between two untouched quantizers)
      assert.are_not.equal(bits(1), ref[6]["1grad_output"][1])
      assert.are_not.equal(ref[2]["2input"][1], ref[6]["2input"][1])
    end
  end)

  it("an EMA rule gives the scales of a Lua reference, grad_output at the backward", function()
    local n = 4
    -- TE's layout: h[0] this step, h[1..n-1] the earlier ones from the oldest to the newest
    local function ema(h, len)
      local e = 0
      for i = 1, len - 1 do e = 0.75 * e + 0.25 * h[i] end
      return 0.75 * e + 0.25 * h[0]
    end
    local function sf(amax, old, fp8_max, margin)
      return 0.5 * old + 0.5 * (fp8_max / 2 ^ margin / amax)
    end
    local recipe = lutra.recipe.delayed { amax_history_len = n, amax_compute_algo = ema,
                                          scaling_factor_compute_algo = sf }
    local lin = nn.Linear(32, 16, { seed = 3 })
    local loss = nn.MSELoss()
    local opt = lutra.optim.SGD(lin, { lr = 0.5 })
    local scope = lutra.autocast { recipe = recipe }
    local seen = { input = {}, weight = {}, grad_output = {} }
    local scale = { input = 1, weight = 1, grad_output = 1 }
    local fp8_max = { input = 448, weight = 448, grad_output = 57344 }
    -- the reference update of one role from the amaxes the tensors had
    local function expect(role, amax)
      local prev = seen[role]
      local h = ffi.new("float[?]", n)
      h[0] = amax
      for i = 1, n - 1 do h[i] = prev[#prev - (n - 1) + i] or 0 end
      prev[#prev + 1] = amax
      local a = ema(h, n)
      scale[role] = f32(sf(a, scale[role], fp8_max[role], 0))
      return scale[role]
    end
    for s = 1, 5 do
      local x = lutra.tensor({ 32, 32 }):randn(10 + s, 0, 2 * s)
      local t = lutra.tensor({ 32, 16 }):randn(20 + s)
      local w_amax = lin:parameters()[1].value:absmax()
      scope:enter()
      local y = lin:forward(x)
      -- not yet: the forward roles update at the scope's exit
      assert.are.equal(s == 1 and 1 or scale.input, (lin:quantizer("input"):scale()))
      scope:exit()
      assert.are.equal(expect("input", x:absmax()), (lin:quantizer("input"):scale()))
      assert.are.equal(expect("weight", w_amax), (lin:quantizer("weight"):scale()))
      loss:forward(y, t)
      local dy = loss:backward()
      local g_amax = dy:absmax()
      local before = lin:quantizer("grad_output"):scale()
      lin:backward(dy)
      local after = lin:quantizer("grad_output"):scale()
      assert.are.equal(expect("grad_output", g_amax), after)
      assert.are_not.equal(before, after)
      opt:step()
    end
  end)

  it("a rule that returns nan, inf, 0, a negative or a non-number is an error naming it; the old scale stays",
     function()
    local bad_values = { 0 / 0, math.huge, -math.huge, 0, -2, 1e-50, "7", true }
    for _, v in ipairs(bad_values) do
      for _, role in ipairs { "input", "grad_output" } do
        -- fails only for the role's fp8_max (E4M3 448 for input, E5M2 57344 for grad_output)
        local target_max = role == "input" and 448 or 57344
        local function sf(amax, old, fp8_max)
          if fp8_max == target_max then return v end
          return fp8_max / amax
        end
        local recipe = lutra.recipe.delayed { amax_history_len = 2,
                                              scaling_factor_compute_algo = sf }
        local lin = nn.Linear(16, 16, { seed = 1 })
        local scope = lutra.autocast { recipe = recipe }
        local x = lutra.tensor({ 16, 16 }):randn(4)
        scope:enter()
        local y = lin:forward(x)
        local ok, err
        if role == "input" then
          ok, err = pcall(scope.exit, scope)
        else
          scope:exit()
          ok, err = pcall(lin.backward, lin, y)
        end
        assert.is_false(ok, "no error for " .. tostring(v))
        err = tostring(err)
        assert.truthy(err:find("scaling_factor_compute_algo", 1, true), err)
        assert.truthy(err:find("rules_spec.lua", 1, true), err)
        assert.truthy(err:find("old scale is kept", 1, true), err)
        assert.are.equal(1, (lin:quantizer(role):scale()))
        -- the scope is closed, nothing waits, and the rule of the other format still runs
        assert.are.equal(0, (lutra.autocast_state()))
        assert.are.equal(0, C.lutra_rules_pending())
        if role == "input" then
          assert.are.equal(1, (lin:quantizer("weight"):scale())) -- E4M3 too: refused as well
          lin:backward(y)
          assert.are.equal(f32(57344 / y:absmax()), (lin:quantizer("grad_output"):scale()))
        else
          assert.are.equal(f32(448 / x:absmax()), (lin:quantizer("input"):scale()))
        end
      end
    end
    -- an amax rule returning a non-number or NaN
    for _, afn in ipairs { function() return "x" end, function() return 0 / 0 end } do
      local lin = nn.Linear(16, 16, { seed = 1 })
      local scope = lutra.autocast { recipe = lutra.recipe.delayed { amax_compute_algo = afn } }
      scope:enter()
      lin:forward(lutra.tensor({ 16, 16 }):randn(4))
      local ok, err = pcall(scope.exit, scope)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("amax_compute_algo (the function at", 1, true), err)
      assert.are.equal(1, (lin:quantizer("input"):scale()))
    end
  end)

  it("a rule that raises: its error propagates, the scales stay, the histories roll, training goes on",
     function()
    local fail = true
    local function afn(h)
      if fail then error("boom") end
      return h[0]
    end
    local lin = nn.Linear(16, 16, { seed = 1 })
    local scope = lutra.autocast { recipe = lutra.recipe.delayed { amax_history_len = 2,
                                                                  amax_compute_algo = afn } }
    local x = lutra.tensor({ 16, 16 }):randn(4)
    scope:enter()
    lin:forward(x)
    local ok, err = pcall(scope.exit, scope)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("boom", 1, true), err)
    assert.are.equal(1, (lin:quantizer("input"):scale()))
    assert.are.same({ 0, f32(x:absmax()) }, lin:quantizer("input"):history(2))
    assert.are.equal(0, C.lutra_rules_pending())
    assert.are.equal(0, (lutra.autocast_state()))
    fail = false
    local x2 = lutra.tensor({ 16, 16 }):randn(5)
    scope:enter()
    lin:forward(x2)
    scope:exit()
    assert.are.equal(f32(448 / x2:absmax()), (lin:quantizer("input"):scale()))
  end)

  it("refuses a scaling rule that is not a function, and the recipes differ by their rules", function()
    local ok, err = pcall(lutra.recipe.delayed, { scaling_factor_compute_algo = 3 })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("scaling_factor_compute_algo must be a function", 1, true))
    local a = lutra.recipe.delayed { amax_compute_algo = lua_max }
    local b = lutra.recipe.delayed { amax_compute_algo = lua_max }
    assert.are_not.equal(a:key(), b:key())
    assert.are_not.equal(a:key(), lutra.recipe.delayed():key())
    -- custom recipes take the rules for their delayed roles
    local c = lutra.recipe.custom { input = { kind = "delayed", format = "e4m3" },
                                    weight = { kind = "current", format = "e4m3" },
                                    grad_output = { kind = "delayed", format = "e5m2" },
                                    amax_compute_algo = lua_most_recent }
    local lin = nn.Linear(16, 16, { seed = 2 })
    local scope = lutra.autocast { recipe = c }
    local x = lutra.tensor({ 16, 16 }):randn(9)
    scope:enter()
    local y = lin:forward(x)
    scope:exit()
    assert.are.equal(f32(448 / x:absmax()), (lin:quantizer("input"):scale()))
    lin:backward(y)
    assert.are.equal(f32(57344 / y:absmax()), (lin:quantizer("grad_output"):scale()))
  end)

  it("a caller that ignores LUTRA_RULES_PENDING gets an error at the next update", function()
    local lin = nn.Linear(16, 16, { seed = 1 })
    local scope = lutra.autocast { recipe = lutra.recipe.delayed { amax_compute_algo = lua_max } }
    local x = lutra.tensor({ 16, 16 }):randn(4)
    scope:enter()
    lin:forward(x)
    assert.are.equal(C.LUTRA_RULES_PENDING, C.lutra_autocast_exit(scope))
    assert.are.equal(C.LUTRA_RULES_PENDING, C.lutra_rules_status())
    assert.are.equal(2, C.lutra_rules_pending()) -- input and weight
    scope:enter()
    lin:forward(x)
    assert.are.equal(C.LUTRA_ESTATE, C.lutra_autocast_exit(scope))
    assert.truthy(ffi.string(C.lutra_last_error()):find("never run", 1, true))
    -- a later error is not taken for the pending status
    assert.are.equal(0, C.lutra_rules_status())
    assert.are_not.equal(0, C.lutra_rules_apply()) -- not taken yet: refused
    -- the front runs them, then the scope exits normally
    lutra.rules.run()
    assert.are.equal(0, C.lutra_rules_pending())
    scope:exit()
    assert.are.equal(0, (lutra.autocast_state()))
  end)
end)
