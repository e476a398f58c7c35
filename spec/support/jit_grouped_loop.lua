-- A GroupedLinear training loop for spec/grouped_jit_spec.lua, run in its own LuaJIT process:
--   luajit -jv=LOG spec/support/jit_grouped_loop.lua RECIPE table|tensor
-- The splits change every step (a ring of pre-made Lua tables, or of i32 tensors): the front's
-- path for them must compile too.
local lutra = require("lutra")
local nn = lutra.nn

local recipe_name, kind = arg[1] or "none", arg[2] or "table"
local recipe = lutra.recipe.named(recipe_name, recipe_name == "delayed" and { amax_history_len = 16 } or nil)
local m = nn.GroupedLinear(4, 32, 32, { seed = 3 })
local x = lutra.tensor({ 64, 32 }):randn(11)
local target = lutra.tensor({ 64, 32 }):randn(12)
local loss = nn.MSELoss()
local opt = lutra.optim.SGD(m, { lr = 1e-3 })
local scope = lutra.autocast { recipe = recipe }
local ring = { { 16, 16, 16, 16 }, { 7, 0, 40, 17 }, { 0, 0, 0, 64 }, { 30, 2, 2, 30 } }
if kind == "tensor" then
  for i = 1, #ring do ring[i] = lutra.from_table(ring[i], { 4 }, "i32") end
end

local jit_log = os.getenv("LUTRA_JIT_LOOP_LOG") -- the trace log from here on (jit_trace.lua)
if jit_log then require("jit.v").on(jit_log) end
local total = 0
for step = 1, 400 do -- TRAINING LOOP
  scope:enter()
  local y = m:forward(x, ring[step % 4 + 1])
  scope:exit()
  loss:forward(y, target)
  m:backward(loss:backward())
  opt:step()
  total = total + loss:value()
end
assert(total == total, "loss is NaN")
print(string.format("total loss %.6f", total))
