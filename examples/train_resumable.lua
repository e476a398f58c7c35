-- A training run that survives being stopped: shuffled mini-batches read from a data file (made
-- on first use), periodic evaluation on a held-out part, a checkpoint every N steps, and
-- --resume to continue from the last one exactly where it was (the model, its FP8 state, the
-- optimizer, the generator and the data order: the resumed run computes what an unbroken run
-- would have, bit for bit).
--   luajit examples/train_resumable.lua --steps 400 --checkpoint run.safetensors
--   luajit examples/train_resumable.lua --steps 400 --checkpoint run.safetensors --resume
-- --help lists the options. The progress line (steps/s, loss, ETA) is formatted every
-- --progress steps only; the loop in between does no string or table work.
local lutra = require("lutra")
local argparse = require("lutra.cli").argparse("train_resumable.lua")
local ffi = require("ffi")
local nn = lutra.nn

local parser = argparse("train_resumable.lua", "Train an MLP with checkpoints and resume.")
parser:option("--data", "Data file (generated when absent).", "train_resumable.data")
parser:option("--samples", "Samples to generate.", "4096"):convert(tonumber)
parser:option("--steps", "Total training steps.", "400"):convert(tonumber)
parser:option("--batch", "Mini-batch size.", "64"):convert(tonumber)
parser:option("--hidden", "Hidden width.", "128"):convert(tonumber)
parser:option("--lr", "AdamW learning rate.", "3e-3"):convert(tonumber)
parser:option("--recipe", "FP8 recipe.", "delayed")
  :choices({ "none", "delayed", "current", "mxfp8", "block" })
parser:option("--dtype", "Parameter dtype.", "f32"):choices({ "f32", "bf16" })
parser:option("--device", "Device.", lutra.default_device):choices({ "cpu", "cuda" })
parser:option("--seed", "Seed of the weights, data order and data.", "1"):convert(tonumber)
parser:option("--checkpoint", "Checkpoint file.", "train_resumable.safetensors")
parser:option("--checkpoint-every", "Steps between checkpoints.", "100"):convert(tonumber)
parser:option("--eval-every", "Steps between evaluations.", "100"):convert(tonumber)
parser:option("--progress", "Steps between progress lines.", "50"):convert(tonumber)
parser:option("--stop-after", "Exit abruptly after this step, as a crash would (for tests).")
  :convert(tonumber)
parser:flag("--resume", "Continue from --checkpoint when it exists.")
local args = parser:parse()

local FEATURES, OUTPUTS, EVAL_FRACTION = 64, 16, 8 -- 1/8 of the samples held out
local device, dtype = args.device, args.dtype

-- ---- data: a header line, then samples x [FEATURES] f32 and y [OUTPUTS] f32 ---------------
local function generate(path, n)
  lutra.manual_seed(args.seed + 1000)
  local teacher = nn.Sequential(nn.Linear(FEATURES, 64), nn.GELU(), nn.Linear(64, OUTPUTS))
  local x = lutra.tensor({ n, FEATURES })
  x:randn()
  local y = teacher:forward(x)
  local f = assert(io.open(path .. ".tmp", "wb"))
  f:write(string.format("lutra-example-data %d %d %d\n", n, FEATURES, OUTPUTS))
  f:write(x:bytes(), y:bytes())
  f:close()
  assert(os.rename(path .. ".tmp", path))
end

