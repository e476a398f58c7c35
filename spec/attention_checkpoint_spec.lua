-- A DotProductAttention's dropout generator in checkpoints (<m>.rng_state, U64 [2]: seed and the
-- offset of the next forward's mask; lutra/checkpoint.h): N training steps with dropout 0.1, save,
-- load into freshly built objects (whose own generators start elsewhere), N more steps equal 2N
-- steps straight bit for bit (every step's loss, the final parameters), for the module alone and
-- inside a TransformerLayer and a MultiheadAttention made with attention_dropout. A file without
-- the entry (written before it was saved) loads, the generator left as it is, and that resume
-- differs from the straight run: the control that the comparison can fail. A damaged entry
-- (dtype, shape) is refused naming it and changes nothing; a module without dropout saves none
-- and skips a file's.
local lutra = require("lutra")
local nn = lutra.nn
local st = require("spec.support.st_edit")

local fresh = require("spec.support.fresh_random").new()
local random = fresh.int

local N = 3
local B, T = 2, 5

local dir = st.tempdir()
local function path(name) return dir .. "/" .. name end
teardown(function() os.execute("rm -rf " .. dir) end)

-- the models, built with their weights from w (fresh objects get other weights and, built after
-- another manual_seed, other dropout seeds: the load must bring both)
local attention_of = setmetatable({}, { __mode = "k" }) -- a Sequential's attention
local kinds = {
  alone = {
    entry = "1.rng_state",
    hidden = 16,
    build = function(w, dropout)
      local attn = nn.DotProductAttention(2, 8, { dropout = dropout })
      local net = nn.Sequential(nn.Linear(16, 48, { seed = w }), attn,
                                nn.Linear(16, 16, { seed = w + 1 }))
      attention_of[net] = attn
      return net
    end,
    attention = function(net) return attention_of[net] end,
  },
  layer = {
    entry = "self_attention.core_attention.rng_state",
    hidden = 16,
    build = function(w, dropout)
      return nn.TransformerLayer(16, 32, 2, { attention_dropout = dropout, seed = w })
    end,
    attention = function(net) return net:part("attention") end,
  },
  mha = {
    entry = "core_attention.rng_state",
    hidden = 16,
    build = function(w, dropout)
      return nn.MultiheadAttention(16, 2, { attention_dropout = dropout, seed = w })
    end,
    attention = function(net) return net:part("attention") end,
  },
}

-- steps first .. last of a run; step i's data drawn from data_seed + i, so that a resumed run
-- sees the straight run's data whatever the generator's state
local function train(net, opt, hidden, data_seed, first, last, losses)
  local loss = nn.MSELoss()
  local x, t = lutra.tensor { B, T, hidden }, lutra.tensor { B, T, hidden }
  for i = first, last do
    x:randn(data_seed + 2 * i)
    t:randn(data_seed + 2 * i + 1)
    loss:forward(net:forward(x), t)
    net:backward(loss:backward())
    opt:step()
    losses[#losses + 1] = string.format("%a", loss:value())
  end
end

local function param_bytes(net)
  local out = {}
  for i, p in ipairs(net:parameters()) do out[i] = p.value:bytes() end
  return out
end

local function assert_same_params(a, b, what)
  local pa, pb = param_bytes(a), param_bytes(b)
  assert.are.equal(#pa, #pb)
  assert.is_true(#pa > 0)
  for i = 1, #pa do assert.is_true(pa[i] == pb[i], what .. ": parameter " .. i .. " differs") end
end

-- straight 2N steps; and N steps, saved to file (returned with the first run's objects)
local function runs(kind, w, data_seed, name)
  local k = kinds[kind]
  lutra.manual_seed(w)
  local straight = k.build(w, 0.1)
  local sopt = lutra.optim.AdamW(straight, { lr = 1e-2 })
  local straight_losses = {}
  train(straight, sopt, k.hidden, data_seed, 1, 2 * N, straight_losses)
  lutra.manual_seed(w)
  local first = k.build(w, 0.1)
  local fopt = lutra.optim.AdamW(first, { lr = 1e-2 })
  local losses = {}
  train(first, fopt, k.hidden, data_seed, 1, N, losses)
  local file = path(name)
  lutra.save(file, { model = first, optim = fopt })
  return { straight = straight, straight_losses = straight_losses, first = first,
           losses = losses, file = file }
end

-- fresh objects (other weights, another dropout seed) loaded from file, then steps N+1 .. 2N
local function resume(kind, w, data_seed, file, losses)
  local k = kinds[kind]
  lutra.manual_seed(w + 7777)
  local net = k.build(w + 100, 0.1)
  local opt = lutra.optim.AdamW(net, { lr = 1e-2 })
  local before = { k.attention(net):rng_state() }
  lutra.load(file, { model = net, optim = opt })
  train(net, opt, k.hidden, data_seed, N + 1, 2 * N, losses)
  return net, before
end

local function header_of(file) return (st.split(st.read(file))) end

describe("a DotProductAttention's dropout generator in checkpoints", function()
  for _, kind in ipairs { "alone", "layer", "mha" } do
    it("resumes bit for bit with dropout 0.1 (" .. kind .. ")", function()
      local w, data_seed = random(1, 2 ^ 20), random(1, 2 ^ 20)
      local r = runs(kind, w, data_seed, kind .. ".st")
      local k = kinds[kind]
      assert.truthy(header_of(r.file):find('"' .. k.entry .. '":{"dtype":"U64","shape":[2]', 1,
                                           true), k.entry .. " is in the file as U64 [2]")
      local seed, offset = k.attention(r.first):rng_state()
      assert.is_true(offset > 0, "the dropout offset advanced")
      local net, before = resume(kind, w, data_seed, r.file, r.losses)
      assert.is_false(before[1] == seed, "the fresh module's seed differs before the load")
      -- the generator went on from the saved state: N more forwards with dropout
      local _, straight_offset = k.attention(r.straight):rng_state()
      local got_seed, got_offset = k.attention(net):rng_state()
      assert.is_true(got_seed == seed and got_offset == straight_offset)
      assert.are.same(r.straight_losses, r.losses)
      assert_same_params(net, r.straight, "after the resume")
    end)
  end

  it("loads a file without the entry, leaving the generator as it is: that resume differs",
     function()
    local w, data_seed = random(1, 2 ^ 20), random(1, 2 ^ 20)
    local r = runs("alone", w, data_seed, "old.st")
    -- the file an older lutra wrote: the same tensors, no 1.rng_state
    -- (its data cut out, the later offsets moved back, no checksum: an unchecked file)
    local header, data = st.split(st.read(r.file))
    local b, e = st.offsets(header, "1.rng_state")
    local old, n = header:gsub('"1%.rng_state":{[^}]*},?', "")
    assert.are.equal(1, n)
    old = old:gsub('"data_offsets":%[(%d+),(%d+)%]', function(x, y)
      x, y = tonumber(x), tonumber(y)
      if x >= e then x, y = x - (e - b), y - (e - b) end
      return string.format('"data_offsets":[%d,%d]', x, y)
    end)
    old, n = old:gsub('"data%.crc32c":"%x+",?', "")
    assert.are.equal(1, n)
    old = old:gsub(",}", "}")
    st.write(r.file, st.join(old, data:sub(1, b) .. data:sub(e + 1)))
    lutra.manual_seed(w + 7777)
    local net = kinds.alone.build(w + 100, 0.1)
    local opt = lutra.optim.AdamW(net, { lr = 1e-2 })
    local attn = kinds.alone.attention(net)
    local seed, offset = attn:rng_state()
    lutra.load(r.file, { model = net, optim = opt })
    local s2, o2 = attn:rng_state()
    assert.is_true(s2 == seed and o2 == offset, "the generator kept its state")
    local params = param_bytes(net)
    assert.is_true(params[1] == param_bytes(r.first)[1], "the rest of the file loaded")
    train(net, opt, 16, data_seed, N + 1, 2 * N, r.losses)
    assert.are.equal(2 * N, #r.losses)
    assert.are_not.same(r.straight_losses, r.losses)
  end)

  it("refuses a damaged entry by name and changes nothing", function()
    local w, data_seed = random(1, 2 ^ 20), random(1, 2 ^ 20)
    local r = runs("alone", w, data_seed, "bad.st")
    local header, data = st.split(st.read(r.file))
    local damaged = {
      { '"1.rng_state":{"dtype":"I64","shape":[2]', "dtype I64" },
      { '"1.rng_state":{"dtype":"U64","shape":[1,2]', "shape [1, 2]" },
    }
    lutra.manual_seed(w + 7777)
    local net = kinds.alone.build(w + 100, 0.1)
    local attn = kinds.alone.attention(net)
    local seed, offset = attn:rng_state()
    local params = param_bytes(net)
    for _, d in ipairs(damaged) do
      local bad, n = header:gsub('"1%.rng_state":{"dtype":"U64","shape":%[2%]',
                                 function() return d[1] end)
      assert.are.equal(1, n)
      st.write(r.file, st.join(bad, data))
      local ok, err = pcall(lutra.load, r.file, { model = net })
      assert.is_false(ok, d[2] .. " is refused")
      err = tostring(err)
      assert.truthy(err:find("'1.rng_state'", 1, true), err)
      assert.truthy(err:find(d[2]:match("^%a+"), 1, true), err)
      local s2, o2 = attn:rng_state()
      assert.is_true(s2 == seed and o2 == offset, "the generator is unchanged")
      local after = param_bytes(net)
      for i = 1, #params do assert.is_true(after[i] == params[i], "parameter " .. i) end
    end
  end)

  it("is not saved by a module without dropout, which skips a file's", function()
    local w = random(1, 2 ^ 20)
    lutra.manual_seed(w)
    local plain = kinds.alone.build(w, 0)
    local file = path("plain.st")
    lutra.save(file, { model = plain })
    assert.is_nil(header_of(file):find("rng_state", 1, true))
    local r = runs("alone", w, random(1, 2 ^ 20), "trained.st")
    local eval = kinds.alone.build(w + 100, 0)
    lutra.load(r.file, { model = eval })
    assert_same_params(eval, r.first, "an inference model from the training run's file")
  end)
end)
