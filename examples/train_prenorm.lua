-- Trains a pre-norm residual MLP stack (the feed-forward half of a transformer) with the FP8 recipe
-- of your choice:
--   x -> [x + LayerNormMLP(x), swiglu, RMSNorm] x blocks -> RMSNorm -> Linear head
--   luajit examples/train_prenorm.lua [--recipe none|delayed|current|mxfp8|block] [--steps 300]
--          [--blocks 4] [--hidden 64] [--ffn 64] [--batch 1024] [--lr 0.003]
--          [--dtype f32|bf16] [--device cpu|cuda] [--every 50]
-- The task: regression onto a fixed random "teacher" of the same shape but twice the depth, with
-- larger weights, and more samples than the student can memorize, so the loss settles well above
-- zero (where FP8's rounding is not what limits it); the targets are normalized, so a loss of 1
-- is "knows nothing". The last line prints the final loss; "none" is the high-precision run the
-- FP8 recipes are compared with (spec/train_prenorm_spec.lua: within a few percent).
local lutra = require("lutra")
local nn = lutra.nn

local function parse(argv)
  local o = { recipe = "delayed", steps = 300, blocks = 4, hidden = 64, ffn = 64, batch = 1024,
              lr = 3e-3, dtype = "f32", device = lutra.default_device, every = 50 }
  local i = 1
  while i <= #argv do
    local key = argv[i]:match("^%-%-(.+)$")
    if not key or o[key] == nil or argv[i + 1] == nil then
      io.stderr:write("usage: train_prenorm.lua [--recipe R] [--steps N] [--blocks N] ",
                      "[--hidden N] [--ffn N] [--batch N] [--lr X] [--dtype f32|bf16] ",
                      "[--device cpu|cuda] [--every N]\n")
      os.exit(2)
    end
    local v = argv[i + 1]
    o[key] = type(o[key]) == "number" and assert(tonumber(v), "--" .. key .. " needs a number") or v
    i = i + 2
  end
  return o
end

local opt = parse(arg)
local H, OUT = opt.hidden, 32

local function stack(blocks, seed, dtype)
  local mods = {}
  for b = 1, blocks do
    mods[#mods + 1] = nn.Residual(nn.LayerNormMLP(H, opt.ffn, {
      normalization = "RMSNorm", activation = "swiglu", dtype = dtype, device = opt.device,
      seed = seed + 2 * b }))
  end
  mods[#mods + 1] = nn.RMSNorm(H, { dtype = dtype, device = opt.device })
  mods[#mods + 1] = nn.Linear(H, OUT, { seed = seed, dtype = dtype, device = opt.device })
  return nn.Sequential(unpack(mods))
end

-- data: inputs x and the deeper teacher's normalized outputs
local x = lutra.tensor({ opt.batch, H }, opt.dtype, opt.device):randn(42)
local teacher = stack(2 * opt.blocks, 1000, opt.dtype)
for _, p in ipairs(teacher:parameters()) do
  local d = p.value:dims()
  if #d == 2 then p.value:randn(7 + d[1] * 31 + d[2], 0, 2 / math.sqrt(d[2])) end
end
local values, sum, sq = lutra.tensor({ opt.batch, OUT }, "f32", opt.device)
  :copy(teacher:forward(x)):to_table(), 0, 0
for _, v in ipairs(values) do sum, sq = sum + v, sq + v * v end
local mean = sum / #values
local std = math.sqrt(math.max(sq / #values - mean * mean, 1e-12))
for i, v in ipairs(values) do values[i] = (v - mean) / std end
local target = lutra.from_table(values, { opt.batch, OUT }, opt.dtype, opt.device)

local net = stack(opt.blocks, 1, opt.dtype)
local loss = nn.MSELoss()
local optimizer = lutra.optim.AdamW(net, { lr = opt.lr, weight_decay = 0 })
local fp8
if opt.recipe ~= "none" then
  local r = lutra.recipe.named(opt.recipe, opt.recipe == "delayed" and { amax_history_len = 16 }
                               or nil)
  fp8 = lutra.autocast { recipe = r }
end

print(string.format("lutra %s: pre-norm stack of %d blocks (hidden %d, ffn %d, swiglu), recipe %s, "
                    .. "%d steps, batch %d, %s on %s", lutra.version(), opt.blocks, H, opt.ffn,
                    opt.recipe, opt.steps, opt.batch, opt.dtype, opt.device))
local first, last
for step = 1, opt.steps do
  if fp8 then fp8:enter() end
  local y = net:forward(x)
  if fp8 then fp8:exit() end
  loss:forward(y, target)
  net:backward(loss:backward(), false) -- x is data: its gradient is not needed
  optimizer:step()
  if step == 1 or step % opt.every == 0 or step == opt.steps then
    last = loss:value()
    first = first or last
    print(string.format("step %5d  loss %.6f", step, last))
  end
end
print(string.format("final loss %.6f (first %.6f)", last, first))
if not (last < first) then
  io.stderr:write("training did not reduce the loss\n")
  os.exit(1)
end
