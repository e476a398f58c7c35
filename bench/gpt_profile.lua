-- A few eager GPT training steps for a kernel profiler: the model and optimizer of
-- bench/gpt_bench.lua, one config and recipe, nothing timed here. Under Nsight Compute each
-- kernel's GPU time is listed; bench/ncu_kernels.py sums them per kernel and per step:
--   ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
--     luajit bench/gpt_profile.lua --config gpt2 --recipe delayed --steps 2 > K.csv
--   (the same with --steps 1 > K1.csv)
--   python3 bench/ncu_kernels.py --steps 2 K.csv --base K1.csv --base-steps 1
-- (tools/gpu-check.sh gpt-profile runs both, bf16 and FP8 delayed.) The first step builds the
-- plans (host work only); every step launches the same kernels. The set-up's kernels (weights
-- and gradients initialized, the optimizer's f32 master copies) come before the first step:
-- the one-step run subtracted leaves the second step's alone (without it they are counted in,
-- ~0.7 ms a GPT-2 step).
package.path = "examples/gpt/?.lua;" .. package.path
local lutra = require("lutra")
local model = require("model")

local CONFIGS = {
  small = { vocab = 8192, dim = 256, layers = 4, heads = 4, seq = 256, batch = 32 },
  gpt2 = { vocab = 50304, dim = 768, layers = 12, heads = 12, seq = 1024, batch = 16 },
  tiny = { vocab = 256, dim = 64, layers = 2, heads = 2, seq = 32, batch = 4 },
}

local function parse(argv)
  local argparse = require("lutra.cli").argparse("gpt_profile.lua")
  local p = argparse("gpt_profile.lua", "Eager GPT training steps for a kernel profiler.")
  p:option("--config", "small, gpt2 or tiny", "gpt2"):choices({ "small", "gpt2", "tiny" })
  p:option("--recipe", "none or a lutra.recipe name (delayed, current, ...)", "none")
  p:flag("--fp8-head", "the LM head in FP8 too (GPT:set_fp8's head)")
  p:option("--steps", "training steps", "2", tonumber)
  p:option("--device", "cuda or cpu (a smoke test of the script)", "cuda")
      :choices({ "cuda", "cpu" })
  return p:parse(argv)
end

local o = parse(arg)
require("lutra.cli").need_device("gpt_profile.lua", o.device)
local c = CONFIGS[o.config]
lutra.manual_seed(0)
local gpt = model.new({ vocab = c.vocab, dim = c.dim, layers = c.layers, heads = c.heads,
                        seq = c.seq, dtype = o.device == "cuda" and "bf16" or "f32",
                        device = o.device })
if o.recipe ~= "none" then
  gpt:set_fp8(lutra.autocast { recipe = lutra.recipe.named(o.recipe) }, nil, nil, o.fp8_head)
end
local loss = lutra.nn.CrossEntropyLoss()
-- gpt_bench.lua's optimizer
local opt = lutra.optim.AdamW(gpt.all, { lr = 6e-4, weight_decay = 0.1, beta2 = 0.95,
                                         max_grad_norm = 1.0, schedule = { warmup = 100,
                                         total = 10000, min_lr = 6e-5 } })
local x = lutra.tensor({ c.batch, c.seq }, "i32", o.device)
local y = lutra.tensor({ c.batch, c.seq }, "i32", o.device)
local ids = {}
for i = 1, c.batch * c.seq do ids[i] = (i * 7919) % c.vocab end
x:set(ids)
y:set(ids)
for _ = 1, o.steps do
  loss:forward(gpt:forward(x, true), y)
  gpt:backward(loss:backward())
  opt:step()
end
lutra.synchronize(o.device)
print(string.format("gpt_profile.lua: %d %s steps of %s, loss %.4f", o.steps, o.recipe, o.config,
                    loss:value()))
