-- A training loop that reads its output into a host buffer every step (tensor:read(buf)), for
-- spec/jit_spec.lua, run in its own LuaJIT process with -jv on:
--   luajit -jv=LOG spec/support/jit_read_loop.lua
local ffi = require("ffi")
local lutra = require("lutra")
local nn = lutra.nn

local net = nn.Sequential(nn.Linear(8, 16, { seed = 3 }), nn.ReLU(), nn.Linear(16, 4, { seed = 4 }))
local x = lutra.tensor({ 8, 8 }):randn(11)
local target = lutra.tensor({ 8, 4 }):randn(12)
local loss = nn.MSELoss()
local opt = lutra.optim.AdamW(net, { lr = 1e-3 })
local out = ffi.new("float[?]", 32)

local jit_log = os.getenv("LUTRA_JIT_LOOP_LOG") -- the trace log from here on (jit_trace.lua)
if jit_log then require("jit.v").on(jit_log) end
local total = 0
for _ = 1, 500 do -- TRAINING LOOP
  local y = net:forward(x)
  y:read(out)
  loss:forward(y, target)
  net:backward(loss:backward())
  opt:step()
  total = total + loss:value() + out[0] * 0
end
assert(total == total, "loss is NaN")
print(string.format("total loss %.6f", total))
