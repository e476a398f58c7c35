-- DotProductAttention's workspace is shared by the modules of a thread, device and stream
-- (src/nn/attention_workspace.c), grown to the largest plan seen and fetched at every call: a
-- module whose forward ran before another module's larger plan grew the workspace (the old
-- buffer dropped) runs its backward in the new one and gets exactly the results of a module that
-- ran alone (fresh random inputs, with dropout and without); several threads' modules (each
-- thread its own workspace) train as they do alone (spec/threads_spec.lua covers the threads).
local lutra = require("lutra")
local nn = lutra.nn
local seed = os.time() % 100000

local H, D = 2, 8

local function randn(shape, s) return lutra.tensor(shape):randn(s, 0, 1) end

-- forward and backward of a module on fresh inputs of T positions; between them, run() (if any)
local function step(m, T, s, between)
  local q, k, v = randn({ 2, T, H, D }, s), randn({ 2, T, H, D }, s + 1), randn({ 2, T, H, D }, s + 2)
  local out = m:forward(q, k, v):to_table()
  if between then between() end
  local dq, dk, dv = m:backward(randn({ 2, T, H, D }, s + 3))
  return { out, dq:to_table(), dk:to_table(), dv:to_table() }
end

describe("DotProductAttention's shared workspace (cpu)", function()
  for _, dropout in ipairs { 0, 0.25 } do
    it("a backward after another module grew the workspace equals a module alone, dropout "
       .. dropout, function()
      local function module() return nn.DotProductAttention(H, D, { dropout = dropout, seed = seed }) end
      local alone = step(module(), 4, seed + 10)
      local small, large = module(), module()
      local shared = step(small, 4, seed + 10, function()
        -- a larger shape: a larger plan, the workspace grown under the small module's backward
        step(large, 64, seed + 20)
      end)
      for i, what in ipairs { "out", "dq", "dk", "dv" } do
        assert.are.same(alone[i], shared[i], what .. " differs from the module alone's")
      end
    end)
  end
end)
