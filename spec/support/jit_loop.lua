-- A training loop for spec/jit_spec.lua, run in its own LuaJIT process with -jv on:
--   luajit -jv=LOG spec/support/jit_loop.lua RECIPE [closure | setup_closure]
-- "closure" makes each step create a closure (bytecode FNEW, which LuaJIT 2.1 cannot compile),
-- so the spec can check that it notices an abort; "setup_closure" does the same in a hot loop
-- of the set-up, before the training loop, where an abort must not count.
local lutra = require("lutra")
local nn = lutra.nn

local recipe_name, variant = arg[1] or "none", arg[2]
local recipe
if recipe_name == "lua_rule" then
  -- Lua scaling rules (an EMA of the amax carried by the old scale, with headroom): they run
  -- inside the loop at every scope exit and backward, and compile with it
  recipe = lutra.recipe.delayed {
    amax_history_len = 16,
    amax_compute_algo = function(h) return h[0] end,
    scaling_factor_compute_algo = function(amax, old, fp8_max, margin)
      local headroom = fp8_max / 2 ^ (margin + 1)
      local ema = old == 1 and amax or 0.9 * (headroom / old) + 0.1 * amax
      return headroom / ema
    end,
  }
else
  recipe = lutra.recipe.named(recipe_name, recipe_name == "delayed" and { amax_history_len = 16 } or nil)
end
local net = nn.Sequential(nn.Linear(32, 64, { seed = 3 }), nn.GELU(), nn.Linear(64, 32, { seed = 4 }))
local x = lutra.tensor({ 32, 32 }):randn(11)
local target = lutra.tensor({ 32, 32 }):randn(12)
local loss = nn.MSELoss()
local opt = lutra.optim.AdamW(net, { lr = 1e-3 })
local scope = lutra.autocast { recipe = recipe }

if variant == "setup_closure" then
  local made = 0
  for i = 1, 300 do
    local f = function() return i end
    made = made + f()
  end
  assert(made > 0)
end

local jit_log = os.getenv("LUTRA_JIT_LOOP_LOG") -- the trace log from here on (jit_trace.lua)
if jit_log then require("jit.v").on(jit_log) end
local total = 0
for _ = 1, 500 do -- TRAINING LOOP
  scope:enter()
  local y = net:forward(x)
  scope:exit()
  loss:forward(y, target)
  net:backward(loss:backward())
  if variant == "closure" then
    local step = function() opt:step() end
    step()
  else
    opt:step()
  end
  total = total + loss:value()
end
assert(total == total, "loss is NaN")
print(string.format("total loss %.6f", total))
