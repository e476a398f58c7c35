-- Trains a pre-norm residual MLP stack (the feed-forward half of a transformer) with the FP8 recipe
-- of your choice:
--   x -> [x + LayerNormMLP(x), swiglu, RMSNorm] x blocks -> RMSNorm -> Linear head
--   luajit examples/train_prenorm.lua [--recipe none|delayed|current|mxfp8|block] [--steps 300]
--          [--blocks 4] [--hidden 64] [--ffn 64] [--batch 1024] [--lr 0.003]
--          [--dtype f32|bf16] [--device cpu|cuda] [--every 50]
-- (--help lists them with their defaults)
-- The task: regression onto a fixed random "teacher" of the same shape but twice the depth, with
-- larger weights. Every step draws a fresh batch (the teacher labels it), so the student cannot
-- memorize: its loss settles at what its depth can approximate, well above the floor FP8's
-- rounding sets. The teacher's head is rescaled so that its outputs have mean 0 and variance 1:
-- a loss of 1 is "knows nothing". The loss printed is on a fixed held-out batch (a forward with
-- no backward); the last line prints the final one; "none" is the high-precision run the FP8
-- recipes are compared with (spec/train_prenorm_spec.lua: within a few percent).
local lutra = require("lutra")
local nn = lutra.nn

-- the command line, parsed with lua-argparse (Debian: lua-argparse)
local function parse(argv)
  local argparse = require("lutra.cli").argparse("train_prenorm.lua")
  local p = argparse("train_prenorm.lua",
                     "Trains a pre-norm residual MLP stack with an FP8 recipe.")
  p:option("--recipe", "FP8 recipe (none: high precision)", "delayed")
   :choices({ "none", "delayed", "current", "mxfp8", "block" })
  p:option("--steps", "training steps", "300", tonumber)
  p:option("--blocks", "residual LayerNormMLP blocks", "4", tonumber)
  p:option("--hidden", "hidden width", "64", tonumber)
  p:option("--ffn", "feed-forward width", "64", tonumber)
  p:option("--batch", "rows per step", "1024", tonumber)
  p:option("--lr", "AdamW learning rate", "0.003", tonumber)
  p:option("--dtype", "parameter and activation dtype", "f32"):choices({ "f32", "bf16" })
  p:option("--device", "cpu or cuda (LUTRA_DEVICE sets the default)", lutra.default_device)
   :choices({ "cpu", "cuda" })
  p:option("--every", "print the loss every N steps", "50", tonumber)
  return p:parse(argv)
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

-- the teacher: larger weights, and a head rescaled (w / std, (b - mean) / std) so that its
-- outputs are normalized, from the statistics of one calibration batch
local teacher = stack(2 * opt.blocks, 1000, opt.dtype)
for _, p in ipairs(teacher:parameters()) do
  local d = p.value:dims()
  if #d == 2 then p.value:randn(7 + d[1] * 31 + d[2], 0, 1.5 / math.sqrt(d[2])) end
end
local x = lutra.tensor({ opt.batch, H }, opt.dtype, opt.device)
local calibration = lutra.tensor({ opt.batch, OUT }, "f32", opt.device)
  :copy(teacher:forward(x:randn(42), { grad = false })):to_table()
local sum, sq = 0, 0
for _, v in ipairs(calibration) do sum, sq = sum + v, sq + v * v end
local mean = sum / #calibration
local std = math.sqrt(math.max(sq / #calibration - mean * mean, 1e-12))
local head = teacher[#teacher]
for i, p in ipairs(head:parameters()) do
  local v = lutra.tensor(p.value:dims(), "f32", opt.device):copy(p.value):to_table()
  for j = 1, #v do v[j] = i == 1 and v[j] / std or (v[j] - mean) / std end
  p.value:copy(lutra.from_table(v, p.value:dims(), "f32", opt.device))
end

-- a fixed held-out batch and its targets; training batches are drawn fresh each step
local x_eval = lutra.tensor({ opt.batch, H }, opt.dtype, opt.device):randn(43)
local target_eval = lutra.tensor({ opt.batch, OUT }, opt.dtype, opt.device)
  :copy(teacher:forward(x_eval, { grad = false }))
local target = lutra.tensor({ opt.batch, OUT }, opt.dtype, opt.device)

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
local eval_loss = nn.MSELoss()
local function evaluate()
  if fp8 then fp8:enter() end
  local y = net:forward(x_eval, { grad = false })
  if fp8 then fp8:exit() end
  eval_loss:forward(y, target_eval)
  return eval_loss:value()
end

local first, last = evaluate(), nil
print(string.format("step %5d  held-out loss %.6f", 0, first))
for step = 1, opt.steps do
  target:copy(teacher:forward(x:randn(100000 + step), { grad = false }))
  if fp8 then fp8:enter() end
  local y = net:forward(x)
  if fp8 then fp8:exit() end
  loss:forward(y, target)
  net:backward(loss:backward(), false) -- x is data: its gradient is not needed
  optimizer:step()
  if step % opt.every == 0 or step == opt.steps then
    last = evaluate()
    print(string.format("step %5d  held-out loss %.6f  (training batch %.6f)", step, last,
                        loss:value()))
  end
end
print(string.format("final loss %.6f (first %.6f)", last, first))
if not (last < first) then
  io.stderr:write("training did not reduce the loss\n")
  os.exit(1)
end
