-- Recipe prototyping on the device against the CPU backend: a factory recipe (per-module
-- choices), hybrid quantizers, the backward overrides and per-GEMM accumulation settings must
-- give the CPU's outputs and gradients up to GEMM accumulation order (NMSE 1e-4; FP8 codes can
-- flip where an activation lands on a rounding boundary: a few such steps in dx came to 1.3e-5 on
-- the H200, which the bound allows).
local lutra = require("lutra")
local nn = lutra.nn
local R = lutra.recipe
local S = require("spec.gpu.support")
local DEV, REF = S.DEV, S.REF
local function test(name, fn) S.test(it, name, fn) end

local function cur(format, colfmt) return { kind = "current", format = format, columnwise_format = colfmt } end

local function run(device, recipe)
  local l1 = S.hold(nn.Linear(64, 128, { seed = 5, device = device, name = "body" }))
  local l2 = S.hold(nn.Linear(128, 32, { seed = 6, device = device, name = "head" }))
  local net = S.hold(nn.Sequential(l1, nn.GELU(), l2))
  local x = lutra.tensor({ 64, 64 }, "f32", device):randn(6, 0, 2)
  local dy = lutra.tensor({ 64, 32 }, "f32", device):randn(7, 0, 0.1)
  local y = lutra.autocast { recipe = recipe }:run(function() return net:forward(x) end)
  local out = { y = S.keep(y) }
  out.dx = S.keep(net:backward(dy))
  out.w1 = S.keep(l1:parameters()[1].grad)
  out.w2 = S.keep(l2:parameters()[1].grad)
  return out
end

local cases = {
  { "factory (head in high precision)", function()
    return R.custom { factory = function(role, _, name)
      if name == "head" then return { kind = "none" } end
      return cur(role == "grad_output" and "e5m2" or "e4m3")
    end }
  end },
  { "hybrid input and gradient", function()
    return R.custom { input = cur("e4m3", "e5m2"), weight = cur("e4m3"), grad_output = cur("e5m2", "e4m3") }
  end },
  { "backward_override high_precision", function() return R.delayed { backward_override = "high_precision" } end },
  { "backward_override dequantized", function() return R.block { backward_override = "dequantized" } end },
  { "split accumulation everywhere", function()
    return R.current { gemm = { fprop = { use_split_accumulator = true } } }
  end },
  { "fast accumulation everywhere", function()
    return R.current { gemm = { dgrad = { use_split_accumulator = false },
                                wgrad = { use_split_accumulator = false } } }
  end },
}

describe("recipe prototyping on " .. DEV, function()
  for _, c in ipairs(cases) do
    test(c[1] .. ": outputs and gradients as the CPU's", function()
      local want, got = run(REF, c[2]()), run(DEV, c[2]())
      for _, k in ipairs { "y", "dx", "w1", "w2" } do
        S.assert_nmse(got[k], want[k], 1e-4, c[1] .. " " .. k)
      end
    end)
  end
end)
