-- A training loop calling methods of one module kind every step, for spec/module_methods_spec.lua,
-- run in its own LuaJIT process: luajit -jv=LOG spec/support/jit_kind_methods_loop.lua
-- A GroupedLinear's set_splits and num_gemms, a Linear's quantized and a Sequential's fusions
-- are looked up per kind (lua/lutra/module_methods.lua): that lookup must compile too.
local lutra = require("lutra")
local nn = lutra.nn

local experts = nn.GroupedLinear(4, 32, 32, { seed = 3 })
local first = nn.Linear(32, 32, { seed = 4 })
local net = nn.Sequential(first, nn.GELU(), experts)
local x = lutra.tensor({ 64, 32 }):randn(11)
local target = lutra.tensor({ 64, 32 }):randn(12)
local loss = nn.MSELoss()
local opt = lutra.optim.SGD(net, { lr = 1e-3 })
local scope = lutra.autocast { recipe = lutra.recipe.delayed { amax_history_len = 16 } }
local ring = { { 16, 16, 16, 16 }, { 7, 0, 40, 17 }, { 0, 0, 0, 64 }, { 30, 2, 2, 30 } }
for i = 1, #ring do ring[i] = lutra.from_table(ring[i], { 4 }, "i32") end

local jit_log = os.getenv("LUTRA_JIT_LOOP_LOG") -- the trace log from here on (jit_trace.lua)
if jit_log then require("jit.v").on(jit_log) end
local total, fused = 0, 0
for step = 1, 400 do -- TRAINING LOOP
  experts:set_splits(ring[step % 4 + 1])
  scope:enter()
  local y = net:forward(x)
  scope:exit()
  assert(first:quantized("input") ~= nil)
  loss:forward(y, target)
  net:backward(loss:backward())
  fused = fused + net:fusions() + experts:num_gemms()
  opt:step()
  total = total + loss:value()
end
assert(total == total, "loss is NaN")
print(string.format("total loss %.6f (%d)", total, fused))
