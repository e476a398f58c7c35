-- Checkpoints inside a gradient-accumulation window (issue 40). A forward with
-- is_first_microbatch true caches the module's FP8 weight for the window's later micro-batches
-- (is_first_microbatch false). Under delayed scaling that weight was quantized with a scale the
-- scope's exit has since updated, and the file holds only the updated one: a resumed forward
-- with is_first_microbatch false would quantize again and differ. So a save there is refused,
-- naming the module and what to do, and writes nothing; the window ends at the optimizer step
-- (or at a forward that quantizes again, or a load of the weights). Under the other recipes the
-- weight's quantization depends on the weight alone: a save there is taken and resumes exactly,
-- which the control below checks bit for bit.
local lutra = require("lutra")
local nn = lutra.nn
local st = require("spec.support.st_edit")

local dir = st.tempdir()
local function path(name) return dir .. "/" .. name end
local function exists(p)
  local f = io.open(p, "rb")
  if f then f:close() end
  return f ~= nil
end

-- each module kind with a Linear core or grouped weights, built from the generator's state
local kinds = {
  Linear = function() return nn.Linear(32, 32) end,
  LayerNormLinear = function() return nn.LayerNormLinear(32, 32) end,
  LayerNormMLP = function() return nn.LayerNormMLP(32, 64) end,
  GroupedLinear = function() return nn.GroupedLinear(2, 32, 32) end,
  ["Sequential(Linear, GELU, Linear)"] = function()
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
  end,
}
local SPLITS = { 32, 32 }

local function forward(m, x, first)
  if m:kind() == "grouped_linear" then return m:forward(x, SPLITS, first) end
  return m:forward(x, first)
end

-- one micro-batch: forward under the scope, backward of the sum's gradient (ones)
local function microbatch(m, scope, x, first)
  scope:enter()
  local y = forward(m, x, first)
  scope:exit()
  m:backward(lutra.tensor(y:dims()):fill(1), false)
  return y
end

local function setup(kind, recipe, seed)
  lutra.manual_seed(seed)
  local m = kinds[kind]()
  local opt = lutra.optim.AdamW(m, { lr = 1e-2 })
  local scope = lutra.autocast { recipe = recipe }
  local x = lutra.tensor({ 64, 32 }):randn(seed)
  return m, opt, scope, x
end

describe("a checkpoint inside a gradient-accumulation window", function()
  for kind in pairs(kinds) do
    it("is refused under delayed scaling, and taken once the window ends: " .. kind, function()
      local m, opt, scope, x = setup(kind, lutra.recipe.delayed { amax_history_len = 4 }, 7)
      -- a step outside any window: saves are taken
      microbatch(m, scope, x, nil)
      opt:step()
      lutra.save(path("outside.st"), { model = m, optim = opt })
      -- inside the window opened by the first micro-batch
      microbatch(m, scope, x, true)
      local target = path("inside_" .. kind:gsub("%W", "_") .. ".st")
      local ok, err = pcall(lutra.save, target, { model = m, optim = opt })
      assert.is_false(ok, "a save inside the window was taken")
      assert.matches("lutra_checkpoint_save: ", err, 1, true)
      assert.matches("gradient-accumulation window under delayed scaling", err, 1, true)
      assert.matches("save after the optimizer step", err, 1, true)
      assert.is_false(exists(target), "a refused save wrote its file")
      -- a later micro-batch of the window: still inside
      microbatch(m, scope, x, false)
      assert.is_false(pcall(lutra.save, target, { model = m, optim = opt }))
      -- a save without the FP8 state (a weights export) claims no exact resume: taken
      lutra.save(path("weights.st"), { model = m, fp8 = false })
      -- the optimizer step ends the window
      opt:step()
      lutra.save(target, { model = m, optim = opt })
      assert.is_true(exists(target))
      -- a window opened again, then a forward that quantizes again (nil) ends it
      microbatch(m, scope, x, true)
      assert.is_false(pcall(lutra.save, target, { model = m, optim = opt }))
      microbatch(m, scope, x, nil)
      lutra.save(target, { model = m, optim = opt })
      -- so does a load of the weights (they changed under the cache)
      microbatch(m, scope, x, true)
      assert.is_false(pcall(lutra.save, target, { model = m, optim = opt }))
      lutra.load(path("outside.st"), { model = m, optim = opt })
      lutra.save(target, { model = m, optim = opt })
    end)
  end

  it("is refused for a custom recipe whose weight role is delayed", function()
    local r = lutra.recipe.custom { input = { kind = "current", format = "e4m3" },
                                    weight = { kind = "delayed", format = "e4m3" },
                                    grad_output = { kind = "current", format = "e5m2" },
                                    amax_history_len = 4 }
    local m, _, scope, x = setup("Linear", r, 8)
    microbatch(m, scope, x, true)
    local ok, err = pcall(lutra.save, path("custom.st"), { model = m })
    assert.is_false(ok)
    assert.matches("module '(root)' (linear)", err, 1, true)
  end)

  -- the control: where the weight's quantization depends on the weight alone, a save inside the
  -- window is taken and the rest of the window resumes bit for bit
  for _, name in ipairs { "current", "mxfp8", "block" } do
    it("is taken under " .. name .. " scaling and resumes the window exactly", function()
      local recipe = lutra.recipe[name]()
      for kind in pairs(kinds) do
        local m, opt, scope, x = setup(kind, recipe, 9)
        microbatch(m, scope, x, nil)
        opt:step()
        microbatch(m, scope, x, true)
        local file = path("window_" .. name .. ".st")
        lutra.save(file, { model = m, optim = opt })
        scope:enter()
        local straight = forward(m, x, false):to_table()
        scope:exit()
        -- fresh objects from another seed, the file loaded: the next micro-batch matches
        local m2, opt2, scope2 = setup(kind, recipe, 10)
        lutra.load(file, { model = m2, optim = opt2, recipe = recipe })
        scope2:enter()
        local resumed = forward(m2, x, false):to_table()
        scope2:exit()
        assert.are.same(straight, resumed, kind .. ": the resumed micro-batch differs")
      end
    end)
  end
end)
