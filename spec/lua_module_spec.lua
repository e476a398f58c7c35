-- Modules written in Lua (lutra.lua_module): a pre-norm residual MLP block in Lua, in an
-- nn.Sequential with C Linears, against the same computation composed by hand (same modules'
-- weights, same ops: equal to the bit), central finite differences of the whole Sequential in f32
-- on the CPU, the optimizer seeing each parameter once, print, a checkpoint round trip, forward
-- options reaching the block, and bad protocol objects refused with a message naming the call.
local lutra = require("lutra")
local nn = lutra.nn
local E = require("spec.support.errors")
local FD = require("spec.support.finite_diff")

-- the example block of README: y = x + f(x), dx = dy + f'(dy)
local Block = require("spec.support.residual_block")

local seed = os.time()
local function net_of(s)
  return nn.Sequential(nn.Linear(4, 6, { seed = s }), nn.GELU(), Block(6, 8, { seed = s + 10 }),
                       nn.Linear(6, 3, { seed = s + 20 }))
end

local function max_diff(a, b)
  local ta, tb, m = a:to_table(), b:to_table(), 0
  assert.are.equal(#ta, #tb)
  for i = 1, #ta do m = math.max(m, math.abs(ta[i] - tb[i])) end
  return m
end

describe("a Lua module in nn.Sequential", function()
  it("stays the C Sequential when every element is a C module", function()
    local s = nn.Sequential(nn.Linear(2, 2), nn.GELU())
    assert.are.equal("cdata", type(s))
    assert.are.equal("table", type(net_of(seed)))
  end)

  it("forward and backward equal the same modules composed by hand", function()
    local net = net_of(seed)
    local x = lutra.tensor({ 5, 4 }):randn(seed)
    local dy = lutra.tensor({ 5, 3 }):randn(seed + 1)
    local y = net:forward(x)
    local dx = net:backward(dy)
    -- by hand, through the same modules: the C run [Linear, GELU] as one C Sequential
    local head = nn.Sequential(net[1], net[2])
    local blk, last = net[3], net[4]
    local h = head:forward(x)
    local fh = blk.f:forward(h)
    local r = lutra.add(h, fh)
    local y2 = last:forward(r)
    assert.are.equal(0, max_diff(y, y2))
    local dr = last:backward(dy)
    local dfh = blk.f:backward(dr)
    local dh = lutra.add(dr, dfh)
    local dx2 = head:backward(dh)
    assert.are.equal(0, max_diff(dx, dx2))
  end)

  it("has the gradients of central finite differences (f32, cpu)", function()
    -- L = sum(y * r); h = 1e-2; |num - ana| <= 1e-2 |ana| + 1e-3 max|ana| per element (the
    -- bounds of spec/gradcheck_spec.lua: f32 rounding of the forward over 2h, GELU's and the
    -- norm's truncation error of order h^2)
    local net = net_of(seed + 100)
    local x = lutra.tensor({ 3, 4 }):randn(seed + 2)
    local r = lutra.tensor({ 3, 3 }):randn(seed + 3):to_table()
    local function loss()
      local y, s = net:forward(x):to_table(), 0
      for i = 1, #y do s = s + y[i] * r[i] end
      return s
    end
    net:zero_grad()
    net:forward(x)
    local dx = net:backward(lutra.from_table(r, { 3, 3 })):to_table()
    local params = net:parameters()
    -- the block's first inner Linear's weight (after the norm's weight and bias, the first
    -- Linear's weight and bias): a parameter inside the Lua block
    local w = params[5].value
    assert.are.same({ 8, 6 }, w:dims())
    local gw = params[5].grad:to_table()
    local function close(num, ana)
      local scale = 0
      for i = 1, #ana do scale = math.max(scale, math.abs(ana[i])) end
      for i = 1, #ana do
        assert.is_true(math.abs(num[i] - ana[i]) <= 1e-2 * math.abs(ana[i]) + 1e-3 * scale,
                       string.format("element %d: numerical %g, analytical %g", i, num[i], ana[i]))
      end
    end
    close(FD.central(x:to_table(), loss, 1e-2, function(v) x:set(v) end), dx)
    close(FD.central(w:to_table(), loss, 1e-2, function(v) w:set(v) end), gw)
  end)

  it("gives an optimizer every parameter once", function()
    local net = net_of(seed + 200)
    local params = net:parameters()
    -- Linear 2, the block's norm 2 and Linears 4, Linear 2
    assert.are.equal(10, #params)
    local seen = {}
    for _, p in ipairs(params) do
      local key = tostring(lutra.ffi.cast("void *", p.value.data))
      assert.is_nil(seen[key])
      seen[key] = true
    end
    local x = lutra.tensor({ 4, 4 }):randn(seed)
    net:forward(x)
    net:backward(lutra.tensor({ 4, 3 }):fill(1))
    local before = {}
    for i, p in ipairs(params) do before[i] = p.value:to_table() end
    local opt = lutra.optim.SGD(net, { lr = 0.1 })
    opt:step()
    for i, p in ipairs(params) do
      -- one SGD step of lr 0.1: each parameter moved by exactly -0.1 grad (once, not twice)
      local now, g = p.value:to_table(), p.grad:to_table()
      for j = 1, #now do
        assert.is_true(math.abs(now[j] - (before[i][j] - 0.1 * g[j])) <= 1e-6
                         * (1 + math.abs(before[i][j])), string.format("parameter %d", i))
      end
    end
    net:zero_grad()
    for _, p in ipairs(params) do
      for _, v in ipairs(p.grad:to_table()) do assert.are.equal(0, v) end
    end
  end)

  it("prints its tree, the Lua block and its C children", function()
    local s = tostring(net_of(seed))
    assert.is_truthy(s:find("^lutra.nn.Sequential%(\n  %(1%): lutra.nn.Linear%(in=4, out=6"))
    assert.is_truthy(s:find("(3): ResidualMLP(\n    (1): lutra.nn.Sequential(", 1, true))
    assert.is_truthy(s:find("(4): lutra.nn.Linear(in=6, out=3", 1, true))
  end)

  it("round-trips a checkpoint, named as the C Sequential of the same modules", function()
    local net = net_of(seed + 300)
    local path = os.tmpname()
    lutra.save(path, { model = net })
    local f = assert(io.open(path, "rb"))
    local head = f:read(4096)
    f:close()
    for _, name in ipairs { "0.weight", "0.bias", "2.0.1.weight", "2.0.0.weight", "3.bias" } do
      assert.is_truthy(head:find('"' .. name .. '"', 1, true), name)
    end
    local params = net:parameters()
    local saved = {}
    for i, p in ipairs(params) do saved[i] = p.value:to_table() end
    for _, p in ipairs(params) do p.value:randn() end
    lutra.load(path, { model = net })
    for i, p in ipairs(params) do assert.are.same(saved[i], p.value:to_table()) end
    os.remove(path)
  end)

  it("passes forward options and input_grad = false through", function()
    local net = net_of(seed)
    local blk = net[3]
    local x = lutra.tensor({ 2, 4 }):randn(seed)
    local opts = { grad = false }
    net:forward(x, opts)
    assert.are.equal(opts, blk.seen_opts)
    net:forward(x, true)
    assert.are.equal(true, blk.seen_opts)
    net:zero_grad()
    assert.is_nil(net:backward(lutra.tensor({ 2, 3 }):fill(1), false))
    local g = net:parameters()[1].grad:to_table()
    local any = false
    for _, v in ipairs(g) do any = any or v ~= 0 end
    assert.is_true(any, "the first Linear got its weight gradient")
  end)

  it("runs Lua-only and nested Sequentials, and survives the garbage collector", function()
    local inner = nn.Sequential(Block(4, 8, { seed = seed }), Block(4, 8, { seed = seed + 5 }))
    local net = nn.Sequential(inner, nn.Linear(4, 2, { seed = seed }))
    collectgarbage()
    collectgarbage()
    local x = lutra.tensor({ 3, 4 }):randn(seed)
    local y = net:forward(x)
    assert.are.same({ 3, 2 }, y:dims())
    assert.are.same({ 3, 4 }, net:backward(lutra.tensor({ 3, 2 }):fill(1)):dims())
    assert.are.equal(2, #net)
    -- two blocks of a norm (2) and two Linears (4), and a Linear (2)
    assert.are.equal(14, #net:parameters())
  end)

  it("takes a plain table following the protocol (no nn.Module)", function()
    local calls = 0
    local ident = { forward = function(_, x) calls = calls + 1 return x end,
                    backward = function(_, dy) return dy end }
    local net = nn.Sequential(nn.Linear(3, 3, { seed = seed }), ident)
    local x = lutra.tensor({ 2, 3 }):randn(seed)
    assert.are.equal(0, max_diff(net:forward(x), net[1]:forward(x)))
    assert.are.equal(1, calls)
    assert.are.equal(2, #net:parameters())
    -- a Lua element without children keeps its place in the names: "2.weight", not "1.weight"
    local path = os.tmpname()
    lutra.save(path, { model = nn.Sequential(nn.Linear(3, 3), ident, nn.Linear(3, 2)) })
    local f = assert(io.open(path, "rb"))
    local head = f:read(4096)
    f:close()
    os.remove(path)
    assert.is_truthy(head:find('"2.weight"', 1, true))
    assert.is_nil(head:find('"1.weight"', 1, true))
  end)

  it("compiles a training loop through it to a LuaJIT trace (no NYI abort)", function()
    require("spec.support.jit_trace").assert_compiles("spec/support/jit_lua_module_loop.lua")
  end)

  describe("refuses bad protocol objects", function()
    it("a table without forward or backward", function()
      E.expect_error(function() nn.Sequential(nn.Linear(2, 2), {}) end, "lutra.nn.Sequential",
                     "argument 2 must be a module: a table without a forward method")
      E.expect_error(function() nn.Sequential({ forward = print }) end, "lutra.nn.Sequential",
                     "argument 1 must be a module: a table without a backward method")
    end)
    it("a value that is no module", function()
      E.expect_error(function() nn.Sequential(nn.Linear(2, 2), {}, 3) end, "lutra.nn.Sequential",
                     "without a forward method")
      E.expect_error(function() nn.Sequential(Block(2, 4), "x") end, "lutra.nn.Sequential",
                     "argument 2 must be a module (got \"x\")")
    end)
    it("children that are no modules", function()
      local bad = { forward = print, backward = print, children = function() return { 1 } end }
      E.expect_error(function() nn.Sequential(bad) end, "lutra.nn.Sequential",
                     "child 1 is not a module")
      local Cls = nn.Module("NoBackward")
      Cls.forward = print
      E.expect_error(function() Cls() end, "lutra.nn.Module(NoBackward)",
                     "without a backward method")
      E.expect_error(function() nn.Module(3) end, "lutra.nn.Module", "name must be a string")
    end)
    it("a module listed twice", function()
      local l = nn.Linear(2, 2)
      E.expect_error(function() nn.Sequential(l, Block(2, 4), l) end, "lutra.nn.Sequential",
                     "a module appears twice")
    end)
    it("children added after the module was used", function()
      local b = Block(2, 4)
      b:parameters()
      E.expect_error(function() b:add(nn.Linear(2, 2)) end, "lutra.nn.Module:add",
                     "children are fixed")
    end)
  end)
end)
