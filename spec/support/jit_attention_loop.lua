-- A training loop for spec/attention_module_spec.lua's trace check, run in its own LuaJIT
-- process with -jv on (spec/support/jit_trace.lua): a fused QKV Linear, DotProductAttention on
-- its packed output and a Linear in a Sequential, MSE, AdamW; and a q, k, v forward/backward.
local lutra = require("lutra")
local nn = lutra.nn

local d, H, D = 16, 2, 8
local net = nn.Sequential(nn.Linear(d, 3 * d, { seed = 1 }), nn.DotProductAttention(H, D),
                          nn.Linear(d, d, { seed = 2 }))
local attn = nn.DotProductAttention(H, D, { num_gqa_groups = 1, dropout = 0.1 })
local x = lutra.tensor({ 2, 6, d }):randn(3)
local target = lutra.tensor({ 2, 6, d }):randn(4)
local q = lutra.tensor({ 2, 6, H, D }):randn(5)
local kv = lutra.tensor({ 2, 6, 1, D }):randn(6)
local loss = nn.MSELoss()
local opt = lutra.optim.AdamW(net, { lr = 1e-3 })

local jit_log = os.getenv("LUTRA_JIT_LOOP_LOG") -- the trace log from here on (jit_trace.lua)
if jit_log then require("jit.v").on(jit_log) end
local total = 0
for _ = 1, 300 do -- TRAINING LOOP
  loss:forward(net:forward(x), target)
  net:backward(loss:backward())
  opt:step()
  local out = attn:forward(q, kv, kv)
  local dq = attn:backward(out)
  total = total + loss:value() + dq.ndim
end
assert(total == total, "loss is NaN")
print(string.format("total loss %.6f", total))
