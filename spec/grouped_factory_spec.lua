-- GroupedLinear under factory recipes (lutra.recipe.custom{factory = fn}): the factory is asked
-- once per module and recipe with the module kind "grouped_linear", and the module runs what it
-- chose. Oracles: the same module (same seed) under the built-in recipe the choice spells out
-- (delayed scaling with hybrid formats, or high precision): forward output, input gradient and
-- weight gradients bit for bit over a few AdamW steps, so the scaling state the choice builds is
-- the built-in one's too. Before this, GroupedLinear ran a factory recipe's base roles (delayed
-- scaling for every role, whatever the factory would have chosen). Fresh random inputs each run.
local lutra = require("lutra")
local fresh = require("spec.support.fresh_random")
local nn, R = lutra.nn, lutra.recipe

local rng = fresh.new()
local E, IN, OUT = 4, 32, 48
local SPLITS = { 5, 0, 11, 16 }

-- `steps` AdamW steps of a GroupedLinear made from seed under recipe (nil: high precision);
-- every step's y, dx and first expert's weight gradient
local function train(seed, recipe, steps, data)
  local g = nn.GroupedLinear(E, IN, OUT, { seed = seed })
  local opt = lutra.optim.AdamW(g, { lr = 1e-2 })
  local scope = recipe and lutra.autocast { recipe = recipe }
  local out = {}
  for s = 1, steps do
    local x = lutra.tensor({ 32, IN }):randn(data + s)
    local y
    if scope then
      y = scope:run(function() return g:forward(x, SPLITS) end)
    else
      y = g:forward(x, SPLITS)
    end
    local dx = g:backward(lutra.tensor({ 32, OUT }):randn(data + 100 + s))
    out[s] = { y = y:to_table(), dx = dx:to_table(), dw = g:parameters()[2].grad:to_table() }
    opt:step()
  end
  return out
end

describe("GroupedLinear under a factory recipe", function()
  it("runs the delayed scaling its factory chose, bit for bit as the built-in recipe", function()
    local seed, data = rng.int(1, 2 ^ 30), rng.int(1, 2 ^ 20)
    local asked = {}
    local f = R.custom { amax_history_len = 4, factory = function(role, kind)
      asked[#asked + 1] = kind .. ":" .. role
      return { kind = "delayed", format = role == "grad_output" and "e5m2" or "e4m3" }
    end }
    local want = train(seed, R.delayed { amax_history_len = 4 }, 4, data)
    local got = train(seed, f, 4, data)
    for s = 1, 4 do assert.are.same(want[s], got[s], "step " .. s .. " (seed " .. rng.seed .. ")") end
    -- asked once per role, for this module kind, never per call
    assert.are.same({ "grouped_linear:input", "grouped_linear:weight", "grouped_linear:grad_output" },
                    asked)
  end)

  it("stays in high precision when its factory says so, and the choice is per module", function()
    local seed, data = rng.int(1, 2 ^ 30), rng.int(1, 2 ^ 20)
    local f = R.custom { factory = function() return { kind = "none" } end }
    local want = train(seed, nil, 2, data)
    local got = train(seed, f, 2, data)
    for s = 1, 2 do assert.are.same(want[s], got[s], "step " .. s) end
    -- the same recipe object, the other choice for a second module: it runs FP8 (differs from
    -- high precision) while the first keeps its own choice
    local n = 0
    local mixed = R.custom { factory = function(role)
      n = n + 1
      if n <= 3 then return { kind = "none" } end
      return { kind = "current", format = role == "grad_output" and "e5m2" or "e4m3" }
    end }
    local a = nn.GroupedLinear(E, IN, OUT, { seed = seed })
    local b = nn.GroupedLinear(E, IN, OUT, { seed = seed })
    local x = lutra.tensor({ 32, IN }):randn(data)
    local scope = lutra.autocast { recipe = mixed }
    local ya = scope:run(function() return a:forward(x, SPLITS):to_table() end)
    local yb = scope:run(function() return b:forward(x, SPLITS):to_table() end)
    local hp = nn.GroupedLinear(E, IN, OUT, { seed = seed }):forward(x, SPLITS):to_table()
    assert.are.same(hp, ya)
    assert.are_not.same(hp, yb)
    assert.are.same(ya, scope:run(function() return a:forward(x, SPLITS):to_table() end))
    assert.are.equal(6, n)
  end)

  it("refuses to load FP8 state for a factory recipe before a forward chose its roles", function()
    local f = R.custom { factory = function(role)
      return { kind = "delayed", format = role == "grad_output" and "e5m2" or "e4m3" }
    end }
    local src = nn.GroupedLinear(E, IN, OUT, { seed = rng.int(1, 2 ^ 30) })
    local scope = lutra.autocast { recipe = f }
    scope:run(function() src:forward(lutra.tensor({ 32, IN }):randn(1), SPLITS) end)
    local path = os.tmpname()
    lutra.save(path, { model = src })
    local dst = nn.GroupedLinear(E, IN, OUT, { seed = rng.int(1, 2 ^ 30) })
    local ok, err = pcall(lutra.load, path, { model = dst, recipe = f })
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("a factory recipe chooses a module's quantizers at its "
                                        .. "first forward", 1, true), tostring(err))
    -- after a forward under it, the load restores the source's scaling state: same outputs
    local x = lutra.tensor({ 32, IN }):randn(rng.int(1, 2 ^ 20))
    scope:run(function() dst:forward(x, SPLITS) end)
    lutra.load(path, { model = dst, recipe = f })
    os.remove(path)
    local a = scope:run(function() return dst:forward(x, SPLITS):to_table() end)
    local b = scope:run(function() return src:forward(x, SPLITS):to_table() end)
    assert.are.same(b, a)
  end)
end)

describe("module names for factory recipes", function()
  it("reach the factory from Linear, LayerNormLinear and GroupedLinear", function()
    local seen = {}
    local f = R.custom { factory = function(role, kind, name)
      if role == "input" then seen[#seen + 1] = kind .. "/" .. name end
      return { kind = name == "experts" and "none" or "current",
               format = role == "grad_output" and "e5m2" or "e4m3" }
    end }
    local lin = nn.Linear(32, 32, { name = "proj" })
    local lnl = nn.LayerNormLinear(32, 32, { name = "qkv" })
    local g = nn.GroupedLinear(E, IN, OUT, { name = "experts", seed = 3 })
    local x = lutra.tensor({ 32, 32 }):randn(rng.int(1, 2 ^ 20))
    local scope = lutra.autocast { recipe = f }
    local y = scope:run(function()
      lin:forward(x)
      lnl:forward(x)
      return g:forward(x, SPLITS):to_table()
    end)
    assert.are.same({ "linear/proj", "layernorm_linear/qkv", "grouped_linear/experts" }, seen)
    -- "experts" was kept in high precision by its name
    assert.are.same(nn.GroupedLinear(E, IN, OUT, { seed = 3 }):forward(x, SPLITS):to_table(), y)
  end)

  it("are refused where a module takes none, and when not a string", function()
    local ok, err = pcall(nn.GroupedLinear, E, IN, OUT, { name = 5 })
    assert.is_false(ok)
    assert.matches("lutra.nn.GroupedLinear: name must be a string", err)
    assert.are_not.equal(0, lutra.C.lutra_module_set_name(nn.GELU(), "act"))
    assert.matches("a gelu takes no name %(the modules a factory recipe chooses for do",
                   lutra.ffi.string(lutra.C.lutra_last_error()))
  end)
end)
