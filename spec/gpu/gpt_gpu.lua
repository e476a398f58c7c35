-- examples/gpt/model.lua on the device: a whole training step (forward, cross-entropy, backward,
-- AdamW) captured as one CUDA graph and replayed gives the weights of the same number of eager
-- steps bit for bit, and lutra.device_memory counts what the step holds.
package.path = "examples/gpt/?.lua;" .. package.path
local lutra = require("lutra")
local model = require("model")
local S = require("spec.gpu.support")
local DEV = S.DEV
local function test(name, fn) S.test(it, name, fn) end

local SEED = os.time() % 100000

local function setup()
  lutra.manual_seed(SEED)
  local gpt = model.new({ vocab = 96, dim = 64, layers = 2, heads = 2, seq = 32, dtype = "bf16",
                          device = DEV })
  local loss = lutra.nn.CrossEntropyLoss()
  local opt = lutra.optim.AdamW(gpt.all, { lr = 1e-3, weight_decay = 0.1 })
  return gpt, loss, opt
end

local function same_weights(a, b)
  local bp = b.all:parameters()
  for i, p in ipairs(a.all:parameters()) do
    assert.are.equal(p.value:bytes(), bp[i].value:bytes(), "parameter " .. i .. " differs")
  end
end

local function random_ids(seed)
  math.randomseed(seed)
  local t = {}
  for i = 1, 4 * 32 do t[i] = math.random(0, 95) end
  return t
end

describe("the GPT of examples/gpt on " .. DEV, function()
  test("a captured training step replays to the eager steps' weights, bit for bit", function()
    if DEV == "cpu" then return end -- CUDA graphs need cuda
    local eager, eager_loss, eager_opt = setup()
    local graphed, graphed_loss, graphed_opt = setup()
    local x = lutra.tensor({ 4, 32 }, "i32", DEV)
    local y = lutra.tensor({ 4, 32 }, "i32", DEV)
    local function step(gpt, loss, opt)
      loss:forward(gpt:forward(x, true), y)
      gpt:backward(loss:backward())
      opt:step()
    end
    local batch = 0
    local function next_batch()
      batch = batch + 1
      x:set(random_ids(SEED + 2 * batch))
      y:set(random_ids(SEED + 2 * batch + 1))
    end
    -- the capture runs two eager warm-up steps on batches 1 and 2
    local order = {}
    local g = lutra.graph.capture(function()
      if not lutra.graph.capturing() then
        next_batch()
        order[#order + 1] = batch
      end
      step(graphed, graphed_loss, graphed_opt)
    end, { warmup = 2 })
    assert.are.same({ 1, 2 }, order)
    for _ = 3, 5 do
      next_batch()
      g:replay()
    end
    batch = 0
    for _ = 1, 5 do
      next_batch()
      step(eager, eager_loss, eager_opt)
    end
    assert.are.equal(eager_loss:value(), graphed_loss:value())
    same_weights(eager, graphed)
    g:destroy()
  end)

  test("two micro-batches accumulated and stepped, captured, replay to the eager weights", function()
    if DEV == "cpu" then return end -- CUDA graphs need cuda
    local eager, eager_loss, eager_opt = setup()
    local graphed, graphed_loss, graphed_opt = setup()
    local xs, ys = {}, {}
    for m = 1, 2 do
      xs[m] = lutra.tensor({ 4, 32 }, "i32", DEV)
      ys[m] = lutra.tensor({ 4, 32 }, "i32", DEV)
    end
    local function fill(step)
      for m = 1, 2 do
        xs[m]:set(random_ids(SEED + 10 * step + 2 * m))
        ys[m]:set(random_ids(SEED + 10 * step + 2 * m + 1))
      end
    end
    local function step(gpt, loss, opt)
      for m = 1, 2 do
        loss:forward(gpt:forward(xs[m], true), ys[m])
        gpt:backward(loss:backward())
        opt:accumulate()
      end
      opt:step()
    end
    local n = 0
    local g = lutra.graph.capture(function()
      if not lutra.graph.capturing() then
        n = n + 1
        fill(n)
      end
      step(graphed, graphed_loss, graphed_opt)
    end, { warmup = 1 })
    for s = 2, 4 do
      fill(s)
      g:replay()
    end
    for s = 1, 4 do
      fill(s)
      step(eager, eager_loss, eager_opt)
    end
    same_weights(eager, graphed)
    g:destroy()
  end)

  test("lutra.device_memory counts a new tensor and restarts its peak", function()
    if DEV == "cpu" then return end -- the cpu does not count its memory
    lutra.synchronize(DEV)
    local before = lutra.device_memory(DEV, true)
    local t = lutra.tensor({ 16, 1024, 1024 }, "f32", DEV):fill(1)
    lutra.synchronize(DEV)
    local during, peak = lutra.device_memory(DEV)
    assert.is_true(during - before >= 64 * 2 ^ 20, ("in use grew by %d"):format(during - before))
    assert.is_true(peak >= during)
    t:destroy()
    lutra.synchronize(DEV)
    local after, peak_after = lutra.device_memory(DEV, true)
    assert.is_true(after <= during - 64 * 2 ^ 20)
    assert.is_true(peak_after >= during)
    local _, restarted = lutra.device_memory(DEV)
    assert.is_true(restarted < peak_after, "the peak restarts at the current use")
  end)
end)
