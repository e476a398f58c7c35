-- backward(dy, false): the input's gradient is not wanted (the input is data, as a tensor
-- without requires_grad in PyTorch). The first module skips the work only the input gradient
-- needs (a Linear's dgrad GEMM: no plan is made for it); every parameter gradient must come out
-- bit for bit as with backward(dy). Two identical nets (same seeds), fresh random inputs, CPU
-- backend.
local lutra = require("lutra")
local nn, R = lutra.nn, lutra.recipe

local function build(kind)
  local function lin(i, o, seed) return nn.Linear(i, o, { dtype = "f32", seed = seed }) end
  if kind == "linear" then return nn.Sequential(lin(32, 16, 1)) end
  if kind == "gelu first" then return nn.Sequential(nn.GELU(), lin(32, 16, 2)) end
  return nn.Sequential(lin(32, 64, 3), nn.GELU(), lin(64, 48, 4), nn.GELU(), lin(48, 16, 5))
end

local function same_bits(a, b, what)
  local x, y = a:to_table(), b:to_table()
  assert.are.equal(#x, #y, what)
  for i = 1, #x do
    if x[i] ~= y[i] then error(string.format("%s: element %d differs: %.9g vs %.9g", what, i, x[i], y[i])) end
  end
end

describe("backward without the input gradient", function()
  for _, kind in ipairs { "linear", "gelu first", "mlp" } do
    for _, recipe in ipairs { "none", "delayed" } do
      it(string.format("gives the same parameter gradients (%s, %s)", kind, recipe), function()
        local a, b = build(kind), build(kind)
        local seed = math.random(1, 2 ^ 30)
        local x = lutra.tensor({ 16, 32 }, "f32"):randn(seed)
        local dy = lutra.tensor({ 16, 16 }, "f32"):randn(seed + 1)
        local function fwd(net)
          if recipe == "none" then return net:forward(x) end
          local y
          lutra.autocast { recipe = R.delayed {} }:run(function() y = net:forward(x) end)
          return y
        end
        fwd(a)
        fwd(b)
        assert.is_not_nil(a:backward(dy))
        assert.is_nil(b:backward(dy, false))
        local pa, pb = a:parameters(), b:parameters()
        assert.are.equal(#pa, #pb)
        for i = 1, #pa do same_bits(pa[i].grad, pb[i].grad, "parameter " .. i .. " grad") end
      end)
    end
  end

  it("runs no dgrad GEMM: its plan is made only when a gradient is asked for", function()
    -- shapes no other spec uses, so every plan this test needs is new to the (global) cache
    local lin = nn.Linear(104, 120, { dtype = "f32", seed = 9 })
    local x = lutra.tensor({ 24, 104 }, "f32"):randn(10)
    local dy = lutra.tensor({ 24, 120 }, "f32"):randn(11)
    local p0 = lutra.gemm_cache_stats()
    lin:forward(x)
    lin:backward(dy, false)
    local p1 = lutra.gemm_cache_stats()
    assert.are.equal(2, p1 - p0, "the forward and wgrad GEMMs' plans only")
    lin:backward(dy)
    assert.are.equal(1, lutra.gemm_cache_stats() - p1, "the dgrad GEMM's plan, made now")
  end)

  it("leaves a later backward with the input gradient correct", function()
    local a, b = build("mlp"), build("mlp")
    local x = lutra.tensor({ 16, 32 }, "f32"):randn(7)
    local dy = lutra.tensor({ 16, 16 }, "f32"):randn(8)
    a:forward(x)
    b:forward(x)
    b:backward(dy, false)
    same_bits(b:backward(dy), a:backward(dy), "input gradient")
  end)
end)
