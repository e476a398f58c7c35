-- Sequential's Linear+GELU fusion on the device against the CPU backend: the same MLP (same
-- seeds) on both, forward output, input gradient and every parameter gradient within NMSE
-- bounds (1e-6 for f32, 1e-4 for bf16; FP8: 1e-3, the CPU and cuBLASLt accumulate FP8 products
-- in another order), and the same fusion counts on both devices.
local lutra = require("lutra")
local nn, R = lutra.nn, lutra.recipe
local S = require("spec.gpu.support")
local DEV, REF, hold = S.DEV, S.REF, S.hold
local function test(name, fn) S.test(it, name, fn) end

local function mlp(device, dtype, IN, H, OUT, bias)
  local l1 = nn.Linear(IN, H, { dtype = dtype, device = device, seed = 21, bias = bias })
  local l2 = nn.Linear(H, OUT, { dtype = dtype, device = device, seed = 22, bias = bias })
  return hold(nn.Sequential(l1, nn.GELU(), l2)), { l1, l2 }
end

local CASES = {
  { name = "f32", dtype = "f32", bound = 1e-6 },
  { name = "bf16", dtype = "bf16", bound = 1e-4 },
  -- delayed scaling: gelu' goes into the first Linear's grad_output cast (with and without the
  -- bias gradient beside it in the same kernel)
  { name = "bf16, FP8 delayed scaling", dtype = "bf16", bound = 1e-3, recipe = function() return R.delayed {} end },
  { name = "bf16, FP8 delayed scaling, no biases", dtype = "bf16", bound = 1e-3, bias = false,
    recipe = function() return R.delayed {} end },
  { name = "bf16, FP8 block scaling", dtype = "bf16", bound = 1e-3, recipe = function() return R.block {} end },
}

describe("Sequential Linear+GELU fusion on " .. DEV, function()
  for _, case in ipairs(CASES) do
    test(case.name .. ": forward, backward and fusion counts match the CPU", function()
      local N, IN, H, OUT = 256, 128, 384, 128
      local seed = math.random(1, 2 ^ 30)
      local sa, pa = mlp(REF, case.dtype, IN, H, OUT, case.bias)
      local sb, pb = mlp(DEV, case.dtype, IN, H, OUT, case.bias)
      local xa = lutra.tensor({ N, IN }, case.dtype, REF):randn(seed)
      local xb = lutra.tensor({ N, IN }, case.dtype, DEV):randn(seed)
      local ga = lutra.tensor({ N, OUT }, case.dtype, REF):randn(seed + 1)
      local gb = lutra.tensor({ N, OUT }, case.dtype, DEV):randn(seed + 1)
      local ya, yb
      if case.recipe then
        local r = case.recipe()
        lutra.autocast { recipe = r }:run(function() ya = sa:forward(xa) end)
        lutra.autocast { recipe = r }:run(function() yb = sb:forward(xb) end)
      else
        ya, yb = sa:forward(xa), sb:forward(xb)
      end
      S.assert_nmse(yb, ya, case.bound, case.name .. ": output")
      local dxa, dxb = sa:backward(ga), sb:backward(gb)
      S.assert_nmse(dxb, dxa, case.bound, case.name .. ": input gradient")
      for i = 1, 2 do
        local qa, qb = pa[i]:parameters(), pb[i]:parameters()
        for j = 1, #qa do
          S.assert_nmse(qb[j].grad, qa[j].grad, case.bound,
                        string.format("%s: linear %d param %d grad", case.name, i, j))
        end
      end
      assert.are.same({ sa:fusions() }, { sb:fusions() }, "fusion counts")
      assert.are.equal(1, (sb:fusions()), "the forward fused its GELU")
      if case.name:match("delayed") then
        assert.are.equal(1, select(2, sb:fusions()), "gelu' went into the FP8 grad_output cast")
      end
    end)
  end
end)
