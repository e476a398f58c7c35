-- A tensor-parallel pre-norm training loop for spec/tp_jit_spec.lua, run in its own LuaJIT
-- process with -jv (MPI as a singleton: the world is one rank, its collectives MPI's):
--   luajit -jv=LOG spec/support/jit_tp_loop.lua RECIPE SP
-- LayerNormMLP over the TP group -> column-parallel LayerNormLinear -> row-parallel
-- GroupedLinear, MSE, AdamW.
local lutra = require("lutra")
local nn = lutra.nn

local recipe_name = arg[1] or "none"
local sp = arg[2] == "sp"
local recipe = lutra.recipe.named(recipe_name,
                                  recipe_name == "delayed" and { amax_history_len = 16 } or nil)
lutra.dist.init()
local tp = lutra.dist.world()
local experts = nn.GroupedLinear(2, 32, 32, { parallel_mode = "row", tp_group = tp, seed = 6 })
local net = nn.Sequential(
  nn.LayerNormMLP(32, 32, { activation = "swiglu", tp_group = tp, sequence_parallel = sp, seed = 3 }),
  nn.LayerNormLinear(32, 32, { parallel_mode = "column", tp_group = tp, sequence_parallel = sp,
                               seed = 4 }),
  experts)
local x = lutra.tensor({ 32, 32 }):randn(11)
local target = lutra.tensor({ 32, 32 }):randn(12)
local loss = nn.MSELoss()
local opt = lutra.optim.AdamW(net, { lr = 1e-3 })
local scope = lutra.autocast { recipe = recipe, group = tp }
experts:set_splits({ 16, 16 })

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
