-- Misuse that used to fail far from its cause (issue 40): reshaping a tensor a module, quantizer
-- or loss owns (the next forward or backward then failed with an unrelated shape error), and
-- scope:run with something that is not a function ("attempt to call a number value"). Each is
-- refused at the call, naming it and the reason, and changes nothing.
local lutra = require("lutra")
local ffi = require("ffi")
local C = require("lutra.core").C
local E = require("spec.support.errors")

describe("reshaping an owned tensor", function()
  local in_f, out_f, rows = 8, 6, 4
  local function setup()
    local m = lutra.nn.Linear(in_f, out_f, { seed = math.random(1, 2 ^ 30) })
    local x = lutra.tensor({rows, in_f}):randn(math.random(1, 2 ^ 30))
    local target = lutra.tensor({rows, out_f}):randn(math.random(1, 2 ^ 30))
    local loss = lutra.nn.MSELoss()
    return m, x, target, loss
  end

  it("is refused for a module's weight, output and gradients, naming the owner", function()
    local m, x, target, loss = setup()
    local y = m:forward(x)
    local lv = loss:forward(y, target)
    local dy = loss:backward()
    m:backward(dy)
    local p = m:parameters()[1]
    for _, case in ipairs({ { p.value, "module linear" }, { p.grad, "module linear" },
                            { y, "module linear" }, { dy, "a loss" }, { lv, "a loss" } }) do
      local t, owner = case[1], case[2]
      local shape = t:dims()
      local e = E.expect_error(function() t:reshape({ t:size() }) end, "tensor:reshape",
                               "the tensor is owned by " .. owner)
      assert.matches("copy it first", e, 1, true)
      assert.are.same(shape, t:dims()) -- unchanged
    end
    -- the C call refuses it too (hosts without the front)
    local shape = ffi.new("int64_t[1]", out_f * in_f)
    assert.are.equal(C.LUTRA_ESTATE, C.lutra_tensor_reshape(p.value, 1, shape))
    assert.matches("lutra_tensor_reshape: tensor is owned by a module, quantizer or loss",
                   ffi.string(C.lutra_last_error()), 1, true)
    -- and the next step runs as before the attempts: the same loss from the same weights
    local before = loss:value()
    local y2 = m:forward(x)
    loss:forward(y2, target)
    assert.are.equal(before, loss:value())
    m:backward(loss:backward())
  end)

  it("still works on a copy of its own", function()
    local m, x = setup()
    local y = m:forward(x)
    local mine = lutra.tensor({rows, out_f}):copy(y)
    mine:reshape({ rows * out_f })
    assert.are.same({ rows * out_f }, mine:dims())
    assert.are.same(y:to_table(), mine:to_table())
  end)
end)

describe("scope:run", function()
  for _, bad in ipairs({ 5, "f", {}, true }) do
    it("refuses a " .. type(bad) .. " for its function, leaving the scope depth as it was", function()
      local scope = lutra.autocast({ recipe = lutra.recipe.delayed() })
      local depth = lutra.autocast_state()
      E.expect_error(function() scope:run(bad) end, "scope:run",
                     "argument 1 must be a function, got " .. type(bad))
      assert.are.equal(depth, lutra.autocast_state())
      -- the scope is not left entered: it runs a function afterwards
      assert.are.equal(7, scope:run(function(a, b) return a + b end, 3, 4))
    end)
  end

  it("runs a callable table", function()
    local scope = lutra.autocast({ recipe = lutra.recipe.delayed() })
    local f = setmetatable({}, { __call = function(_, v) return v * 2 end })
    assert.are.equal(10, scope:run(f, 5))
  end)
end)
