-- Resume on the device under test (spec/gpu/support.lua's LUTRA_TEST_DEVICE): N steps, save,
-- load into fresh objects in a new process, N more steps gives the bytes of 2N steps straight,
-- for each recipe, f32 and bf16 parameters (AdamW masters; the on-device step count is saved
-- and restored), and SGD momentum. The control: a load without the optimizer differs.
local S = require("spec.gpu.support")
local resume = require("spec.support.resume")

local N = 3

describe("checkpoint resume on " .. S.DEV, function()
  for _, dtype in ipairs { "f32", "bf16" } do
    for _, recipe in ipairs { "none", "delayed", "current", "mxfp8", "block" } do
      S.test(it, string.format("is bit-identical to a straight run: %s, recipe %s", dtype, recipe),
             function()
        local r = resume.compare(S.DEV, recipe, dtype, "adamw", N)
        assert.are.equal(2 * N, #r.straight_losses)
        assert.are.same(r.straight_losses, r.resumed_losses)
        assert.is_true(r.straight == r.resumed, "the final states differ")
      end)
    end
  end

  S.test(it, "is bit-identical with SGD momentum, bf16, delayed", function()
    local r = resume.compare(S.DEV, "delayed", "bf16", "sgd", N)
    assert.is_true(r.straight == r.resumed, "the final states differ")
  end)

  S.test(it, "differs when the optimizer is left out of the load (control)", function()
    local r = resume.compare(S.DEV, "delayed", "bf16", "adamw", N, "optim")
    assert.is_false(r.straight == r.resumed)
  end)
end)
