--- A decoder-only GPT of lutra modules, shared by examples/train_gpt.lua and bench/gpt_bench.lua:
-- token embedding + learned positions (or RoPE inside attention), pre-norm nn.TransformerLayers,
-- a final LayerNorm, the LM head tied to the token embedding, cross-entropy.
--   local gpt = model.new({ vocab = 256, dim = 128, layers = 4, heads = 4, seq = 64,
--                           positions = "learned", dtype = "f32", device = "cpu" })
--   local logits = gpt:forward(ids, true)          -- ids i32 {B, T} -> logits {B, T, vocab}
--   gpt:backward(dlogits)                           -- gradients of every parameter
--   lutra.optim.AdamW(gpt.all, ...)                 -- gpt.all lists each parameter once
-- Embeddings start at N(0, 0.02) (GPT-2's; nn.Embedding's N(0, 1) would give logits of size
-- sqrt(dim) through the tied head), the rest as lutra's modules start. The position embedding
-- is added in place into the token embedding's output (its buffer belongs to the embedding,
-- which needs no output for its backward), so a step allocates nothing and can be captured.
local lutra = require("lutra")
local nn = lutra.nn

local M = {}
local GPT = {}
local WITH_GRAD, WITHOUT_GRAD = { grad = true }, { grad = false } -- no table per call
GPT.__index = GPT

--- Builds the model.
-- @tparam table c {vocab, dim, layers, heads, seq, ffn = 4 dim, positions = "learned" | "rope",
-- moe = {experts =, top_k =} (an MoE feed-forward in every layer), dtype, device}
function M.new(c)
  local where = { dtype = c.dtype, device = c.device }
  local self = setmetatable({ config = c, position_ids = {} }, GPT)
  self.tok = nn.Embedding(c.vocab, c.dim, where)
  if c.positions ~= "rope" then self.pos = nn.Embedding(c.seq, c.dim, where) end
  local blocks = {}
  for i = 1, c.layers do
    blocks[i] = nn.TransformerLayer(c.dim, c.ffn or 4 * c.dim, c.heads, {
      rope = c.positions == "rope", rope_max_seq = c.seq, moe = c.moe, dtype = c.dtype,
      device = c.device })
  end
  self.layers = { unpack(blocks) }
  self.norm = nn.LayerNorm(c.dim, where)
  self.head = nn.Linear(c.dim, c.vocab, { bias = false, weight = self.tok, dtype = c.dtype,
                                          device = c.device })
  blocks[#blocks + 1] = self.norm
  blocks[#blocks + 1] = self.head
  self.body = nn.Sequential(unpack(blocks))
  self.tok:parameters()[1].value:scale_(0.02)
  if self.pos then self.pos:parameters()[1].value:scale_(0.02) end
  -- one Sequential of every module, for optimizers and checkpoints (the tied weight once)
  self.all = self.pos and nn.Sequential(self.tok, self.pos, self.body)
             or nn.Sequential(self.tok, self.body)
  return self
end

-- positions 0 .. t-1 of each of b rows, one tensor per shape
function GPT:positions(b, t)
  local key = b * 65536 + t
  local ids = self.position_ids[key]
  if not ids then
    local list = {}
    for r = 0, b - 1 do
      for i = 0, t - 1 do list[r * t + i + 1] = i end
    end
    ids = lutra.from_table(list, { b, t }, "i32", self.config.device)
    self.position_ids[key] = ids
  end
  return ids
end

--- FP8: the TransformerLayers from first to last (default: all but the first and the last, as
-- TransformerEngine advises for the layers nearest the data and the loss; all of them when
-- there are fewer than 3) run inside scope (a lutra.autocast); nil turns FP8 off. head = true
-- runs the LM head inside it too (default false, as TransformerEngine keeps it: the head is the
-- layer nearest the loss; it is also about a quarter of GPT-2 124M's FLOPs). The head enters the
-- scope again after the layers' exit: its quantizers take their delayed update at that exit, the
-- layers' at theirs, each once a step.
function GPT:set_fp8(scope, first, last, head)
  local n = #self.layers
  self.fp8 = scope
  self.fp8_first = first or (n >= 3 and 2 or 1)
  self.fp8_last = last or (n >= 3 and n - 1 or n)
  self.fp8_head = scope ~= nil and head == true
end

--- Logits {B, T, vocab} of ids {B, T} (i32); grad = false keeps nothing for backward.
function GPT:forward(ids, grad)
  local opts = grad and WITH_GRAD or WITHOUT_GRAD
  local h = self.tok:forward(ids, opts)
  if self.pos then
    local b, t = tonumber(ids.shape[0]), tonumber(ids.shape[1])
    h:add_(self.pos:forward(self:positions(b, t), opts))
  end
  return self:head_forward(self:layers_forward(h, opts), opts)
end

--- The TransformerLayers on h, the FP8 ones (set_fp8) inside the scope.
function GPT:layers_forward(h, opts)
  local scope = self.fp8
  for i = 1, #self.layers do
    if scope and i == self.fp8_first then scope:enter() end
    h = self.layers[i]:forward(h, opts)
    if scope and i == self.fp8_last then scope:exit() end
  end
  return h
end

--- The final norm and the LM head: logits of the last layer's output h (inside the FP8 scope
-- when set_fp8 put the head there).
function GPT:head_forward(h, opts)
  h = self.norm:forward(h, opts)
  if not self.fp8_head then return self.head:forward(h, opts) end
  self.fp8:enter()
  local logits = self.head:forward(h, opts)
  self.fp8:exit()
  return logits
end

--- Backward from the gradient of the logits into every parameter's gradient.
function GPT:backward(dlogits)
  local dh = self.norm:backward(self.head:backward(dlogits))
  for i = #self.layers, 1, -1 do dh = self.layers[i]:backward(dh) end
  self.tok:backward(dh, false)
  if self.pos then self.pos:backward(dh, false) end
end

--- Parameters counted as PaLM's and nanoGPT's MFU count them: every parameter once, less the
-- position embedding (the tied head is the token embedding).
function GPT:flop_params()
  local n = 0
  for _, p in ipairs(self.all:parameters()) do n = n + p.value:size() end
  if self.pos then n = n - self.pos:parameters()[1].value:size() end
  return n
end

--- Training FLOPs per token: 6 N + 12 L T d (forward and backward of the weights, plus the
-- attention's scores and mixing; PaLM appendix B, without halving for the causal mask).
function GPT:flops_per_token()
  local c = self.config
  return 6 * self:flop_params() + 12 * c.layers * c.seq * c.dim
end

return M
