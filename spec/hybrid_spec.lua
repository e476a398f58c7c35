-- Hybrid quantizers (a role's rowwise and columnwise copies in two formats, TE's hybrid
-- quantizer: lutra.recipe.custom{input = {kind=, format=, columnwise_format=}}): each GEMM reads
-- the copy it needs, so with a fixed grad_output the forward output and dx equal those of the
-- plain recipe in the rowwise formats, and wgrad that of the plain recipe in the columnwise
-- ones, bit for bit; pairings FP8 GEMMs cannot run are refused at creation, per copy.
local lutra = require("lutra")
local nn = lutra.nn
local R = lutra.recipe

local function run(recipe)
  local lin = nn.Linear(64, 32, { seed = 5 })
  local x = lutra.tensor({ 32, 64 }):randn(6, 0, 2)
  local dy = lutra.tensor({ 32, 32 }):randn(7, 0, 0.1)
  local y = lutra.autocast { recipe = recipe }:run(function() return lin:forward(x):to_table() end)
  local dx = lin:backward(dy):to_table()
  local p = lin:parameters()
  return { y = y, dx = dx, wgrad = p[1].grad:to_table(), bgrad = p[2].grad:to_table() }, lin
end

local function cur(format, colfmt) return { kind = "current", format = format, columnwise_format = colfmt } end

describe("hybrid quantizers", function()
  it("read the rowwise format in fprop and dgrad, the columnwise one in wgrad", function()
    local hybrid = R.custom { input = cur("e4m3", "e5m2"), weight = cur("e4m3"),
                              grad_output = cur("e5m2", "e4m3") }
    local rowwise = R.custom { input = cur("e4m3"), weight = cur("e4m3"), grad_output = cur("e5m2") }
    local colwise = R.custom { input = cur("e5m2"), weight = cur("e4m3"), grad_output = cur("e4m3") }
    local h, lin = run(hybrid)
    local r, c = run(rowwise), run(colwise)
    assert.are.same(r.y, h.y)
    assert.are.same(r.dx, h.dx)
    assert.are.same(c.wgrad, h.wgrad)
    assert.are.same(r.bgrad, h.bgrad)
    -- the two plain recipes differ where the hybrid takes one or the other
    assert.are_not.same(r.wgrad, c.wgrad)
    assert.are_not.same(r.y, c.y)
    -- the rowwise quantizer is the module's quantizer(role)
    assert.are.equal("e4m3", lin:quantizer("input"):quantize(lutra.tensor({ 32, 64 }):randn(1)):dtype_name())
    -- a factory may choose hybrids too
    local f = R.custom { factory = function(role)
      if role == "input" then return cur("e4m3", "e5m2") end
      if role == "weight" then return cur("e4m3") end
      return cur("e5m2", "e4m3")
    end }
    assert.are.same(h, (run(f)))
  end)

  it("refuse E5M2 x E5M2 per GEMM and copy at creation", function()
    local ok, err = pcall(R.custom, { input = cur("e4m3", "e5m2"), weight = cur("e4m3"),
                                      grad_output = cur("e5m2") })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("grad_output and input (columnwise) cannot both be e5m2 (the wgrad GEMM", 1, true), err)
    ok, err = pcall(R.custom, { input = cur("e4m3"), weight = cur("e4m3", "e5m2"),
                                grad_output = cur("e5m2", "e4m3") })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("grad_output (rowwise) and weight (columnwise) cannot both be e5m2 (the dgrad GEMM", 1, true), err)
    -- the same formats the other way round run
    assert.is_not_nil(R.custom { input = cur("e4m3"), weight = cur("e5m2", "e4m3"),
                                 grad_output = cur("e5m2", "e4m3") })
    ok, err = pcall(R.custom, { input = cur("e4m3", "e3m4") })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("unknown columnwise_format 'e3m4'", 1, true), err)
  end)
end)
