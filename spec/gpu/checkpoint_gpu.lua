-- Resume on the device under test (spec/gpu/support.lua's LUTRA_TEST_DEVICE): N steps, save,
-- load into fresh objects in a new process, N more steps gives the bytes of 2N steps straight,
-- for each recipe, f32 and bf16 parameters (AdamW masters; the on-device step count is saved
-- and restored), and SGD momentum. The control: a load without the optimizer differs.
local S = require("spec.gpu.support")
local resume = require("spec.support.resume")

local N = 3

describe("checkpoint resume on " .. S.DEV, function()
  -- if this fails, the device computes differently run to run (a reduction in atomics, a GEMM
  -- algorithm chosen differently) and the resume comparisons below cannot hold either
  S.test(it, "rests on runs that repeat: two straight runs write the same bytes", function()
    for _, recipe in ipairs { "delayed", "mxfp8" } do
      local a, b = resume.straight_twice(S.DEV, recipe, "bf16", "adamw", 2 * N)
      assert.is_true(a == b, "two straight runs differ under " .. recipe)
    end
  end)

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

  S.test(it, "writes files the cpu loads: a model trained on the device, loaded on the cpu",
         function()
    local lutra = require("lutra")
    lutra.manual_seed(31)
    local dev = lutra.nn.Sequential(lutra.nn.Linear(32, 64, { device = S.DEV }), lutra.nn.GELU(),
                                    lutra.nn.Linear(64, 16, { device = S.DEV }))
    local opt = lutra.optim.AdamW(dev)
    local x, t = lutra.tensor({ 16, 32 }, "f32", S.DEV), lutra.tensor({ 16, 16 }, "f32", S.DEV)
    x:randn()
    t:randn()
    local loss = lutra.nn.MSELoss()
    loss:forward(dev:forward(x), t)
    dev:backward(loss:backward())
    opt:step()
    local file = os.tmpname()
    lutra.save(file, { model = dev, optim = opt })
    local cpu = lutra.nn.Sequential(lutra.nn.Linear(32, 64, { device = "cpu" }), lutra.nn.GELU(),
                                    lutra.nn.Linear(64, 16, { device = "cpu" }))
    local copt = lutra.optim.AdamW(cpu)
    lutra.load(file, { model = cpu, optim = copt })
    os.remove(file)
    local a, b = dev:parameters(), cpu:parameters()
    for i = 1, #a do assert.is_true(a[i].value:bytes() == b[i].value:bytes()) end
    assert.are.same({ 1, 1 }, { copt:steps() })
    assert.are.same({ 1, 1 }, { opt:steps() })
  end)

  S.test(it, "differs when the optimizer is left out of the load (control)", function()
    local r = resume.compare(S.DEV, "delayed", "bf16", "adamw", N, "optim")
    assert.is_false(r.straight == r.resumed)
  end)
end)
