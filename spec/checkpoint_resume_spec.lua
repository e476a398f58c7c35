-- Resume is exact: N steps, save, load into freshly built objects in a NEW process, N more
-- steps gives bit-for-bit the state of 2N steps straight (the final checkpoints' bytes: every
-- parameter, FP8 scale and amax history, optimizer moment and master, step count and the
-- generator), on the CPU backend, for each recipe, f32 and bf16 parameters (bf16: AdamW's f32
-- masters), AdamW and SGD with momentum. Each step's data is drawn from the global generator, so
-- the generator's state matters too. Controls: leaving the generator, the optimizer or (delayed
-- scaling, the one recipe whose quantizers carry state across steps) the FP8 state out of the
-- load makes the resumed run differ, so the comparison can fail.
local resume = require("spec.support.resume")

local N = 3

describe("checkpoint resume in a new process", function()
  for _, dtype in ipairs { "f32", "bf16" } do
    for _, recipe in ipairs { "none", "delayed", "current", "mxfp8", "block" } do
      it(string.format("is bit-identical to a straight run: %s, recipe %s, AdamW", dtype, recipe),
         function()
        local r = resume.compare("cpu", recipe, dtype, "adamw", N)
        assert.are.equal(2 * N, #r.straight_losses)
        assert.are.same(r.straight_losses, r.resumed_losses)
        assert.is_true(#r.straight > 1000)
        assert.is_true(r.straight == r.resumed, "the final states differ")
      end)
    end
  end

  it("is bit-identical with SGD momentum under delayed scaling, bf16", function()
    local r = resume.compare("cpu", "delayed", "bf16", "sgd", N)
    assert.are.same(r.straight_losses, r.resumed_losses)
    assert.is_true(r.straight == r.resumed, "the final states differ")
  end)

  for _, case in ipairs { { "rng", "current" }, { "optim", "mxfp8" }, { "fp8", "delayed" } } do
    it("differs when the load leaves out " .. case[1] .. " (control, " .. case[2] .. ")", function()
      local r = resume.compare("cpu", case[2], "bf16", "adamw", N, case[1])
      assert.is_false(r.straight == r.resumed)
    end)
  end
end)
