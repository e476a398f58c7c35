-- nn.Embedding on the device against the CPU reference, bit for bit: the forward is a copy, and
-- the backward sums each weight row's contributions in f32 in increasing position order on both
-- (the CUDA kernel: CUB's stable radix sort of (id, position), then one block per distinct id),
-- so there is no tolerance anywhere. Many duplicate ids (a small vocabulary, long batches) make
-- the order matter. Out-of-range ids: the device flags them (rows NaN, skipped by the backward)
-- and Embedding:check() raises it once; the CPU refuses them at the forward. A captured training
-- step replayed equals the same steps run eagerly, bit for bit.
local lutra = require("lutra")
local ffi = require("ffi")
local nn = lutra.nn
local S = require("spec.gpu.support")
local E = require("spec.support.errors")
local DEV, REF = S.DEV, S.REF
local function test(name, fn) S.test(it, name, fn) end

-- n ids in [0, vocab) from seed (a small vocab: every id many times, in scattered positions)
local function ids_pair(shape, vocab, seed)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  local state, ids = seed, {}
  for i = 1, n do
    state = (state * 1103515245 + 12345) % 2147483648
    ids[i] = state % vocab
  end
  return lutra.from_table(ids, shape, "i32", REF), lutra.from_table(ids, shape, "i32", DEV)
end

local function pair(vocab, dim, opts)
  local o = { seed = opts.seed, dtype = opts.dtype, accumulate_main_grad = opts.accumulate }
  local ref = nn.Embedding(vocab, dim, o)
  o.device = DEV
  return ref, nn.Embedding(vocab, dim, o)
end

local function grad_of(m, accumulate)
  local p = m:parameters()[1]
  return accumulate and p.main_grad or p.grad
end

describe("nn.Embedding on " .. DEV .. " against the CPU", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, accumulate in ipairs { false, true } do
      local tag = dt .. (accumulate and ", main_grad" or "")
      test(tag .. ": forward and backward bit for bit, many duplicate ids", function()
        local vocab, dim = 37, 96
        for k, shape in ipairs { { 3000 }, { 6, 500 }, { 2, 3, 257 } } do
          local ref, dev = pair(vocab, dim, { seed = 11 + k, dtype = dt, accumulate = accumulate })
          local ir, id = ids_pair(shape, vocab, 100 + k)
          local yr, yd = ref:forward(ir), dev:forward(id)
          S.assert_same_tensor(yd, yr, tag .. " forward")
          local dy_shape = { table.unpack(shape) }
          dy_shape[#shape + 1] = dim
          local dr, dd = S.randn_pair(dy_shape, dt, 200 + k)
          for _ = 1, 2 do -- twice: the main_grad accumulates
            ref:forward(ir)
            dev:forward(id)
            ref:backward(dr)
            dev:backward(dd)
          end
          S.assert_same_tensor(grad_of(dev, accumulate), grad_of(ref, accumulate), tag .. " grad")
        end
      end)
    end
  end

  test("the backward gives the same bits on every run (a large batch, a larger vocab)", function()
    local vocab, dim, shape = 5000, 64, { 8, 4096 }
    local ref, dev = pair(vocab, dim, { seed = 3 })
    local ir, id = ids_pair(shape, vocab, 7)
    local dr, dd = S.randn_pair({ 8, 4096, dim }, "f32", 8)
    dev:forward(id)
    dev:backward(dd)
    local first = grad_of(dev):bytes()
    for _ = 1, 3 do
      dev:forward(id)
      dev:backward(dd)
      assert.are.equal(first, grad_of(dev):bytes(), "the gradient changed between runs")
    end
    ref:forward(ir)
    ref:backward(dr)
    S.assert_same_tensor(grad_of(dev), grad_of(ref), "f32 large batch grad")
  end)

  test("an out-of-range id: flagged on the device, raised once by check(); refused on the cpu",
       function()
    local m = nn.Embedding(8, 4, { device = DEV })
    local bad = lutra.from_table({ 1, 9, 2, -1 }, { 4 }, "i32", DEV)
    local good = lutra.from_table({ 1, 7, 2, 0 }, { 4 }, "i32", DEV)
    if DEV == "cpu" then
      E.expect_error(function() m:forward(bad) end, "lutra_embedding_forward", "out of range")
      return
    end
    local y = m:forward(bad) -- queued: no synchronization here
    m:backward(lutra.tensor({ 4, 4 }, "f32", DEV):fill(1))
    E.expect_error(function() m:check() end, "lutra_embedding_check", "outside [0, 8)")
    m:check() -- the read that reported it cleared the flag
    local v = y:to_table()
    for d = 1, 4 do
      assert.is_true(v[4 + d] ~= v[4 + d], "the row of id 9 is NaN")
      assert.is_true(v[12 + d] ~= v[12 + d], "the row of id -1 is NaN")
      assert.is_true(v[d] == v[d], "the row of id 1 is a number")
    end
    -- the backward skipped the bad ids: rows 1 and 2 got their one contribution, the rest 0
    local g = grad_of(m):to_table()
    for r = 0, 7 do
      for d = 1, 4 do
        assert.are.equal((r == 1 or r == 2) and 1 or 0, g[r * 4 + d], "grad row " .. r)
      end
    end
    m:forward(good)
    m:check()
  end)

  test("ids on another device than the module are refused, naming the call", function()
    if DEV == "cpu" then return end
    local on_cpu, on_dev = nn.Embedding(8, 4), nn.Embedding(8, 4, { device = DEV })
    local ir, id = ids_pair({ 5 }, 8, 1)
    E.expect_error(function() on_cpu:forward(id) end, "lutra_embedding_forward", "another device")
    E.expect_error(function() on_dev:forward(ir) end, "lutra_embedding_forward", "another device")
    on_dev:forward(id)
    E.expect_error(function() on_dev:backward(lutra.tensor({ 5, 4 })) end,
                   "lutra_embedding_backward", "another device")
  end)

  test("a captured training step replays equal to eager steps, bit for bit", function()
    local vocab, dim, n, steps = 50, 32, 512, 5
    -- the batches as host arrays, set into the trainers' i32 inputs before each step (a copy
    -- between tensors takes float dtypes only)
    local function host_ids(seed)
      local _, t = ids_pair({ n }, vocab, seed)
      local a = ffi.new("int32_t[?]", n)
      for i, v in ipairs(t:to_table()) do a[i - 1] = v end
      return a
    end
    local batches = {}
    for i = 1, steps do batches[i] = { host_ids(300 + i), host_ids(400 + i) } end
    local function trainer()
      local t = {
        net = nn.Sequential(nn.Embedding(vocab, dim, { seed = 1, device = DEV }),
                            nn.Linear(dim, vocab, { seed = 2, device = DEV })),
        x = lutra.tensor({ n }, "i32", DEV),
        target = lutra.tensor({ n }, "i32", DEV),
        loss = nn.CrossEntropyLoss(),
      }
      t.opt = lutra.optim.AdamW(t.net, { lr = 1e-2 })
      t.step = S.training_step(t)
      return t
    end
    local function feed(t, i)
      t.x:set(batches[i][1])
      t.target:set(batches[i][2])
    end
    local eager = trainer()
    S.eager_steps(eager, steps, feed)
    local first = eager.loss:value()
    assert.is_true(first == first, "the eager steps' loss is a number")
    if DEV == "cpu" then return end -- graphs are CUDA's (spec/gpu/graph_gpu.lua checks the refusal)
    local graphed = trainer()
    local g = S.replayed_steps(graphed, steps, feed)
    S.assert_same_params(eager, graphed, "embedding step")
    assert.are.equal(eager.loss:value(), graphed.loss:value(), "last loss")
    g:destroy()
  end)
end)
