-- A checkpoint loaded into a module that cached an FP8 weight (a forward with
-- is_first_microbatch true): the cache holds the weight of before the load, another run's, so
-- the next forward quantizes the loaded weight even with is_first_microbatch false (the tensor's
-- LUTRA_TENSOR_LOADED flag, src/lutra/checkpoint.h); with the device skip flag set, that forward
-- is refused until one runs with the flag 0. Oracle: a module built fresh and loaded from the same
-- file, its forward with true, bit for bit (the same weight and scales quantized the same way).
local lutra = require("lutra")
local nn = lutra.nn
local fresh = require("spec.support.fresh_random")

local rng = fresh.new()
local IN, OUT, ROWS = 32, 48, 16

local function tmp()
  local p = os.tmpname()
  os.remove(p)
  return p .. ".safetensors"
end

local KINDS = {
  { "Linear", function(seed) return nn.Linear(IN, OUT, { seed = seed }) end,
    function(m, x, first) return m:forward(x, first) end },
  { "LayerNormMLP", function(seed) return nn.LayerNormMLP(IN, 2 * IN, { seed = seed }) end,
    function(m, x, first) return m:forward(x, first) end },
  { "GroupedLinear", function(seed) return nn.GroupedLinear(2, IN, OUT, { seed = seed }) end,
    function(m, x, first) return m:forward(x, { ROWS / 2, ROWS / 2 }, first) end },
}

describe("a checkpoint loaded into a module with a cached FP8 weight", function()
  for _, k in ipairs(KINDS) do
    local name, make, fwd = k[1], k[2], k[3]

    it(name .. ": is_first_microbatch false quantizes the loaded weight, then reuses it", function()
      -- current scaling: each cast's scale comes from its own tensor, so outputs compare bit for
      -- bit across forwards (delayed scaling's scales move with the history at every scope exit)
      local recipe = lutra.recipe.current()
      local x = lutra.tensor({ ROWS, IN }):randn(rng.int(1, 2 ^ 30))
      local path = tmp()
      lutra.save(path, { model = make(rng.int(1, 2 ^ 30)) })

      local m = make(rng.int(1, 2 ^ 30)) -- another run's weights, quantized and cached
      local scope = lutra.autocast { recipe = recipe }
      local stale = scope:run(function() return fwd(m, x, true):to_table() end)
      lutra.load(path, { model = m, fp8 = false }) -- current scaling keeps no state to load
      local after = scope:run(function() return fwd(m, x, false):to_table() end)
      -- the loaded weight's cast is cached in turn: a weight written now is not seen by false
      for _, p in ipairs(m:parameters()) do
        if p.value.ndim == 2 then p.value:randn(rng.int(1, 2 ^ 30)) end
      end
      local again = scope:run(function() return fwd(m, x, false):to_table() end)

      local ref_m = make(rng.int(1, 2 ^ 30))
      lutra.load(path, { model = ref_m })
      local ref_scope = lutra.autocast { recipe = recipe }
      local ref = ref_scope:run(function() return fwd(ref_m, x, true):to_table() end)
      os.remove(path)
      assert.are.same(ref, after)
      assert.are.same(after, again)
      assert.are_not.same(stale, after)
    end)
  end

  it("Linear: refuses a forward under the device skip flag until one ran with the flag 0", function()
    local recipe = lutra.recipe.delayed { amax_history_len = 4 }
    local x = lutra.tensor({ ROWS, IN }):randn(rng.int(1, 2 ^ 30))
    local path = tmp()
    local m = nn.Linear(IN, OUT, { seed = rng.int(1, 2 ^ 30) })
    local scope = lutra.autocast { recipe = recipe }
    scope:run(function() m:forward(x, "device") end)
    lutra.save(path, { model = m })
    lutra.load(path, { model = m })
    lutra.set_skip_weight_update("cpu", true)
    local ok, err = pcall(scope.run, scope, function() m:forward(x, "device") end)
    lutra.set_skip_weight_update("cpu", false)
    assert.is_false(ok)
    assert.matches("weight was loaded from a checkpoint since it was quantized", err, 1, true)
    scope:run(function() m:forward(x, "device") end) -- flag 0: quantizes the loaded weight
    lutra.set_skip_weight_update("cpu", true)
    scope:run(function() m:forward(x, "device") end) -- and may skip from then on
    lutra.set_skip_weight_update("cpu", false)
    os.remove(path)
  end)
end)
