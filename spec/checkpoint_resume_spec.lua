-- Resume is exact: N steps, save, load into freshly built objects in a NEW process, N more
-- steps gives bit-for-bit the state of 2N steps straight (the final checkpoints' bytes: every
-- parameter, FP8 scale and amax history, optimizer moment and master, step count and the
-- generator), on the CPU backend, for each recipe, f32 and bf16 parameters (bf16: AdamW's f32
-- masters), AdamW and SGD with momentum. Each step's data is drawn from the global generator, so
-- the generator's state matters too. Controls: leaving the generator, the optimizer or (delayed
-- scaling, the one recipe whose quantizers carry state across steps) the FP8 state out of the
-- load makes the resumed run differ, so the comparison can fail. The same for the models made of
-- the other module kinds (pre-norm block, LayerNormLinear, GroupedLinear), and NVFP4 with
-- stochastic rounding (the quantizers' counts of quantizations seed it).
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

  -- NVFP4 with stochastic rounding of grad_output: each quantization's seed comes from the
  -- quantizer's count of quantizations, which the file carries (<m>.fp8.<role>.quantizations)
  for _, dtype in ipairs { "f32", "bf16" } do
    it("is bit-identical to a straight run: " .. dtype .. ", recipe nvfp4 (stochastic rounding)",
       function()
      local r = resume.compare("cpu", "nvfp4", dtype, "adamw", N)
      assert.are.equal(2 * N, #r.straight_losses)
      assert.are.same(r.straight_losses, r.resumed_losses)
      assert.is_true(r.straight == r.resumed, "the final states differ")
    end)
  end

  -- every module kind's checkpoint entry (spec/support/resume_run.lua's models): the pre-norm
  -- block (Residual, LayerNormMLP swiglu with RMSNorm, RMSNorm, Linear), a LayerNormLinear, a
  -- GroupedLinear whose experts each keep their own amax histories
  for _, case in ipairs { { "prenorm", "delayed", "f32" }, { "prenorm", "mxfp8", "f32" },
                          { "prenorm", "delayed", "bf16" }, { "lnl", "current", "f32" },
                          { "grouped", "delayed", "f32" }, { "grouped", "delayed", "bf16" } } do
    it(string.format("is bit-identical to a straight run: %s model, %s, recipe %s, AdamW%s",
                     case[1], case[3], case[2], case[3] == "bf16" and " (f32 masters)" or ""),
       function()
      local r = resume.compare("cpu", case[2], case[3], "adamw", N, nil, case[1])
      assert.are.equal(2 * N, #r.straight_losses)
      assert.are.same(r.straight_losses, r.resumed_losses)
      assert.is_true(#r.straight > 1000)
      assert.is_true(r.straight == r.resumed, "the final states differ")
    end)
  end

  for _, model in ipairs { "prenorm", "grouped" } do
    it("differs when the load leaves out the FP8 state (control, " .. model .. ", delayed)",
       function()
      local r = resume.compare("cpu", "delayed", "f32", "adamw", N, "fp8", model)
      assert.is_false(r.straight == r.resumed)
    end)
  end

  for _, case in ipairs { { "rng", "current" }, { "optim", "mxfp8" }, { "fp8", "delayed" } } do
    it("differs when the load leaves out " .. case[1] .. " (control, " .. case[2] .. ")", function()
      local r = resume.compare("cpu", case[2], "bf16", "adamw", N, case[1])
      assert.is_false(r.straight == r.resumed)
    end)
  end
end)
