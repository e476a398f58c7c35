-- Trains a 4-layer MLP on a generated task with the FP8 recipe of your choice.
--   luajit examples/train_mlp.lua [--recipe none|delayed|current|mxfp8|block]
--          [--task regression|classification] [--steps 300] [--batch 128] [--hidden 256]
--          [--lr 0.003] [--dtype f32|bf16] [--device cpu|cuda] [--every 50] [--graph off|on]
-- (--help lists them with their defaults)
-- The task: targets come from a fixed random "teacher" MLP, so the student can fit them.
local lutra = require("lutra")
local nn = lutra.nn

-- the command line, parsed with lua-argparse (Debian: lua-argparse)
local function parse(argv)
  local argparse = require("lutra.cli").argparse("train_mlp.lua")
  local p = argparse("train_mlp.lua", "Trains a 4-layer MLP on a generated task with an FP8 recipe.")
  p:option("--recipe", "FP8 recipe", "delayed")
   :choices({ "none", "delayed", "current", "mxfp8", "block" })
  p:option("--task", "what the MLP learns", "regression"):choices({ "regression", "classification" })
  p:option("--steps", "training steps", "300", tonumber)
  p:option("--batch", "rows per step", "128", tonumber)
  p:option("--hidden", "hidden width", "256", tonumber)
  p:option("--lr", "AdamW learning rate", "0.003", tonumber)
  p:option("--dtype", "parameter and activation dtype", "f32"):choices({ "f32", "bf16" })
  p:option("--device", "cpu or cuda (LUTRA_DEVICE sets the default)", lutra.default_device)
   :choices({ "cpu", "cuda" })
  p:option("--every", "print the loss every N steps", "50", tonumber)
  p:option("--graph", "on (cuda): capture the step once as a CUDA graph and replay it", "off")
   :choices({ "off", "on" })
  return p:parse(argv)
end

local opt = parse(arg)
local features, classes = 64, 32
local out_features = opt.task == "classification" and classes or 32

local function mlp(seed, dtype)
  local h = opt.hidden
  return nn.Sequential(
    nn.Linear(features, h, { seed = seed, dtype = dtype, device = opt.device }), nn.GELU(),
    nn.Linear(h, h, { seed = seed + 1, dtype = dtype, device = opt.device }), nn.GELU(),
    nn.Linear(h, h, { seed = seed + 2, dtype = dtype, device = opt.device }), nn.GELU(),
    nn.Linear(h, out_features, { seed = seed + 3, dtype = dtype, device = opt.device }))
end

-- data: inputs x, and the teacher's outputs as targets (argmax for classification)
local x = lutra.tensor({ opt.batch, features }, opt.dtype, opt.device):randn(42)
local teacher = mlp(1000, opt.dtype)
local teacher_out = lutra.tensor({ opt.batch, out_features }, opt.dtype, opt.device)
  :copy(teacher:forward(x))
local target, loss
if opt.task == "classification" then
  local values, labels = teacher_out:to_table(), {}
  for r = 0, opt.batch - 1 do
    local best = 1
    for c = 2, classes do
      if values[r * classes + c] > values[r * classes + best] then best = c end
    end
    labels[r + 1] = best - 1
  end
  target = lutra.from_table(labels, { opt.batch }, "i32", opt.device)
  loss = nn.CrossEntropyLoss()
elseif opt.task == "regression" then
  -- normalize the teacher's outputs to zero mean and unit variance: a loss of 1 is "knows nothing"
  local values, sum, sq = teacher_out:to_table(), 0, 0
  for _, v in ipairs(values) do sum, sq = sum + v, sq + v * v end
  local mean = sum / #values
  local std = math.sqrt(math.max(sq / #values - mean * mean, 1e-12))
  for i, v in ipairs(values) do values[i] = (v - mean) / std end
  target = lutra.from_table(values, { opt.batch, out_features }, opt.dtype, opt.device)
  loss = nn.MSELoss()
else
  error("--task must be regression or classification")
end

local net = mlp(1, opt.dtype)
local optimizer = lutra.optim.AdamW(net, { lr = opt.lr, weight_decay = 0 })
local recipe = lutra.recipe.named(opt.recipe, opt.recipe == "delayed" and { amax_history_len = 16 } or nil)
local fp8 = lutra.autocast { recipe = recipe }

print(string.format("lutra %s: %s, recipe %s, %d steps, batch %d, hidden %d, %s on %s",
                    lutra.version(), opt.task, opt.recipe, opt.steps, opt.batch, opt.hidden,
                    opt.dtype, opt.device))
local first, last
local clock = lutra.now
local window_start, window_steps = clock(), 0
local function train_step()
  fp8:enter()
  local y = net:forward(x)
  fp8:exit()
  loss:forward(y, target)
  net:backward(loss:backward(), false) -- x is data: its gradient is not needed
  optimizer:step()
end
-- --graph on (cuda): step 1 runs eagerly, then the whole step is captured once as a CUDA graph
-- and each later step is one replay (lutra.graph)
local graph
for step = 1, opt.steps do
  if graph then
    graph:replay()
  elseif opt.graph == "on" and step > 1 then
    graph = lutra.graph.capture(train_step, { warmup = 0 })
    graph:replay()
  else
    train_step()
  end
  window_steps = window_steps + 1
  if step == 1 or step % opt.every == 0 or step == opt.steps then
    last = loss:value()
    first = first or last
    local now = clock()
    print(string.format("step %5d  loss %.6f  %.1f steps/s", step, last,
                        window_steps / math.max(now - window_start, 1e-9)))
    window_start, window_steps = now, 0
  end
end

local ratio = last / first
print(string.format("final loss %.6f = %.4f x the first (%.6f)", last, ratio, first))
if not (ratio < 0.1) then
  io.stderr:write("training did not converge: the final loss is not below 0.1 x the first\n")
  os.exit(1)
end
