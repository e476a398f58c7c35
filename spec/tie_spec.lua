-- Weight tying (nn.Linear{weight = emb}, lutra_linear_desc.tie) on the CPU backend: a tiny model
-- Embedding(V, D) -> Linear(D, D) -> Linear(D, V, {weight = emb}), the GPT LM head's shape.
--   gradient: the tied weight's gradient equals the untied modules' gradients summed in f32 -
--     bit for bit when the head's backward runs first (its GEMM writes, the embedding adds one
--     f32 rounding: fl(a + b)), and within 2^-20 * (|a| + |b|) + 1e-30 when the embedding's runs
--     first (the head's GEMM then accumulates with beta = 1 inside the BLAS, whose rounding order
--     may differ from adding its result afterwards by a few f32 roundings of the sum); bf16
--     weights within 2^-7 * (|a| + |b|) (one more bf16 rounding than each part alone);
--   AdamW: 3 steps of the tied model equal, bit for bit, an untied reference whose two gradients
--     are summed by hand in f32 (the same kernel on the same bits);
--   checkpoints: stored once, a round trip resumes bit for bit, untied <-> tied loads refused;
--   FP8 (delayed scaling, emulated on the CPU): a forward after an optimizer step quantizes the
--     updated shared weight (the output follows the new weight, not the cached FP8 copy).
local lutra = require("lutra")
local nn = lutra.nn
local ffi = require("ffi")
local st_edit = require("spec.support.st_edit")

-- fresh random values each run (named in the failures), from a generator of this file's own
local SEED = os.time() % 2147483648
local state = SEED
local function seed()
  state = (state * 1103515245 + 12345) % 2147483648
  return 1 + math.floor(state / 256) % (2 ^ 22)
end
local function random_ids(n, vocab)
  local ids = {}
  for i = 1, n do ids[i] = seed() % vocab end
  return ids
end

local V, D, N = 11, 6, 9

local function f32(x) return tonumber(ffi.new("float", x)) end

