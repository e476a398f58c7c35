-- The CPU inference forward's packed weights (lutra.cpu_inference_pack, lutra_cpu_set_inference_pack
-- in lutra/base.h): an f32 Linear's inference forward multiplies by a transposed copy of its
-- weight, made again whenever the weight changed through lutra.
-- Oracles: the unpacked inference forward and an f64 forward computed here from the weights read
-- back. Bound |packed - f64| <= 1e-5 (1 + |y|) and the same for the unpacked one: both are f32 sums
-- of at most 96 products of values below 3 (an f32 sum's error is a few k eps |terms| ~ 1e-5 at
-- most), in different orders, so they may differ from each other in the last bits but not from
-- the f64 value by more. That the copy is used, and refreshed: a write through the raw data
-- pointer (which lutra cannot see) shows in the unpacked forward and not in the packed one, until
-- a write through lutra, an optimizer step or a checkpoint load marks the weight changed; after
-- each the packed output follows. Fresh random inputs and weights each run.
local lutra = require("lutra")
local ffi = require("ffi")
local fresh = require("spec.support.fresh_random")
local nn = lutra.nn

local rng = fresh.new()
local TOL = 1e-5

-- y = x W^T + b in f64, from the tensors read back (x [rows, in], W [out, in])
local function linear_f64(x, rows, w, b, n_in, n_out)
  local y = {}
  for r = 0, rows - 1 do
    for o = 0, n_out - 1 do
      local s = b and b[o + 1] or 0
      for i = 0, n_in - 1 do s = s + x[r * n_in + i + 1] * w[o * n_in + i + 1] end
      y[r * n_out + o + 1] = s
    end
  end
  return y
end

local function relu(v)
  local y = {}
  for i = 1, #v do y[i] = v[i] > 0 and v[i] or 0 end
  return y
end

-- the MLP in -> h -> ReLU -> out of net's three Linears, in f64
local function mlp_f64(net, x, rows, dims)
  local p = net:parameters()
  local v = x:to_table()
  for l = 1, 3 do
    local w, b = p[2 * l - 1].value:to_table(), p[2 * l].value:to_table()
    v = linear_f64(v, rows, w, b, dims[l], dims[l + 1])
    if l < 3 then v = relu(v) end
  end
  return v
end

