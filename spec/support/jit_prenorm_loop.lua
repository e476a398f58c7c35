-- A pre-norm training loop for spec/fused_jit_spec.lua, run in its own LuaJIT process with -jv:
--   luajit -jv=LOG spec/support/jit_prenorm_loop.lua RECIPE
-- Residual(LayerNormMLP swiglu) -> LayerNormLinear -> RMSNorm -> Linear, MSE, AdamW.
local lutra = require("lutra")
local nn = lutra.nn

local recipe_name = arg[1] or "none"
local recipe = lutra.recipe.named(recipe_name, recipe_name == "delayed" and { amax_history_len = 16 } or nil)
local net = nn.Sequential(
  nn.Residual(nn.LayerNormMLP(32, 32, { activation = "swiglu", normalization = "RMSNorm", seed = 3 })),
  nn.LayerNormLinear(32, 32, { seed = 4 }), nn.RMSNorm(32), nn.Linear(32, 32, { seed = 5 }))
local x = lutra.tensor({ 32, 32 }):randn(11)
local target = lutra.tensor({ 32, 32 }):randn(12)
local loss = nn.MSELoss()
local opt = lutra.optim.AdamW(net, { lr = 1e-3 })
local scope = lutra.autocast { recipe = recipe }

local jit_log = os.getenv("LUTRA_JIT_LOOP_LOG") -- the trace log from here on (jit_trace.lua)
if jit_log then require("jit.v").on(jit_log) end
local total = 0
for _ = 1, 300 do -- TRAINING LOOP
  scope:enter()
  local y = net:forward(x)
  scope:exit()
  loss:forward(y, target)
  net:backward(loss:backward())
  opt:step()
  total = total + loss:value()
end
assert(total == total, "loss is NaN")
print(string.format("total loss %.6f", total))
