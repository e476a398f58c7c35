-- print(module) and Sequential indexing: the tree every module kind prints (kind, shapes, dtype,
-- device), seq[i] and #seq, the lifetime of child handles, and the bad inputs of the C calls
-- behind them.
local lutra = require("lutra")
local nn = lutra.nn
local ffi = require("ffi")
local C = lutra.C

local function full_gc() collectgarbage() collectgarbage() end

describe("print(module)", function()
  it("shows every module kind with its shapes, dtype and device, nested Sequentials indented", function()
    local s = nn.Sequential(nn.LayerNorm(64, { dtype = "bf16" }), nn.Linear(64, 256, { dtype = "bf16" }),
                            nn.SwiGLU(), nn.Sequential(nn.Linear(128, 10, { bias = false }), nn.RMSNorm(10)),
                            nn.ReLU(), nn.SiLU(), nn.QuickGELU(), nn.SquaredReLU(), nn.GELU(),
                            nn.GELU { approximate = "none" }, nn.GeGLU(), nn.ReGLU(), nn.Tanh())
    local want = table.concat({
      "lutra.nn.Sequential(",
      "  (1): lutra.nn.layernorm([64] [64], bf16, cpu)",
      "  (2): lutra.nn.Linear(in=64, out=256, bias=true, bf16, cpu)",
      "  (3): lutra.nn.swiglu",
      "  (4): lutra.nn.Sequential(",
      "    (1): lutra.nn.Linear(in=128, out=10, bias=false, f32, cpu)",
      "    (2): lutra.nn.rmsnorm([10], f32, cpu)",
      "  )",
      "  (5): lutra.nn.relu",
      "  (6): lutra.nn.silu",
      "  (7): lutra.nn.quick_gelu",
      "  (8): lutra.nn.squared_relu",
      "  (9): lutra.nn.gelu",
      "  (10): lutra.nn.gelu_erf",
      "  (11): lutra.nn.geglu",
      "  (12): lutra.nn.reglu",
      "  (13): lutra.nn.tanh",
      ")" }, "\n")
    assert.are.equal(want, tostring(s))
  end)

  it("says when a module's parameters were freed", function()
    local l = nn.Linear(8, 8)
    l:destroy()
    assert.are.equal("lutra.nn.module(freed)", tostring(l))
    local s = nn.Sequential(nn.ReLU())
    s:destroy()
    assert.are.equal("lutra.nn.module(freed)", tostring(s))
  end)
end)

describe("Sequential indexing", function()
  it("seq[i] is the i-th module (1-based) and #seq the count", function()
    local l1, l2 = nn.Linear(16, 32, { seed = 1 }), nn.Linear(32, 8, { seed = 2 })
    local s = nn.Sequential(l1, nn.ReLU(), l2)
    assert.are.equal(3, #s)
    assert.are.equal("linear", s[1]:kind())
    assert.are.equal("relu", s[2]:kind())
    -- the same module: its parameters are the same tensors
    local x = lutra.tensor({ 4, 16 }):randn(3)
    assert.are.same(l1:forward(x):to_table(), s[1]:forward(x):to_table())
    assert.are.equal(ffi.cast("void *", l2:parameters()[1].value.data),
                     ffi.cast("void *", s[3]:parameters()[1].value.data))
  end)

  it("refuses an index outside 1..#seq and non-integers, naming the range", function()
    local s = nn.Sequential(nn.ReLU(), nn.SiLU())
    for _, i in ipairs { 0, 3, -1, 1.5 } do
      local ok, err = pcall(function() return s[i] end)
      assert.is_false(ok)
      assert.matches("lutra.nn.Sequential: index " .. tostring(i) .. " is out of range 1..2", err, 1, true)
    end
    -- a method name still resolves; an unknown key is an error naming the kind and the key
    assert.is_function(s.forward)
    local ok, err = pcall(function() return s.no_such_method end)
    assert.is_false(ok)
    assert.matches("Sequential has no method 'no_such_method'", err, 1, true)
  end)

  it("a child handle keeps the Sequential alive through garbage collection", function()
    local child
    do
      local s = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 4), nn.ReLU()))
      child = s[2][1]
    end
    full_gc()
    local y = child:forward(lutra.tensor({ 2, 8 }):randn(1))
    assert.are.equal(8, #y:to_table())
    assert.are.equal("lutra.nn.Linear(in=8, out=4, bias=true, f32, cpu)", tostring(child))
  end)

  it("a child stays usable after the Sequential is freed; the freed Sequential refuses indexing", function()
    local s = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    local c = s[1]
    s:destroy()
    assert.are.equal(4 * 8, #c:forward(lutra.tensor({ 4, 8 }):randn(2)):to_table())
    local ok, err = pcall(function() return #s end)
    assert.is_false(ok)
    assert.matches("lutra_sequential_count: module was freed", err, 1, true)
  end)

  it("an indexed Sequential nests, trains with an optimizer and captures nothing extra", function()
    local inner = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    local s = nn.Sequential(inner, nn.Linear(8, 2))
    local opt = lutra.optim.SGD(s, { lr = 0.1 })
    local x = lutra.tensor({ 4, 8 }):randn(5)
    s:forward(x)
    s:backward(lutra.tensor({ 4, 2 }):randn(6))
    opt:step()
    assert.are.equal(2, #s[1])
  end)
end)

describe("bad inputs of the inspection calls", function()
  local box = ffi.new("lutra_module*[1]")
  local tbox = ffi.new("lutra_tensor*[1]")
  local ibox = ffi.new("int[1]")
  local function refused(st, msg)
    assert.are_not.equal(0, st)
    assert.matches(msg, ffi.string(C.lutra_last_error()), 1, true)
  end
  it("name the call and the reason", function()
    local l, s = nn.Linear(4, 4), nn.Sequential(nn.ReLU())
    refused(C.lutra_sequential_count(l, ibox), "lutra_sequential_count: module is a linear, not a sequential")
    refused(C.lutra_sequential_count(s, nil), "lutra_sequential_count: n is NULL")
    refused(C.lutra_sequential_count(nil, ibox), "lutra_sequential_count")
    refused(C.lutra_sequential_child(s, 1, box), "lutra_sequential_child: index 1 is out of range 0..0")
    refused(C.lutra_sequential_child(s, -1, box), "lutra_sequential_child: index -1 is out of range 0..0")
    refused(C.lutra_sequential_child(s, 0, nil), "lutra_sequential_child: out is NULL")
    refused(C.lutra_linear_quantized(s, C.LUTRA_ROLE_INPUT, tbox),
            "lutra_linear_quantized: module is a sequential, not a linear")
    refused(C.lutra_linear_quantized(l, C.LUTRA_ROLE_GRAD_OUTPUT, tbox),
            "lutra_linear_quantized: role 2 is not the input's or the weight's")
    refused(C.lutra_linear_quantized(l, C.LUTRA_ROLE_INPUT, nil), "lutra_linear_quantized: out is NULL")
    -- in high precision there is no quantized tensor
    l:forward(lutra.tensor({ 4, 4 }):randn(1))
    assert.is_nil(l:quantized("input"))
  end)
end)
