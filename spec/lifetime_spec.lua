-- Lifetimes: nothing ordinary Lua does with the objects the library hands out may crash the
-- process or read freed memory. Each case either works or raises a clear error. Before the
-- reference counting of tensor shells and quantizers these crashed, or failed under
-- `make test-asan` (heap-use-after-free).
local lutra = require("lutra")
local nn = lutra.nn
local E = require("spec.support.errors")
local message_of = E.message_of

local function full_gc()
  collectgarbage()
  collectgarbage()
end

local function expect_freed(fn, what)
  local msg = message_of(fn)
  assert.is_truthy(msg, what .. ": expected an error")
  assert.is_truthy(msg:find("was freed", 1, true), what .. ": unexpected message: " .. msg)
end

local function expected_y(seed, x)
  local m = nn.Linear(16, 16, { seed = seed })
  return m:forward(x):to_table()
end

describe("lifetimes", function()
  it("an output keeps its module alive after the module's last reference is gone", function()
    local x = lutra.tensor({ 16, 16 }):randn(1)
    local y = nn.Linear(16, 16, { seed = 7 }):forward(x)
    full_gc()
    local want = expected_y(7, x)
    local got = y:to_table()
    assert.are.same(want, got)
  end)

  it("backward works after the input's last Lua reference is gone", function()
    local m = nn.Linear(16, 16, { seed = 3 })
    local ref = nn.Linear(16, 16, { seed = 3 })
    local dy = lutra.tensor({ 16, 16 }):fill(1)
    m:forward(lutra.tensor({ 16, 16 }):randn(1))
    full_gc()
    local dx = m:backward(dy):to_table()
    ref:forward(lutra.tensor({ 16, 16 }):randn(1))
    assert.are.same(ref:backward(dy):to_table(), dx)
    assert.are.same(ref:parameters()[1].grad:to_table(), m:parameters()[1].grad:to_table())
  end)

  it("GELU's backward works after the input's last Lua reference is gone", function()
    local g = nn.GELU()
    local dy = lutra.tensor({ 16, 16 }):fill(1)
    g:forward(lutra.tensor({ 16, 16 }):randn(5))
    full_gc()
    local dx = g:backward(dy):to_table()
    local ref = nn.GELU()
    ref:forward(lutra.tensor({ 16, 16 }):randn(5))
    assert.are.same(ref:backward(dy):to_table(), dx)
  end)

  it("backward refuses an input freed explicitly", function()
    local m = nn.Linear(16, 16)
    local x = lutra.tensor({ 16, 16 }):randn(1)
    m:forward(x)
    x:destroy()
    expect_freed(function() m:backward(lutra.tensor({ 16, 16 })) end, "backward")
  end)

  it("an output used after module:destroy() is an error", function()
    local m = nn.Linear(16, 16)
    local y = m:forward(lutra.tensor({ 16, 16 }):randn(1))
    local w = m:parameters()[1].value
    m:destroy()
    expect_freed(function() y:to_table() end, "y")
    expect_freed(function() w:to_table() end, "weight")
    assert.is_true(y:is_freed())
  end)

  it("the old output once four newer batch sizes replaced its buffer is an error", function()
    -- a module keeps a buffer per shape seen, four at most (a train and an eval batch size
    -- alternate without reallocating): the fifth shape takes the least recently used one's
    local m = nn.Linear(16, 16)
    local y = m:forward(lutra.tensor({ 16, 16 }):randn(1))
    for i, rows in ipairs { 48, 64, 80 } do m:forward(lutra.tensor({ rows, 16 }):randn(2 + i)) end
    assert.are.equal(16 * 16, #y:to_table()) -- still one of the four
    local y2 = m:forward(lutra.tensor({ 32, 16 }):randn(2))
    expect_freed(function() y:to_table() end, "old y")
    local msg = message_of(function() y:to_table() end)
    assert.is_truthy(msg:find("later call", 1, true), msg)
    assert.are.equal(32 * 16, #y2:to_table())
  end)

  it("the steady loop returns one handle per buffer", function()
    local m = nn.Linear(16, 16)
    local x = lutra.tensor({ 16, 16 }):randn(1)
    local a = m:forward(x)
    local b = m:forward(x)
    assert.are.equal(a, b)
    assert.is_true(rawequal(a, b))
  end)

  it("a loss's tensors keep the loss alive and fail cleanly after loss:destroy()", function()
    local pred = lutra.tensor({ 4, 4 }):randn(1)
    local target = lutra.tensor({ 4, 4 })
    local l = nn.MSELoss():forward(pred, target)
    full_gc()
    assert.is_true(l:item() > 0)
    local loss = nn.MSELoss()
    local v = loss:forward(pred, target)
    local d = loss:backward()
    loss:destroy()
    expect_freed(function() v:item() end, "loss value")
    expect_freed(function() d:to_table() end, "dpred")
  end)

  it("an FP8 tensor after quantizer:destroy() is an error; before, it keeps q alive", function()
    local x = lutra.tensor({ 32, 32 }):randn(1)
    local xq = lutra.quantizer(lutra.recipe.current{}, "input"):quantize(x)
    full_gc()
    assert.are.equal(32 * 32, #xq:to_table())
    local q = lutra.quantizer(lutra.recipe.current{}, "input")
    local t = q:quantize(x)
    q:destroy()
    expect_freed(function() t:to_table() end, "fp8 tensor")
    expect_freed(function() t:bytes() end, "fp8 bytes")
  end)

  it("a module:quantizer() handle after the recipe changed is an error", function()
    local m = nn.Linear(32, 32)
    local x = lutra.tensor({ 32, 32 }):randn(1)
    lutra.autocast{ recipe = lutra.recipe.delayed{ amax_history_len = 4 } }:run(function()
      m:forward(x)
    end)
    local q = m:quantizer("input")
    assert.is_truthy(q:scale())
    lutra.autocast{ recipe = lutra.recipe.current{} }:run(function() m:forward(x) end)
    full_gc()
    expect_freed(function() q:scale() end, "old quantizer")
    expect_freed(function() q:history(4) end, "old quantizer history")
    -- the handle of the live quantizer works, and keeps the module alive
    local q2 = m:quantizer("input")
    m = nil
    full_gc()
    assert.is_truthy(q2:scale())
  end)

  it("a module:quantizer() handle after module:destroy() is an error", function()
    local m = nn.Linear(32, 32)
    lutra.autocast{ recipe = lutra.recipe.current{} }:run(function()
      m:forward(lutra.tensor({ 32, 32 }):randn(1))
    end)
    local q = m:quantizer("weight")
    m:destroy()
    expect_freed(function() q:scale() end, "quantizer")
  end)

  it("a Sequential's output outlives the Sequential's last reference", function()
    local x = lutra.tensor({ 16, 16 }):randn(1)
    local y = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16)):forward(x)
    full_gc()
    assert.are.equal(256, #y:to_table())
  end)

  -- CUDA graphs need the cuda device: this case runs on GPU machines (make gpu-check)
  local cuda = lutra.device_available and lutra.device_available("cuda")
  local graph_it = cuda and it or pending
  graph_it("a graph refuses to replay after a captured module was freed", function()
    local m = nn.Linear(16, 16, { device = "cuda" })
    local x = lutra.tensor({ 16, 16 }, "f32", "cuda"):randn(1)
    local g = lutra.graph.capture(function() m:forward(x) end, { device = "cuda" })
    x = nil
    full_gc()
    g:replay() -- the graph holds x and m: still correct
    m:destroy()
    local msg = message_of(function() g:replay() end)
    assert.is_truthy(msg and msg:find("was freed", 1, true), msg)
  end)
end)
