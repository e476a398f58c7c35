-- An MoE training loop for spec/moe_jit_spec.lua, run in its own LuaJIT process with -jv on:
--   luajit -jv=LOG spec/support/moe_jit_loop.lua
-- router + permute + one shared Linear over the permuted rows (the experts' stand-in: the loop
-- checks the routing front, not the experts) + unpermute, the backwards and an optimizer step.
local lutra = require("lutra")
local nn, moe = lutra.nn, lutra.moe

local T, D, E, K = 32, 16, 4, 2
local router = moe.Router(D, E, K, { seed = 3 })
local disp = moe.Dispatcher(E)
local expert = nn.Linear(D, D, { seed = 4 })
local x = lutra.tensor({ T, D }):randn(11)
local target = lutra.tensor({ T, D }):randn(12)
local loss = nn.MSELoss()
local opt_r = lutra.optim.AdamW(router.linear, { lr = 1e-3 })
local opt_e = lutra.optim.AdamW(expert, { lr = 1e-3 })

local jit_log = os.getenv("LUTRA_JIT_LOOP_LOG") -- the trace log from here on (jit_trace.lua)
if jit_log then require("jit.v").on(jit_log) end
local total = 0
for _ = 1, 500 do -- TRAINING LOOP
  local probs, idx = router:forward(x)
  local xp = disp:permute(x, idx)
  local y = disp:unpermute(expert:forward(xp), probs)
  loss:forward(y, target)
  local dh, dprobs = disp:unpermute_backward(loss:backward())
  disp:permute_backward(expert:backward(dh))
  router:backward(dprobs, false)
  opt_r:step()
  opt_e:step()
  total = total + loss:value()
end
assert(total == total, "loss is NaN")
print(string.format("total loss %.6f", total))
