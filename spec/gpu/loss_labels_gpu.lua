-- Cross-entropy labels outside [0, classes) on the device: the kernel cannot return an error, so
-- it sets a device flag and the next host read of the loss (loss:value()) raises it; the CPU
-- refuses such labels at the forward. After the error the flag is clear, and a forward with good
-- labels reads normally.
local lutra = require("lutra")
local nn = lutra.nn
local S = require("spec.gpu.support")
local E = require("spec.support.errors")
local DEV = S.DEV
local function test(name, fn) S.test(it, name, fn) end

describe("cross-entropy labels on " .. DEV, function()
  test("an out-of-range label is an error at loss:value(), and the flag clears", function()
    local logits = lutra.tensor({ 4, 8 }, "f32", DEV):randn(3)
    local bad = lutra.from_table({ 1, 9, 2, 3 }, { 4 }, "i32", DEV)
    local good = lutra.from_table({ 1, 7, 2, 0 }, { 4 }, "i32", DEV)
    local loss = nn.CrossEntropyLoss()
    if DEV == "cpu" then
      E.expect_error(function() loss:forward(logits, bad) end, "lutra_loss_forward", "label")
      return
    end
    loss:forward(logits, bad) -- queued: no synchronization here
    E.expect_error(function() loss:value() end, "lutra_loss_value", "outside [0, 8)")
    local v = loss:value() -- the flag was cleared by the read that reported it
    assert.is_true(v ~= v, "the loss of the bad batch is NaN")
    loss:forward(logits, good)
    local ok = loss:value()
    assert.is_true(ok == ok and ok > 0)
    -- negative labels too
    loss:forward(logits, lutra.from_table({ -1, 0, 0, 0 }, { 4 }, "i32", DEV))
    E.expect_error(function() loss:value() end, "lutra_loss_value", "outside")
  end)
end)