local function load_data(path)
  local f = io.open(path, "rb")
  if not f then
    generate(path, args.samples)
    f = assert(io.open(path, "rb"))
  end
  local n, fx, fy = f:read("*l"):match("^lutra%-example%-data (%d+) (%d+) (%d+)$")
  n, fx, fy = tonumber(n), tonumber(fx), tonumber(fy)
  assert(n and fx == FEATURES and fy == OUTPUTS, path .. " is not a data file of this example")
  local xs, ys = ffi.new("float[?]", n * fx), ffi.new("float[?]", n * fy)
  local bx, by = f:read(n * fx * 4), f:read(n * fy * 4)
  f:close()
  assert(bx and #bx == n * fx * 4 and by and #by == n * fy * 4, path .. " is truncated")
  ffi.copy(xs, bx, #bx)
  ffi.copy(ys, by, #by)
  return n, xs, ys
end

local n_all, xs, ys = load_data(args.data)
local n_eval = math.floor(n_all / EVAL_FRACTION / args.batch) * args.batch
local n_train = n_all - n_eval
local batches_per_epoch = math.floor(n_train / args.batch)
assert(batches_per_epoch >= 1 and n_eval >= args.batch, "too few samples for this batch size")

-- the order of an epoch: a Fisher-Yates shuffle driven by a small LCG seeded from (seed, epoch),
-- so that a resumed run finds the order of its epoch from the step count alone
local order = ffi.new("int32_t[?]", n_train)
local order_epoch = -1
local function shuffle(epoch)
  local s = (args.seed * 1000003 + epoch * 7919) % 2147483647
  for i = 0, n_train - 1 do order[i] = i end
  for i = n_train - 1, 1, -1 do
    s = (s * 48271) % 2147483647
    local j = s % (i + 1)
    order[i], order[j] = order[j], order[i]
  end
  order_epoch = epoch
end

-- ---- model, optimizer, batches ------------------------------------------------------------
lutra.manual_seed(args.seed)
local lopts = { dtype = dtype, device = device }
local net = nn.Sequential(nn.Linear(FEATURES, args.hidden, lopts), nn.GELU(),
                          nn.Linear(args.hidden, args.hidden, lopts), nn.GELU(),
                          nn.Linear(args.hidden, OUTPUTS, lopts))
local opt = lutra.optim.AdamW(net, { lr = args.lr, weight_decay = 0 })
local recipe = lutra.recipe.named(args.recipe)
local scope = recipe and lutra.autocast { recipe = recipe } or nil
local loss = nn.MSELoss()

-- host staging buffers for a batch; on the cpu the batch tensors are views of them (no copy)
local xb, yb = ffi.new("float[?]", args.batch * FEATURES), ffi.new("float[?]", args.batch * OUTPUTS)
local x, y
if device == "cpu" and dtype == "f32" then
  x, y = lutra.wrap(xb, { args.batch, FEATURES }), lutra.wrap(yb, { args.batch, OUTPUTS })
else
  x, y = lutra.tensor({ args.batch, FEATURES }, dtype, device),
         lutra.tensor({ args.batch, OUTPUTS }, dtype, device)
end
local staged = not (device == "cpu" and dtype == "f32")

local function fill_batch(first, count, indices)
  for r = 0, count - 1 do
    local i = indices and indices[first + r] or first + r
    ffi.copy(xb + r * FEATURES, xs + i * FEATURES, FEATURES * 4)
    ffi.copy(yb + r * OUTPUTS, ys + i * OUTPUTS, OUTPUTS * 4)
  end
  if staged then
    x:set(xb)
    y:set(yb)
  end
end

local function evaluate()
  local sum = 0
  for b = 0, n_eval / args.batch - 1 do
    fill_batch(n_train + b * args.batch, args.batch, nil)
    -- in high precision, outside the scope: evaluation must not feed the FP8 scale updates
    sum = sum + loss:forward(net:forward(x, { grad = false }), y):item()
  end
  return sum / (n_eval / args.batch)
end

local step = 0
if args.resume and io.open(args.checkpoint, "rb") then
  lutra.load(args.checkpoint, { model = net, optim = opt, rng = true, recipe = recipe })
  step = opt:steps()
  print(string.format("resumed from %s at step %d", args.checkpoint, step))
end

-- ---- the loop -----------------------------------------------------------------------------
local t0, s0 = lutra.now(), step
while step < args.steps do
  local epoch = math.floor(step / batches_per_epoch)
  if epoch ~= order_epoch then shuffle(epoch) end
  fill_batch((step % batches_per_epoch) * args.batch, args.batch, order)
  if scope then scope:enter() end
  loss:forward(net:forward(x), y)
  net:backward(loss:backward(), false)
  if scope then scope:exit() end
  opt:step()
  step = step + 1
  if step % args.progress == 0 or step == args.steps then
    local rate = (step - s0) / math.max(lutra.now() - t0, 1e-9)
    print(string.format("step %d/%d  loss %.6f (%a)  %.1f steps/s  ETA %.1fs", step, args.steps,
                        loss:value(), loss:value(), rate, (args.steps - step) / rate))
  end
  if step % args.eval_every == 0 or step == args.steps then
    local e = evaluate()
    print(string.format("eval %d  loss %.6f (%a)", step, e, e))
  end
  if step % args.checkpoint_every == 0 or step == args.steps then
    lutra.save(args.checkpoint, { model = net, optim = opt, rng = true })
  end
  if args.stop_after and step == args.stop_after then
    io.stdout:flush()
    os.exit(3) -- as if killed: the steps since the last checkpoint are lost
  end
end
