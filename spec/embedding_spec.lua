-- nn.Embedding on the CPU backend (the reference; spec/gpu/embedding_gpu.lua compares CUDA to it).
--   forward: exactly the weight rows the ids name (a copy: no tolerance);
--   backward: against an f64 Lua scatter-add, per element |got - ref| <= 2^-20 * sum|dy terms|
--             (f32 sums of at most a few dozen terms: each addition rounds by at most 2^-24 of
--             the partial sum, which is below the sum of absolute terms); and bit for bit against
--             a Lua emulation of the documented order (each row's terms summed in f32 in
--             increasing position order from 0), run twice, with many duplicates in shuffled
--             positions;
--   gradient check: central differences (h = 1e-2; the MSE loss is quadratic in the weight, so
--             the difference has no truncation error) within 1e-3 * max|num| + 1e-5.
local lutra = require("lutra")
local nn = lutra.nn
local ffi = require("ffi")
local FD = require("spec.support.finite_diff")

-- fresh random values each run from a generator of this file's own, seeded from the clock and
-- named in the failures (math.random is one stream for the whole suite: drawing from it here
-- would shift every later spec's "random" inputs)
local SEED = os.time() % 2147483648
local state = SEED
local function random(lo, hi)
  state = (state * 1103515245 + 12345) % 2147483648
  return lo + math.floor(state / 256) % (hi - lo + 1)
end

-- fresh ids in [0, vocab) for a shape
local function random_ids(shape, vocab)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  local ids = {}
  for i = 1, n do ids[i] = random(0, vocab - 1) end
  return ids, n
end

local function f64_scatter(ids, dy, vocab, dim)
  local ref, mag = {}, {}
  for i = 1, vocab * dim do ref[i], mag[i] = 0, 0 end
  for p, id in ipairs(ids) do
    for d = 1, dim do
      local v = dy[(p - 1) * dim + d]
      ref[id * dim + d] = ref[id * dim + d] + v
      mag[id * dim + d] = mag[id * dim + d] + math.abs(v)
    end
  end
  return ref, mag
end

-- each row's terms summed in f32, in increasing position order, from 0 (the documented order)
local function f32_ordered(ids, dy, vocab, dim)
  local acc = ffi.new("float[?]", vocab * dim)
  for p, id in ipairs(ids) do
    for d = 1, dim do
      local at = id * dim + d - 1
      acc[at] = acc[at] + dy[(p - 1) * dim + d]
    end
  end
  local out = {}
  for i = 1, vocab * dim do out[i] = acc[i - 1] end
  return out
end

local function step(m, ids, dy)
  m:forward(ids)
  return m:backward(dy)
end

describe("nn.Embedding", function()
  it("forward gathers the weight rows the ids name, for 1, 2 and 3-dim ids", function()
    local vocab, dim = 11, 6
    local m = nn.Embedding(vocab, dim, { seed = random(1, 2 ^ 30) })
    local w = m:parameters()[1].value:to_table()
    for _, shape in ipairs { { 9 }, { 3, 5 }, { 2, 3, 4 } } do
      local ids = random_ids(shape, vocab)
      local y = m:forward(lutra.from_table(ids, shape, "i32"))
      local dims = y:dims()
      assert.are.same(shape, { table.unpack(dims, 1, #shape) })
      assert.are.equal(dim, dims[#shape + 1])
      local got = y:to_table()
      for p, id in ipairs(ids) do
        for d = 1, dim do
          assert.are.equal(w[id * dim + d], got[(p - 1) * dim + d])
        end
      end
    end
  end)

  it("starts N(0, 1), from the seed or the global generator", function()
    local a = nn.Embedding(64, 32, { seed = 5 }):parameters()[1].value:to_table()
    local b = nn.Embedding(64, 32, { seed = 5 }):parameters()[1].value:to_table()
    assert.are.same(a, b)
    local c = nn.Embedding(64, 32):parameters()[1].value:to_table()
    local d = nn.Embedding(64, 32):parameters()[1].value:to_table()
    assert.are_not.same(c, d)
    local s, s2 = 0, 0
    for _, v in ipairs(c) do s, s2 = s + v, s2 + v * v end
    local mean, var = s / #c, s2 / #c - (s / #c) ^ 2
    -- 2048 samples: the mean's standard error is 0.022, the variance's about 0.031
    assert.is_true(math.abs(mean) < 0.1, "mean " .. mean)
    assert.is_true(math.abs(var - 1) < 0.15, "variance " .. var)
  end)

  it("backward matches an f64 scatter-add and returns no input gradient", function()
    local vocab, dim, shape = 7, 5, { 4, 6 }
    local m = nn.Embedding(vocab, dim)
    local ids = random_ids(shape, vocab)
    local dy = lutra.tensor({ 4, 6, dim }):randn(random(1, 2 ^ 30))
    m:forward(lutra.from_table(ids, shape, "i32"))
    assert.is_nil(m:backward(dy))
    local got = m:parameters()[1].grad:to_table()
    local ref, mag = f64_scatter(ids, dy:to_table(), vocab, dim)
    for i = 1, #ref do
      assert.is_true(math.abs(got[i] - ref[i]) <= 2 ^ -20 * mag[i],
                     string.format("grad[%d] = %.9g, want %.9g (seed %d)", i, got[i], ref[i], SEED))
    end
  end)

  it("backward is bit for bit the position-ordered f32 sum, on every run, duplicates shuffled",
     function()
    local vocab, dim, n = 5, 8, 96
    -- every id many times, in shuffled positions
    local ids = {}
    for p = 1, n do ids[p] = (p - 1) % vocab end
    for p = n, 2, -1 do
      local q = random(1, p)
      ids[p], ids[q] = ids[q], ids[p]
    end
    local m = nn.Embedding(vocab, dim)
    local idt = lutra.from_table(ids, { n }, "i32")
    local dy = lutra.tensor({ n, dim }):randn(random(1, 2 ^ 30))
    step(m, idt, dy)
    local first = m:parameters()[1].grad:bytes()
    step(m, idt, dy)
    assert.are.equal(first, m:parameters()[1].grad:bytes(), "seed " .. SEED)
    assert.are.same(f32_ordered(ids, dy:to_table(), vocab, dim), m:parameters()[1].grad:to_table(),
                    "seed " .. SEED)
  end)

  it("gradient check: finite differences through an MSE loss", function()
    local vocab, dim, shape = 6, 3, { 2, 4 }
    local m = nn.Embedding(vocab, dim, { seed = random(1, 2 ^ 30) })
    local ids = lutra.from_table((random_ids(shape, vocab)), shape, "i32")
    local target = lutra.tensor({ 2, 4, dim }):randn(random(1, 2 ^ 30))
    local loss = nn.MSELoss()
    loss:forward(m:forward(ids), target)
    m:backward(loss:backward())
    local w = m:parameters()[1].value
    local got = m:parameters()[1].grad:to_table()
    local vec = w:to_table()
    local num = FD.central(vec, function()
      loss:forward(m:forward(ids), target)
      return loss:value()
    end, 1e-2, function(v) w:set(v) end)
    local max = 0
    for _, v in ipairs(num) do max = math.max(max, math.abs(v)) end
    assert.is_true(max > 0)
    for i = 1, #num do
      assert.is_true(math.abs(got[i] - num[i]) <= 1e-3 * max + 1e-5,
                     string.format("grad[%d] = %.9g, finite differences %.9g (seed %d)", i, got[i],
                                   num[i], SEED))
    end
  end)

  it("backward overwrites the gradient as Linear's does; main_grad accumulates", function()
    local vocab, dim = 9, 4
    local ids1 = lutra.from_table((random_ids({ 12 }, vocab)), { 12 }, "i32")
    local ids2 = lutra.from_table((random_ids({ 12 }, vocab)), { 12 }, "i32")
    local dy1 = lutra.tensor({ 12, dim }):randn(random(1, 2 ^ 30))
    local dy2 = lutra.tensor({ 12, dim }):randn(random(1, 2 ^ 30))
    local m = nn.Embedding(vocab, dim, { seed = 3 })
    step(m, ids2, dy2)
    local only2 = m:parameters()[1].grad:to_table()
    step(m, ids1, dy1)
    step(m, ids2, dy2)
    assert.are.same(only2, m:parameters()[1].grad:to_table()) -- the last backward's alone
    m:zero_grad()
    for _, v in ipairs(m:parameters()[1].grad:to_table()) do assert.are.equal(0, v) end

    local a = nn.Embedding(vocab, dim, { seed = 3, accumulate_main_grad = true })
    step(a, ids1, dy1)
    local g1 = a:parameters()[1].main_grad:to_table()
    step(a, ids1, dy1)
    local twice = a:parameters()[1].main_grad:to_table()
    for i = 1, #g1 do assert.are.equal(g1[i] * 2, twice[i]) end -- g + g is exact
    local ok, err = pcall(a.backward, a, dy1)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("main_grad twice", 1, true), err)
    a:zero_grad()
    for _, v in ipairs(a:parameters()[1].main_grad:to_table()) do assert.are.equal(0, v) end
  end)

  it("refuses out-of-range ids naming the position and value, changing nothing", function()
    local vocab, dim = 8, 3
    local m = nn.Embedding(vocab, dim)
    local good = lutra.from_table({ 1, 2, 3, 4, 5 }, { 5 }, "i32")
    local dy = lutra.tensor({ 5, dim }):randn(random(1, 2 ^ 30))
    local y = m:forward(good)
    m:backward(dy)
    local y_before, g_before = y:to_table(), m:parameters()[1].grad:to_table()
    for _, case in ipairs { { bad = -1, at = 2 }, { bad = vocab, at = 4 } } do
      local ids = { 1, 2, 3, 4, 5 }
      ids[case.at + 1] = case.bad
      local ok, err = pcall(m.forward, m, lutra.from_table(ids, { 5 }, "i32"))
      assert.is_false(ok)
      err = tostring(err)
      assert.truthy(err:find("lutra_embedding_forward", 1, true), err)
      assert.truthy(err:find(string.format("id %d at position %d is out of range [0, %d)",
                                           case.bad, case.at, vocab), 1, true), err)
      assert.are.same(y_before, y:to_table())
      -- the last good forward is still the one a backward uses
      m:backward(dy)
      assert.are.same(g_before, m:parameters()[1].grad:to_table())
    end
  end)

  it("refuses bad ids, dtypes, devices and sizes, naming the call", function()
    local m = nn.Embedding(8, 3)
    local cases = {
      { lutra.tensor({ 4 }), "ids must be i32" },
      { lutra.tensor({ 1, 1, 2, 2 }, "i32"), "1 to 3 dims" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(m.forward, m, c[1])
      assert.is_false(ok)
      assert.truthy(tostring(err):find(c[2], 1, true), err)
      assert.truthy(tostring(err):find("lutra_embedding_forward", 1, true), err)
    end
    local ok, err = pcall(m.backward, nn.Embedding(8, 3), lutra.tensor({ 4, 3 }))
    assert.is_false(ok)
    assert.truthy(tostring(err):find("before forward", 1, true), err)
    m:forward(lutra.from_table({ 1, 2 }, { 2 }, "i32"))
    ok, err = pcall(m.backward, m, lutra.tensor({ 3, 3 }))
    assert.is_false(ok)
    assert.truthy(tostring(err):find("shape does not match", 1, true), err)
    for _, bad in ipairs {
      { function() return nn.Embedding(0, 3) end, "num_embeddings" },
      { function() return nn.Embedding(4, 0) end, "dim" },
      { function() return nn.Embedding(4, 3, { dtype = "e4m3" }) end, "dtype" },
      { function() return nn.Embedding(4, 3, { dtype = "i32" }) end, "dtype" },
      { function() return nn.Embedding(4, 3, { device = "tpu" }) end, "device" },
      { function() return nn.Embedding(4, 3, { colour = 1 }) end, "colour" },
    } do
      ok, err = pcall(bad[1])
      assert.is_false(ok)
      assert.truthy(tostring(err):find(bad[2], 1, true), err)
      assert.truthy(tostring(err):find("mbedding", 1, true), err)
    end
  end)

  it("keeps its output per ids' shape (the same buffer back), and an inference forward keeps "
     .. "nothing for a backward", function()
    local m = nn.Embedding(10, 4)
    local a = lutra.from_table({ 1, 2, 3, 4, 5, 6 }, { 6 }, "i32")
    local b = lutra.from_table({ 1, 2, 3, 4, 5, 6 }, { 2, 3 }, "i32")
    local addr = function(t) return tonumber(ffi.cast("uintptr_t", t.data)) end
    local ya, yb = addr(m:forward(a)), addr(m:forward(b))
    assert.are_not.equal(ya, yb)
    for _ = 1, 3 do
      assert.are.equal(ya, addr(m:forward(a)))
      assert.are.equal(yb, addr(m:forward(b)))
    end
    m:forward(a, { grad = false })
    local ok, err = pcall(m.backward, m, lutra.tensor({ 6, 4 }))
    assert.is_false(ok)
    assert.truthy(tostring(err):find("grad = false", 1, true), err)
  end)

  it("prints as Embedding(V, dim) and checks clean on the cpu", function()
    local m = nn.Embedding(50, 7, { dtype = "bf16" })
    assert.are.equal("lutra.nn.Embedding(50, 7, bf16, cpu)", tostring(m))
    assert.are.equal("embedding", m:kind())
    m:check() -- nothing to read: the cpu refuses bad ids at the call
  end)

  it("bf16 and f16 modules gather exactly and sum in f32 before one rounding", function()
    for _, dt in ipairs { "bf16", "f16" } do
      local vocab, dim, n = 4, 6, 40
      local m = nn.Embedding(vocab, dim, { dtype = dt })
      local ids = random_ids({ n }, vocab)
      local y = m:forward(lutra.from_table(ids, { n }, "i32"))
      local w = m:parameters()[1].value:to_table()
      local got = y:to_table()
      for p, id in ipairs(ids) do
        for d = 1, dim do assert.are.equal(w[id * dim + d], got[(p - 1) * dim + d]) end
      end
      local dy = lutra.tensor({ n, dim }, dt):randn(random(1, 2 ^ 30))
      m:backward(dy)
      -- the f32 ordered sum rounded once to dt: what the f32 sum becomes through a dt tensor
      local want = lutra.from_table(f32_ordered(ids, dy:to_table(), vocab, dim), { vocab, dim })
      local rounded = lutra.tensor({ vocab, dim }, dt):copy(want):to_table()
      assert.are.same(rounded, m:parameters()[1].grad:to_table())
    end
  end)

  it("saves and loads its weight as <m>weight", function()
    local path = os.tmpname()
    local m = nn.Embedding(12, 5, { seed = 1 })
    lutra.save(path, { model = m })
    local f = assert(io.open(path, "rb"))
    local bytes = f:read("*a")
    f:close()
    assert.truthy(bytes:find('"weight":{', 1, true))
    local fresh = nn.Embedding(12, 5, { seed = 2 })
    assert.are_not.same(m:parameters()[1].value:to_table(), fresh:parameters()[1].value:to_table())
    lutra.load(path, { model = fresh })
    assert.are.same(m:parameters()[1].value:to_table(), fresh:parameters()[1].value:to_table())
    local seq = nn.Sequential(nn.Embedding(12, 5), nn.Linear(5, 3))
    lutra.save(path, { model = seq })
    f = assert(io.open(path, "rb"))
    bytes = f:read("*a")
    f:close()
    os.remove(path)
    assert.truthy(bytes:find('"0.weight":{', 1, true))
  end)

  it("trains inside a Sequential with a Linear and cross-entropy under AdamW", function()
    local vocab, dim, n = 16, 8, 64
    local net = nn.Sequential(nn.Embedding(vocab, dim), nn.Linear(dim, vocab))
    local ids, labels = random_ids({ n }, vocab), {}
    for p, id in ipairs(ids) do labels[p] = (id * 5 + 3) % vocab end
    local x = lutra.from_table(ids, { n }, "i32")
    local t = lutra.from_table(labels, { n }, "i32")
    local loss = nn.CrossEntropyLoss()
    local opt = lutra.optim.AdamW(net, { lr = 3e-2 })
    local first, last
    for i = 1, 30 do
      loss:forward(net:forward(x), t)
      net:backward(loss:backward())
      opt:step()
      net:zero_grad()
      if i == 1 then first = loss:value() end
      last = loss:value()
    end
    assert.is_true(last < 0.5 * first, string.format("loss %g -> %g (seed %d)", first, last, SEED))
  end)

  it("a forward/backward/step loop compiles as a LuaJIT trace", function()
    require("spec.support.jit_trace").assert_compiles("spec/support/jit_embedding_loop.lua")
  end)
end)
