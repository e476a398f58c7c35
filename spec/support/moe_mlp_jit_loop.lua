-- An nn.MoEMLP training loop for spec/moe_jit_spec.lua, run in its own LuaJIT process with -jv:
--   luajit -jv=LOG spec/support/moe_mlp_jit_loop.lua
-- the whole MoE feed-forward as one module (forward, backward, an optimizer step) and a read of
-- its routing, as a loop that watches the experts' load would.
local lutra = require("lutra")
local nn = lutra.nn

local T, D, F, E, K = 32, 16, 16, 4, 2
local m = nn.MoEMLP(D, F, E, K, { seed = 5 })
local x = lutra.tensor({ 2, T / 2, D }):randn(11)
local target = lutra.tensor({ 2, T / 2, D }):randn(12)
local loss = nn.MSELoss()
local opt = lutra.optim.AdamW(m, { lr = 1e-3 })

local jit_log = os.getenv("LUTRA_JIT_LOOP_LOG") -- the trace log from here on (jit_trace.lua)
if jit_log then require("jit.v").on(jit_log) end
local total, routed = 0, 0
for _ = 1, 500 do -- TRAINING LOOP
  loss:forward(m:forward(x), target)
  m:backward(loss:backward())
  opt:step()
  local _, _, splits = m:routing()
  routed = routed + splits:size()
  total = total + loss:value()
end
assert(total == total, "loss is NaN")
print(string.format("total loss %.6f, %d split entries read", total, routed))
