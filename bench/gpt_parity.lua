#!/usr/bin/env luajit
-- Loss parity with PyTorch: the small GPT of bench/gpt_bench.lua on Shakespeare's bytes, N
-- steps from the same initial weights on the same batches. This script trains lutra's and
-- writes what PyTorch needs into --dir: config.json, the initial weights (init.safetensors,
-- lutra's checkpoint names), the batches (batches.i32: N x [x | y], each B x T int32) and
-- lutra's loss per step (lutra_loss.txt); `python3 bench/gpt_torch.py --parity DIR` then trains
-- PyTorch's model of the same architecture on them and compares the two curves.
-- Both: AdamW (constant lr 1e-3, betas 0.9 / 0.95, eps 1e-8, weight decay 0.1 on every
-- parameter), no clipping, bf16 compute (lutra: bf16 parameters with f32 masters; PyTorch: f32
-- parameters under bf16 autocast). With --device cpu both run in f32 on the CPU (PyTorch too):
-- the same model and optimizer without bf16's rounding, so the curves should agree closely.
-- Usage (GPU machine, repository root; the corpus cached, LUTRA_DATA pointing at it):
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" luajit bench/gpt_parity.lua --dir /tmp/parity
--     [--steps 300] [--device cuda|cpu]
package.path = "examples/gpt/?.lua;" .. package.path
local lutra = require("lutra")
local corpus = require("corpus")
local model = require("model")
local ffi = lutra.ffi

local function parse(argv)
  local argparse = require("lutra.cli").argparse("gpt_parity.lua")
  local p = argparse("gpt_parity.lua", "lutra's side of a loss-parity run against PyTorch.")
  p:option("--dir", "where the run's files go"):args(1)
  p:option("--steps", "training steps", "300", tonumber)
  p:option("--device", "cuda or cpu", "cuda"):choices({ "cuda", "cpu" })
  p:option("--dim", "model width", "256", tonumber)
  p:option("--layers", "TransformerLayers", "4", tonumber)
  p:option("--batch", "sequences per step", "32", tonumber)
  p:option("--seq", "tokens per sequence", "256", tonumber)
  return p:parse(argv)
end

local o = parse(arg)
require("lutra.cli").need_device("gpt_parity.lua", o.device)
assert(os.execute("mkdir -p '" .. o.dir .. "'"))
local c = { vocab = 256, dim = o.dim, layers = o.layers, heads = 4, seq = o.seq, batch = o.batch,
            dtype = o.device == "cuda" and "bf16" or "f32", device = o.device, steps = o.steps,
            lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1 }
local f = assert(io.open(o.dir .. "/config.json", "w"))
f:write(string.format('{"V": %d, "d": %d, "L": %d, "h": %d, "T": %d, "B": %d, "steps": %d, '
                      .. '"lr": %g, "betas": [%g, %g], "eps": %g, "weight_decay": %g, '
                      .. '"device": "%s"}\n',
                      c.vocab, c.dim, c.layers, c.heads, c.seq, c.batch, c.steps, c.lr, c.beta1,
                      c.beta2, c.eps, c.weight_decay, c.device))
f:close()

lutra.manual_seed(1234)
local gpt = model.new(c)
lutra.save(o.dir .. "/init.safetensors", { model = gpt.all })
local loss = lutra.nn.CrossEntropyLoss()
local opt = lutra.optim.AdamW(gpt.all, { lr = c.lr, beta1 = c.beta1, beta2 = c.beta2,
                                         eps = c.eps, weight_decay = c.weight_decay,
                                         decay = "all" })
local train = corpus.split(corpus.byte_tokens(corpus.load()), 0.1)
local batches = corpus.batches(train, c.batch, c.seq, 7)
local x = lutra.tensor({ c.batch, c.seq }, "i32", c.device)
local y = lutra.tensor({ c.batch, c.seq }, "i32", c.device)
local data = assert(io.open(o.dir .. "/batches.i32", "wb"))
local losses = {}
local bytes = c.batch * c.seq * 4
for step = 1, c.steps do
  local hx, hy = batches:next(x, y)
  data:write(ffi.string(hx, bytes), ffi.string(hy, bytes))
  loss:forward(gpt:forward(x, true), y)
  gpt:backward(loss:backward())
  opt:step()
  losses[step] = string.format("%.6f", loss:value())
end
data:close()
f = assert(io.open(o.dir .. "/lutra_loss.txt", "w"))
f:write(table.concat(losses, "\n"), "\n")
f:close()
print(string.format("lutra: %d steps, loss %s -> %s; files in %s", c.steps, losses[1],
                    losses[c.steps], o.dir))
