-- A training loop for spec/embedding_spec.lua's trace check, run in its own LuaJIT process with
-- -jv on (spec/support/jit_trace.lua): an Embedding into a Linear, cross-entropy, AdamW. With
-- the argument "tied" (spec/tie_spec.lua): GPT's shape in small, the Embedding, a Linear and a
-- head tied to the embedding's weight.
local lutra = require("lutra")
local nn = lutra.nn

local vocab, dim, n = 32, 16, 64
local emb = nn.Embedding(vocab, dim, { seed = 1 })
local net = arg[1] == "tied"
    and nn.Sequential(emb, nn.Linear(dim, dim, { seed = 2 }),
                      nn.Linear(dim, vocab, { bias = false, weight = emb }))
  or nn.Sequential(emb, nn.Linear(dim, vocab, { seed = 2 }))
local ids, labels = {}, {}
for p = 1, n do
  ids[p] = (p * 7) % vocab
  labels[p] = (p * 3) % vocab
end
local x = lutra.from_table(ids, { n }, "i32")
local target = lutra.from_table(labels, { n }, "i32")
local loss = nn.CrossEntropyLoss()
local opt = lutra.optim.AdamW(net, { lr = 1e-3 })

local jit_log = os.getenv("LUTRA_JIT_LOOP_LOG") -- the trace log from here on (jit_trace.lua)
if jit_log then require("jit.v").on(jit_log) end
local total = 0
for _ = 1, 500 do -- TRAINING LOOP
  loss:forward(net:forward(x), target)
  net:backward(loss:backward())
  opt:step()
  total = total + loss:value()
end
assert(total == total, "loss is NaN")
print(string.format("total loss %.6f", total))
