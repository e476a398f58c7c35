-- A training loop through a Lua module in a Sequential, for spec/lua_module_spec.lua, run in its
-- own LuaJIT process with -jv on: luajit -jv=LOG spec/support/jit_lua_module_loop.lua
-- The block is the residual MLP of the spec, its outputs in self:buffer; a sampled id per row
-- (generation's op) runs in the loop too.
local lutra = require("lutra")
local nn = lutra.nn

local Block = require("spec.support.residual_block")

local net = nn.Sequential(nn.Linear(16, 32, { seed = 3 }), Block(32, 64),
                          nn.Linear(32, 8, { seed = 4 }))
local x = lutra.tensor({ 16, 16 }):randn(11)
local labels = lutra.tensor({ 16 }, "i32")
local loss = nn.CrossEntropyLoss()
local opt = lutra.optim.AdamW(net, { lr = 1e-3 })
local sample_opts = { temperature = 0.8, top_k = 4, seed = 5, out = lutra.tensor({ 16 }, "i32") }

local jit_log = os.getenv("LUTRA_JIT_LOOP_LOG") -- the trace log from here on (jit_trace.lua)
if jit_log then require("jit.v").on(jit_log) end
local total = 0
for _ = 1, 500 do -- TRAINING LOOP
  local y = net:forward(x)
  loss:forward(y, labels)
  net:backward(loss:backward(), false)
  opt:step()
  y:sample(sample_opts)
  total = total + loss:value()
end
assert(total == total, "loss is NaN")
print(string.format("total loss %.6f", total))