local function same_bits(got, want, what)
  assert.are.equal(#want, #got, what .. ": length")
  for i = 1, #want do
    if got[i] ~= want[i] then
      error(string.format("%s: element %d is %.9g, expected %.9g (seed %d)", what, i, got[i],
                          want[i], SEED), 2)
    end
  end
end

local function expect_error(f, ...)
  local ok, err = pcall(f)
  assert.is_false(ok, "expected an error")
  for _, s in ipairs({ ... }) do
    assert.is_truthy(tostring(err):find(s, 1, true),
                     string.format("error %q lacks %q", tostring(err), s))
  end
end

-- the tied model and an untied copy with the same values
local function models(opts)
  opts = opts or {}
  local emb = nn.Embedding(V, D, { seed = seed(), dtype = opts.dtype })
  local mid = nn.Linear(D, D, { seed = seed(), dtype = opts.dtype })
  local head = nn.Linear(D, V, { bias = false, weight = emb, dtype = opts.dtype })
  local emb2 = nn.Embedding(V, D, { dtype = opts.dtype })
  local mid2 = nn.Linear(D, D, { dtype = opts.dtype })
  local head2 = nn.Linear(D, V, { bias = false, dtype = opts.dtype })
  local w = emb:parameters()[1].value:to_table()
  emb2:parameters()[1].value:set(w)
  head2:parameters()[1].value:set(w)
  for i, p in ipairs(mid:parameters()) do mid2:parameters()[i].value:set(p.value:to_table()) end
  return { emb = emb, mid = mid, head = head, emb2 = emb2, mid2 = mid2, head2 = head2 }
end

local function f32_sum(a, b)
  local s = {}
  for i = 1, #a do s[i] = f32(a[i] + b[i]) end
  return s
end

describe("weight tying", function()
  it("shares one weight and one gradient tensor, and prints the tie", function()
    local m = models()
    local pe, ph = m.emb:parameters()[1], m.head:parameters()[1]
    assert.is_true(pe.value == ph.value and pe.grad == ph.grad)
    assert.are.equal(1, #m.head:parameters())
    local net = nn.Sequential(m.emb, m.mid, m.head)
    -- emb.weight, mid.weight, mid.bias: the tied weight once
    local ps = net:parameters()
    assert.are.equal(3, #ps)
    assert.is_true(ps[1].value == pe.value)
    assert.is_truthy(tostring(m.head):find("tied to embedding", 1, true), tostring(m.head))
    assert.is_falsy(tostring(m.mid):find("tied", 1, true), tostring(m.mid))
    -- tied to a Linear, and to a tied Linear (the same weight again)
    local head_t = nn.Linear(D, V, { bias = false, weight = m.head })
    assert.is_true(head_t:parameters()[1].value == pe.value)
    local again = nn.Linear(D, D, { weight = m.mid })
    assert.is_true(again:parameters()[1].value == m.mid:parameters()[1].value)
    assert.is_truthy(tostring(again):find("tied to linear", 1, true))
  end)

  it("sums both gradients, head backward first (the Sequential's order): bit for bit", function()
    local m = models()
    local ids = lutra.from_table(random_ids(N, V), { N }, "i32")
    local dy = lutra.tensor({ N, V }):randn(seed())
    local net = nn.Sequential(m.emb, m.mid, m.head)
    for step = 1, 2 do -- the second step starts afresh: nothing zeroed in between
      dy:randn(seed())
      net:forward(ids)
      net:backward(dy)
      m.emb2:forward(ids)
      m.head2:forward(m.mid2:forward(m.emb2:forward(ids)))
      m.emb2:backward(m.mid2:backward(m.head2:backward(dy)))
      local want = f32_sum(m.head2:parameters()[1].grad:to_table(),
                           m.emb2:parameters()[1].grad:to_table())
      same_bits(m.emb:parameters()[1].grad:to_table(), want, "tied dW, step " .. step)
    end
  end)

  -- bf16: the gradient is stored in bf16 (8 significant bits); the tied sum rounds once more than
  -- each part alone, so within 2^-7 * (|a| + |b|) of their exact sum
  for _, case in ipairs({ { "f32", 2 ^ -20 }, { "bf16", 2 ^ -7 } }) do
  it(case[1] .. ": sums both gradients in either backward order (independent inputs)", function()
    local dtype, rel = case[1], case[2]
    local m = models { dtype = dtype }
    for _, emb_first in ipairs({ true, false, true }) do
      local ids = lutra.from_table(random_ids(N, V), { N }, "i32")
      local x = lutra.tensor({ N, D }, dtype):randn(seed())
      local dy_e = lutra.tensor({ N, D }, dtype):randn(seed())
      local dy_h = lutra.tensor({ N, V }, dtype):randn(seed())
      m.emb:forward(ids)
      m.head:forward(x)
      if emb_first then
        m.emb:backward(dy_e)
        m.head:backward(dy_h)
      else
        m.head:backward(dy_h)
        m.emb:backward(dy_e)
      end
      m.emb2:forward(ids)
      m.emb2:backward(dy_e)
      m.head2:forward(x)
      m.head2:backward(dy_h)
      local a, b = m.emb2:parameters()[1].grad:to_table(), m.head2:parameters()[1].grad:to_table()
      local got = m.emb:parameters()[1].grad:to_table()
      for i = 1, #a do
        local tol = rel * (math.abs(a[i]) + math.abs(b[i])) + 1e-30
        assert.is_true(math.abs(got[i] - (a[i] + b[i])) <= tol,
                       string.format("emb_first=%s: dW[%d] %.9g vs %.9g (seed %d)",
                                     tostring(emb_first), i, got[i], a[i] + b[i], SEED))
      end
    end
  end)
  end

  it("a module alone, or its second backward of one forward, overwrites", function()
    local m = models()
    local x = lutra.tensor({ N, D }):randn(seed())
    local dy = lutra.tensor({ N, V }):randn(seed())
    m.head:forward(x)
    m.head:backward(dy)
    local first = m.head:parameters()[1].grad:to_table()
    m.head:backward(dy)
    same_bits(m.head:parameters()[1].grad:to_table(), first, "second backward")
  end)

  it("accumulate_main_grad: both add into the shared main_grad", function()
    local emb = nn.Embedding(V, D, { seed = seed(), accumulate_main_grad = true })
    local head = nn.Linear(D, V, { bias = false, weight = emb, accumulate_main_grad = true })
    local ids = lutra.from_table(random_ids(N, V), { N }, "i32")
    local x = lutra.tensor({ N, D }):randn(seed())
    local dy_e, dy_h = lutra.tensor({ N, D }):randn(seed()), lutra.tensor({ N, V }):randn(seed())
    local mg = emb:parameters()[1].main_grad
    assert.is_true(mg == head:parameters()[1].main_grad)
    for _ = 1, 2 do -- two micro-batches
      emb:forward(ids)
      head:forward(x)
      head:backward(dy_h)
      emb:backward(dy_e)
    end
    local once = nn.Sequential(emb, head)
    once:zero_grad()
    emb:forward(ids)
    head:forward(x)
    emb:backward(dy_e)
    head:backward(dy_h)
    local one = mg:to_table()
    once:zero_grad()
    for _ = 1, 2 do
      emb:forward(ids)
      head:forward(x)
      head:backward(dy_h)
      emb:backward(dy_e)
    end
    local two = mg:to_table()
    for i = 1, #one do
      assert.is_true(math.abs(two[i] - 2 * one[i]) <= 2 ^ -20 * math.abs(2 * one[i]) + 1e-30,
                     string.format("main_grad[%d] %.9g vs 2 x %.9g (seed %d)", i, two[i], one[i],
                                   SEED))
    end
  end)

  it("AdamW updates the weight once: 3 steps equal the untied reference, bit for bit", function()
    local m = models()
    local net = nn.Sequential(m.emb, m.mid, m.head)
    local opt = lutra.optim.AdamW(net, { lr = 1e-2 })
    local ref = lutra.optim.AdamW(nn.Sequential(m.emb2, m.mid2), { lr = 1e-2 })
    local loss, loss2 = nn.MSELoss(), nn.MSELoss()
    for step = 1, 3 do
      local ids = lutra.from_table(random_ids(N, V), { N }, "i32")
      local t = lutra.tensor({ N, V }):randn(seed())
      loss:forward(net:forward(ids), t)
      net:backward(loss:backward())
      opt:step()
      loss2:forward(m.head2:forward(m.mid2:forward(m.emb2:forward(ids))), t)
      m.emb2:backward(m.mid2:backward(m.head2:backward(loss2:backward())))
      local ge = m.emb2:parameters()[1].grad
      ge:set(f32_sum(m.head2:parameters()[1].grad:to_table(), ge:to_table()))
      ref:step()
      local w2 = m.emb2:parameters()[1].value:to_table()
      m.head2:parameters()[1].value:set(w2)
      same_bits(m.emb:parameters()[1].value:to_table(), w2, "weight after step " .. step)
      same_bits(m.mid:parameters()[1].value:to_table(), m.mid2:parameters()[1].value:to_table(),
                "mid weight after step " .. step)
    end
  end)

  it("checkpoints store the weight once and resume bit for bit; tie mismatches refused", function()
    local dir = os.tmpname()
    os.remove(dir)
    local path = dir .. ".tie.st"
    local function build()
      lutra.manual_seed(77)
      local emb = nn.Embedding(V, D)
      local net = nn.Sequential(emb, nn.Linear(D, D), nn.Linear(D, V, { bias = false, weight = emb }))
      return net, lutra.optim.AdamW(net, { lr = 1e-2 })
    end
    local batches = {}
    for i = 1, 4 do
      batches[i] = { ids = random_ids(N, V), t = lutra.tensor({ N, V }):randn(seed()):to_table() }
    end
    local loss = nn.MSELoss()
    local function train(net, opt, from, to)
      for i = from, to do
        local b = batches[i]
        loss:forward(net:forward(lutra.from_table(b.ids, { N }, "i32")),
                     lutra.from_table(b.t, { N, V }))
        net:backward(loss:backward())
        opt:step()
      end
    end
    local straight, so = build()
    train(straight, so, 1, 4)
    local net, opt = build()
    train(net, opt, 1, 2)
    lutra.save(path, { model = net, optim = opt })
    local header = st_edit.split(st_edit.read(path))
    assert.is_truthy(header:find('"0.weight"', 1, true), header)
    assert.is_falsy(header:find('"2.weight"', 1, true), header)
    assert.is_falsy(header:find('"optim.2.weight', 1, true), header)
    local resumed, ro = build()
    train(resumed, ro, 1, 1) -- different state, overwritten by the load
    lutra.load(path, { model = resumed, optim = ro })
    train(resumed, ro, 3, 4)
    for i, p in ipairs(straight:parameters()) do
      same_bits(resumed:parameters()[i].value:to_table(), p.value:to_table(), "param " .. i)
    end
    -- the loaded head still shares the embedding's weight
    assert.is_true(resumed[1]:parameters()[1].value == resumed[3]:parameters()[1].value)
    -- an untied model lacks the tie: refused both ways, nothing changed
    lutra.manual_seed(77)
    local untied = nn.Sequential(nn.Embedding(V, D), nn.Linear(D, D), nn.Linear(D, V, { bias = false }))
    local before = untied[3]:parameters()[1].value:to_table()
    expect_error(function() lutra.load(path, { model = untied }) end, "lacks tensor '2.weight'")
    same_bits(untied[3]:parameters()[1].value:to_table(), before, "untied after a refused load")
    local upath = dir .. ".untied.st"
    lutra.save(upath, { model = untied })
    expect_error(function() lutra.load(upath, { model = resumed }) end, "'2.weight'",
                 "ties to '0.weight'")
    os.remove(path)
    os.remove(upath)
  end)

  it("refuses a bad tie with a clear error", function()
    local emb = nn.Embedding(V, D, { seed = seed() })
    expect_error(function() nn.Linear(D + 1, V, { weight = emb }) end, "lutra_linear_new",
                 "weight is [11, 6]", "[11, 7]")
    expect_error(function() nn.Linear(D, V, { weight = emb, dtype = "bf16" }) end,
                 "embedding's weight is f32", "bf16")
    expect_error(function() nn.Linear(D, V, { weight = emb, accumulate_main_grad = true }) end,
                 "accumulate_main_grad")
    expect_error(function() nn.Linear(D, V, { weight = nn.GELU() }) end, "out of range")
    local norm = lutra.nn.LayerNorm(D)
    expect_error(function() nn.Linear(D, 1, { weight = norm }) end, "cannot be tied to")
    expect_error(function() nn.Linear(D, V, { weight = 3 }) end, "weight must be the module")
    expect_error(function() nn.Linear(D, V, { weight = emb:parameters()[1].value }) end,
                 "pass the module that owns it")
    if lutra.device_available("cuda") then
      local other = nn.Embedding(V, D, { device = "cuda" })
      expect_error(function() nn.Linear(D, V, { weight = other }) end, "another device")
    end
    -- the same module twice in a Sequential stays refused, and says how to share a weight
    local l = nn.Linear(D, D)
    expect_error(function() nn.Sequential(l, l) end, "appear only once", "tie")
  end)

  it("survives the garbage collector in either order", function()
    for _, drop_emb in ipairs({ true, false }) do
      local emb = nn.Embedding(V, D, { seed = seed() })
      local head = nn.Linear(D, V, { bias = false, weight = emb })
      local w = emb:parameters()[1].value:to_table()
      if drop_emb then emb = nil else head = nil end
      collectgarbage()
      collectgarbage()
      if drop_emb then
        local x = lutra.tensor({ N, D }):randn(seed())
        head:forward(x)
        head:backward(lutra.tensor({ N, V }):randn(seed()))
        same_bits(head:parameters()[1].value:to_table(), w, "weight kept by the head")
      else
        local ids = lutra.from_table(random_ids(N, V), { N }, "i32")
        emb:forward(ids)
        emb:backward(lutra.tensor({ N, D }):randn(seed()))
      end
    end
    -- an embedding a Linear uses cannot be destroyed; the Linear can, and then the embedding
    local emb = nn.Embedding(V, D, { seed = seed() })
    local head = nn.Linear(D, V, { bias = false, weight = emb })
    expect_error(function() emb:destroy() end, "still used")
    head:destroy()
    emb:destroy()
  end)

  it("a tied training loop compiles to one LuaJIT trace, with no NYI abort", function()
    require("spec.support.jit_trace").assert_compiles("spec/support/jit_embedding_loop.lua",
                                                       "tied")
  end)

  it("FP8: a forward after an optimizer step quantizes the updated shared weight", function()
    local V, D, N = 32, 16, 16 -- FP8 GEMMs take multiples of 16
    local emb = nn.Embedding(V, D, { seed = seed() })
    local head = nn.Linear(D, V, { bias = false, weight = emb })
    local opt = lutra.optim.AdamW(nn.Sequential(emb, head), { lr = 5e-2 })
    local scope = lutra.autocast { recipe = lutra.recipe.current() }
    local x = lutra.tensor({ N, D }):randn(seed())
    local ids = lutra.from_table(random_ids(N, V), { N }, "i32")
    scope:enter()
    local y0 = head:forward(x, true):to_table() -- quantizes and caches the weight
    head:backward(lutra.tensor({ N, V }):randn(seed()))
    scope:exit()
    emb:forward(ids)
    emb:backward(lutra.tensor({ N, D }):randn(seed()))
    opt:step()
    -- the same forward on a fresh untied Linear holding the stepped weight
    local fresh = nn.Linear(D, V, { bias = false })
    fresh:parameters()[1].value:set(emb:parameters()[1].value:to_table())
    scope:enter()
    local y1 = head:forward(x, true):to_table()
    local yn = head:forward(x):to_table()
    local want = fresh:forward(x, true):to_table()
    scope:exit()
    same_bits(y1, want, "FP8 output after the step (is_first_microbatch true)")
    same_bits(yn, want, "FP8 output after the step (is_first_microbatch nil)")
    local differs = false
    for i = 1, #y0 do differs = differs or y0[i] ~= y1[i] end
    assert.is_true(differs, "the output did not follow the stepped weight")
  end)
end)