local function close_to(got, want, what)
  assert.are.equal(#want, #got, what .. ": sizes")
  for i = 1, #want do
    local d = math.abs(got[i] - want[i])
    if d > TOL * (1 + math.abs(want[i])) then
      error(string.format("%s: element %d: %.9g vs %.9g (seed %d)", what, i, got[i], want[i], rng.seed), 2)
    end
  end
end

local DIMS = { 32, 96, 64, 8 }
local function mlp(seed)
  return nn.Sequential(nn.Linear(DIMS[1], DIMS[2], { seed = seed }), nn.ReLU(),
                       nn.Linear(DIMS[2], DIMS[3], { seed = seed + 1 }), nn.ReLU(),
                       nn.Linear(DIMS[3], DIMS[4], { seed = seed + 2 }))
end

local function infer(m, x) return m:forward(x, { grad = false }):to_table() end

local function packed(m, x)
  local was = lutra.cpu_inference_pack(true)
  local ok, y = pcall(infer, m, x)
  lutra.cpu_inference_pack(was)
  if not ok then error(y, 2) end
  return y
end

describe("lutra.cpu_inference_pack", function()
  after_each(function() lutra.cpu_inference_pack(false) end)

  it("is off by default and returns the previous setting", function()
    assert.is_false(lutra.cpu_inference_pack())
    assert.is_false(lutra.cpu_inference_pack(true))
    assert.is_true(lutra.cpu_inference_pack())
    assert.is_true(lutra.cpu_inference_pack(false))
    assert.are.equal(0, lutra.C.lutra_cpu_inference_pack())
  end)

  for _, rows in ipairs { 1, 7, 64 } do
    it("gives the f64 forward within its bound, as the unpacked one does (batch " .. rows .. ")", function()
      local net = mlp(rng.int(1, 2 ^ 30))
      local x = lutra.tensor({ rows, DIMS[1] }):randn(rng.int(1, 2 ^ 30))
      local ref = mlp_f64(net, x, rows, DIMS)
      close_to(infer(net, x), ref, "unpacked")
      close_to(packed(net, x), ref, "packed")
      close_to(packed(net, x), ref, "packed, second call")
    end)
  end

  it("keeps the copy until the weight changes through lutra: writes, optimizer steps, loads", function()
    local net = mlp(rng.int(1, 2 ^ 30))
    local x = lutra.tensor({ 16, DIMS[1] }):randn(rng.int(1, 2 ^ 30))
    local w = net:parameters()[3].value -- the second Linear's weight [64, 96]
    packed(net, x)
    -- a write lutra does not see: the packed forward keeps the old weight, the unpacked one not
    local raw = ffi.cast("float *", w.data)
    for i = 0, tonumber(w.numel) - 1 do raw[i] = raw[i] * -2 end
    local stale = packed(net, x)
    close_to(infer(net, x), mlp_f64(net, x, 16, DIMS), "unpacked after the raw write")
    assert.has_error(function() close_to(stale, mlp_f64(net, x, 16, DIMS), "stale") end)

    w:randn(rng.int(1, 2 ^ 30), 0, 0.1) -- a write through lutra
    close_to(packed(net, x), mlp_f64(net, x, 16, DIMS), "packed after a tensor write")

    local opt = lutra.optim.AdamW(net, { lr = 0.05 })
    local before = packed(net, x)
    net:forward(x)
    net:backward(lutra.tensor({ 16, DIMS[4] }):randn(rng.int(1, 2 ^ 30)))
    opt:step()
    local after = packed(net, x)
    close_to(after, mlp_f64(net, x, 16, DIMS), "packed after an optimizer step")
    assert.are_not.same(before, after)

    local path = os.tmpname()
    lutra.save(path, { model = mlp(rng.int(1, 2 ^ 30)) })
    lutra.load(path, { model = net })
    os.remove(path)
    close_to(packed(net, x), mlp_f64(net, x, 16, DIMS), "packed after a checkpoint load")
  end)

  it("leaves the training forward and bf16 Linears bit for bit as they were", function()
    local seed = rng.int(1, 2 ^ 30)
    local x = lutra.tensor({ 24, DIMS[1] }):randn(rng.int(1, 2 ^ 30))
    local a, b = mlp(seed), mlp(seed)
    local train_off = a:forward(x):to_table()
    lutra.cpu_inference_pack(true)
    local train_on = b:forward(x):to_table()
    lutra.cpu_inference_pack(false)
    assert.are.same(train_off, train_on)

    local xb = lutra.tensor({ 24, 48 }, "bf16"):randn(rng.int(1, 2 ^ 30))
    local lb = nn.Linear(48, 40, { dtype = "bf16", seed = rng.int(1, 2 ^ 30) })
    assert.are.same(infer(lb, xb), packed(lb, xb))
  end)

  it("packs the Linears inside LayerNormLinear and LayerNormMLP", function()
    local x = lutra.tensor({ 12, 64 }):randn(rng.int(1, 2 ^ 30))
    for _, m in ipairs { nn.LayerNormLinear(64, 48, { seed = rng.int(1, 2 ^ 30) }),
                         nn.LayerNormMLP(64, 128, { seed = rng.int(1, 2 ^ 30) }) } do
      local want = infer(m, x)
      local got = packed(m, x)
      -- the unpacked forward is the oracle here (its own specs hold it to references)
      for i = 1, #want do
        assert(math.abs(got[i] - want[i]) <= TOL * (1 + math.abs(want[i])),
               string.format("%s element %d: %.9g vs %.9g", m:kind(), i, got[i], want[i]))
      end
      -- and the copy is in use: a raw write to the first weight is not seen by the packed forward
      local w = m:parameters()[3].value -- after the norm's weight and bias
      local raw = ffi.cast("float *", w.data)
      for i = 0, tonumber(w.numel) - 1 do raw[i] = 0 end
      assert.are.same(got, packed(m, x))
      assert.are_not.same(got, infer(m, x))
    end
  end)

  it("does not pack a tied weight (its sharers would each clear the other's mark)", function()
    local emb = nn.Embedding(40, 24, { seed = rng.int(1, 2 ^ 30) })
    local head = nn.Linear(24, 40, { bias = false, weight = emb })
    local x = lutra.tensor({ 5, 24 }):randn(rng.int(1, 2 ^ 30))
    packed(head, x)
    local w = emb:parameters()[1].value
    local raw = ffi.cast("float *", w.data)
    for i = 0, tonumber(w.numel) - 1 do raw[i] = raw[i] * 3 end -- unseen by lutra: seen only unpacked
    assert.are.same(infer(head, x), packed(head, x))
  end)

  it("refuses anything but a boolean, naming the call, and keeps the setting", function()
    local ok, err = pcall(lutra.cpu_inference_pack, 1)
    assert.is_false(ok)
    assert.matches("lutra.cpu_inference_pack: on must be a boolean", err)
    assert.are_not.equal(0, lutra.C.lutra_cpu_set_inference_pack(2))
    assert.matches("lutra_cpu_set_inference_pack: on must be 0 or 1, not 2",
                   ffi.string(lutra.C.lutra_last_error()))
    assert.is_false(lutra.cpu_inference_pack())
  end)
end)
