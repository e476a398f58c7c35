-- bf16 parameters keep an f32 master copy in the optimizer: a weight written through the API
-- after the optimizer exists must reach that copy, or the next step would write the stale master
-- back over it.
local lutra = require("lutra")
local nn = lutra.nn

describe("optimizer master copies", function()
  for _, kind in ipairs { "AdamW", "SGD" } do
    it(kind .. ": a bf16 weight set after the optimizer exists survives the next step", function()
      local m = nn.Linear(16, 8, { dtype = "bf16", seed = 3 })
      local opt = lutra.optim[kind](m, { lr = 0, weight_decay = 0 })
      local W = m:parameters()[1].value
      opt:step() -- lr 0: the weights stay what the master holds
      local fresh = lutra.tensor({ 8, 16 }, "bf16"):randn(11)
      W:copy(fresh)
      local want = W:to_table()
      opt:step()
      assert.are.same(want, W:to_table())
      -- set and fill reach it too
      W:fill(0.25)
      opt:step()
      for _, v in ipairs(W:to_table()) do assert.are.equal(0.25, v) end
    end)
  end
end)

describe("accumulate_main_grad", function()
  it("refuses a second backward of one forward (it would add the gradients twice)", function()
    local E = require("spec.support.errors")
    local m = nn.Linear(16, 16, { accumulate_main_grad = true, seed = 4 })
    local x = lutra.tensor({ 16, 16 }):randn(5)
    local dy = lutra.tensor({ 16, 16 }):randn(6)
    m:forward(x)
    m:backward(dy)
    local mg = m:parameters()[1].main_grad:to_table()
    E.expect_error(function() m:backward(dy) end, "lutra_linear_backward", "main_grad twice")
    assert.are.same(mg, m:parameters()[1].main_grad:to_table())
    m:forward(x)
    m:backward(dy) -- a new forward: accumulates once more
    local twice = m:parameters()[1].main_grad:to_table()
    for i = 1, #mg do assert.is_true(math.abs(twice[i] - 2 * mg[i]) <= 1e-5 * (1 + math.abs(mg[i]))) end
  end)
end)
