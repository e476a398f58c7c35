-- A training loop for spec/rope_spec.lua's trace check, run in its own LuaJIT process with -jv on
-- (spec/support/jit_trace.lua): a Linear makes a packed QKV buffer, a RotaryEmbedding rotates its
-- q and k heads in place (apply_qkv) and another rotates a separate tensor through its module
-- forward; the backward runs the inverse rotations; MSE loss, AdamW.
local lutra = require("lutra")
local nn = lutra.nn

local B, T, H, G, D = 2, 6, 4, 2, 8
local width = (H + 2 * G) * D
local proj = nn.Linear(width, width, { seed = 1 })
local rope = nn.RotaryEmbedding(D, { rotary_dim = 6 })
local rope_q = nn.RotaryEmbedding(D)
local x = lutra.tensor({ B, T, width }):randn(2)
local q = lutra.tensor({ B, T, H, D }):randn(3)
local target = lutra.tensor({ B, T, width }):randn(4)
local loss = nn.MSELoss()
local opt = lutra.optim.AdamW(proj, { lr = 1e-3 })

local jit_log = os.getenv("LUTRA_JIT_LOOP_LOG") -- the trace log from here on (jit_trace.lua)
if jit_log then require("jit.v").on(jit_log) end
local total = 0
for i = 1, 500 do -- TRAINING LOOP
  rope:set_offset(i % 8)
  local qkv = rope:apply_qkv(proj:forward(x), H, G)
  loss:forward(qkv, target)
  proj:backward(rope:apply_qkv(loss:backward(), H, G, true))
  rope_q:backward(rope_q:forward(q))
  opt:step()
  total = total + loss:value()
end
assert(total == total, "loss is NaN")
print(string.format("total loss %.6f", total))
