-- Gradient accumulation (lutra_optim_accumulate): k micro-batches summed and stepped on their
-- mean equal one step on the whole batch (SGD, linear in the gradient: up to f32 rounding), a
-- window of one equals no window bit for bit, the count restarts at each step, and a checkpoint
-- inside a window is refused without writing anything.
local lutra = require("lutra")
local nn = lutra.nn

local SEED = os.time() % 100000

local function net(seed)
  return nn.Sequential(nn.Linear(12, 24, { seed = seed }), nn.GELU(),
                       nn.Linear(24, 5, { seed = seed + 1 }))
end

local values = require("spec.support.param_values")

local function rows(t, first, count)
  return lutra.tensor({ count, t:dims()[2] }):copy(t:rows(first, count))
end

describe("optimizer gradient accumulation", function()
  it("k micro-batches stepped on their mean equal one step on the whole batch (SGD)", function()
    local x = lutra.tensor({ 12, 12 }):randn(SEED)
    local y = lutra.tensor({ 12, 5 }):randn(SEED + 1)
    local whole, micro = net(SEED + 2), net(SEED + 2)
    local loss = nn.MSELoss()
    local o1 = lutra.optim.SGD(whole, { lr = 0.5 })
    local o2 = lutra.optim.SGD(micro, { lr = 0.5 })
    loss:forward(whole:forward(x), y)
    whole:backward(loss:backward(), false)
    o1:step()
    for k = 0, 2 do -- three micro-batches of 4 rows: the mean of their mean losses' gradients
      loss:forward(micro:forward(rows(x, k * 4 + 1, 4)), rows(y, k * 4 + 1, 4))
      micro:backward(loss:backward(), false)
      o2:accumulate()
      assert.are.equal(k + 1, o2:accumulated())
    end
    o2:step()
    assert.are.equal(0, o2:accumulated())
    local a, b = values(whole), values(micro)
    local moved = 0
    local before = values(net(SEED + 2))
    for i = 1, #a do
      -- f32 sums in another order: differences of a few ulps of the gradient times lr
      assert.is_true(math.abs(a[i] - b[i]) <= 1e-6 + 1e-5 * math.abs(a[i] - before[i]),
                     string.format("value %d: %.9g vs %.9g (seed %d)", i, a[i], b[i], SEED))
      if a[i] ~= before[i] then moved = moved + 1 end
    end
    assert.is_true(moved > #a / 2)
  end)

  it("a window of one micro-batch is the plain step, bit for bit (AdamW, clipped)", function()
    local x = lutra.tensor({ 8, 12 }):randn(SEED + 3)
    local y = lutra.tensor({ 8, 5 }):randn(SEED + 4)
    local m1, m2 = net(SEED + 5), net(SEED + 5)
    local loss = nn.MSELoss()
    local opts = { lr = 1e-2, max_grad_norm = 0.1 }
    local o1, o2 = lutra.optim.AdamW(m1, opts), lutra.optim.AdamW(m2, opts)
    for _ = 1, 3 do
      loss:forward(m1:forward(x), y)
      m1:backward(loss:backward(), false)
      o1:step()
      loss:forward(m2:forward(x), y)
      m2:backward(loss:backward(), false)
      o2:accumulate()
      o2:step()
    end
    assert.are.same(values(m1), values(m2))
  end)

  it("refuses a checkpoint inside a window, writing nothing, and allows it after the step", function()
    local m = net(SEED + 6)
    local o = lutra.optim.AdamW(m)
    local x = lutra.tensor({ 4, 12 }):randn(SEED + 7)
    local loss = nn.MSELoss()
    loss:forward(m:forward(x), lutra.tensor({ 4, 5 }):randn(SEED + 8))
    m:backward(loss:backward(), false)
    o:accumulate()
    local path = os.tmpname()
    os.remove(path)
    local ok, err = pcall(lutra.save, path, { model = m, optim = o })
    assert.is_false(ok)
    assert.matches("lutra_checkpoint_save: the optimizer is inside a gradient%-accumulation window "
                   .. "%(1 micro%-batches", err)
    assert.is_nil(io.open(path, "rb"))
    o:step()
    lutra.save(path, { model = m, optim = o })
    assert.is_not_nil(io.open(path, "rb"))
    os.remove(path)
  end)

  it("names the call for a bad optimizer", function()
    local C = lutra.C
    assert.are.equal(C.LUTRA_EINVAL, C.lutra_optim_accumulate(nil))
    assert.matches("lutra_optim_accumulate", lutra.ffi.string(C.lutra_last_error()), 1, true)
    local o = lutra.optim.SGD(net(SEED + 9))
    assert.are.equal(C.LUTRA_EINVAL, C.lutra_optim_accumulated(o, nil))
    assert.matches("micro_batches is NULL", lutra.ffi.string(C.lutra_last_error()), 1, true)
  end)
end)
