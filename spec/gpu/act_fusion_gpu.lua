-- Every activation kind inside its FP8 neighbours' casts on the device against the CPU backend:
-- Sequential(Linear, act, Linear) with the same seeds on both, forward output, input gradient
-- and every parameter gradient within NMSE bounds, and the same fusion counts on both devices.
-- The per-tensor recipes (delayed, and current with an amax pass over the activation's values)
-- take the fused paths (act inside the second Linear's input cast, act' and
-- the bias gradient inside the first Linear's grad_output cast, both in the tiled cast kernel,
-- the second with its transpose; the inference forward writes the rowwise codes only); the
-- block recipes run the activation's kernels and must count no cast fusion on either device.
-- Bounds: f32 modules 1e-4 and bf16 1e-3 under FP8 (the CPU and cuBLASLt accumulate the FP8
-- products in another order, and the sigmoid / erf kinds round expf / erff a few ulps off libm,
-- so an FP8 code can move by one step; two FP8 Linears in a chain, the second's E5M2 gradient
-- codes a quarter of a value apart, put a handful of such steps at 2-6e-5 on the H200, in the
-- unfused current-scaling path as much as in the fused one); 1e-6 / 1e-4 in high precision.
local lutra = require("lutra")
local nn, R = lutra.nn, lutra.recipe
local S = require("spec.gpu.support")
local DEV, REF, hold = S.DEV, S.REF, S.hold
local function test(name, fn) S.test(it, name, fn) end

-- kink: ReLU's kinds, where a pre-activation within the two backends' accumulation difference
-- of 0 takes the other branch on one side and moves that gate's gradient by a whole dy b (seen:
-- reglu, current, f32 on an H100: one such element put 1.36e-4 on the input gradient, 2026-12-06);
-- their f32 bound is 3e-4, a few such flips, the others' stays 1e-4
local KINDS = {
  { name = "relu", make = nn.ReLU, kink = true },
  { name = "silu", make = nn.SiLU },
  { name = "qgelu", make = nn.QuickGELU },
  { name = "srelu", make = nn.SquaredReLU, kink = true },
  { name = "tanh", make = nn.Tanh },
  { name = "gelu_erf", make = function() return nn.GELU { approximate = "none" } end },
  { name = "swiglu", make = nn.SwiGLU, gated = true },
  { name = "geglu", make = nn.GeGLU, gated = true },
  { name = "reglu", make = nn.ReGLU, gated = true, kink = true },
  { name = "gelu_tanh", make = nn.GELU, epilogue = true },
}

local RECIPES = {
  { name = "delayed", make = function() return R.delayed {} end, fuses = true },
  { name = "current", make = function() return R.current {} end, fuses = true },
  { name = "mxfp8", make = function() return R.mxfp8 {} end },
}

local function mlp(kind, device, dtype, IN, H, OUT)
  local l1 = nn.Linear(IN, kind.gated and 2 * H or H, { dtype = dtype, device = device, seed = 31 })
  local l2 = nn.Linear(H, OUT, { dtype = dtype, device = device, seed = 32 })
  return hold(nn.Sequential(l1, kind.make(), l2)), { l1, l2 }
end

local function run(kind, rec, dtype, grad)
  local N, IN, H, OUT = 256, 128, 192, 128
  local seed = math.random(1, 2 ^ 30)
  local sa, pa = mlp(kind, REF, dtype, IN, H, OUT)
  local sb, pb = mlp(kind, DEV, dtype, IN, H, OUT)
  local xa = lutra.tensor({ N, IN }, dtype, REF):randn(seed)
  local xb = lutra.tensor({ N, IN }, dtype, DEV):randn(seed)
  local ya, yb
  local opts = { grad = grad }
  local r = rec.make()
  lutra.autocast { recipe = r }:run(function() ya = sa:forward(xa, opts) end)
  lutra.autocast { recipe = r }:run(function() yb = sb:forward(xb, opts) end)
  local bound = dtype == "f32" and (kind.kink and 3e-4 or 1e-4) or 1e-3
  local tag = string.format("%s %s %s", kind.name, rec.name, dtype)
  S.assert_nmse(yb, ya, bound, tag .. ": output")
  if grad then
    local ga = lutra.tensor({ N, OUT }, dtype, REF):randn(seed + 1)
    local gb = lutra.tensor({ N, OUT }, dtype, DEV):randn(seed + 1)
    local dxa, dxb = sa:backward(ga), sb:backward(gb)
    S.assert_nmse(dxb, dxa, bound, tag .. ": input gradient")
    for i = 1, 2 do
      local qa, qb = pa[i]:parameters(), pb[i]:parameters()
      for j = 1, #qa do
        S.assert_nmse(qb[j].grad, qa[j].grad, bound, string.format("%s: linear %d param %d grad", tag, i, j))
      end
    end
  end
  assert.are.same({ sa:fusions() }, { sb:fusions() }, tag .. ": fusion counts")
  local want = (kind.epilogue or rec.fuses) and 1 or 0
  assert.are.equal(want, (sb:fusions()), tag .. ": forward fusions")
  if grad then assert.are.equal(rec.fuses and 1 or 0, select(2, sb:fusions()), tag .. ": backward fusions") end
end

describe("activations inside the FP8 casts on " .. DEV, function()
  for _, kind in ipairs(KINDS) do
    for _, rec in ipairs(RECIPES) do
      for _, dtype in ipairs { "bf16", "f32" } do
        test(string.format("%s, %s, %s: training step matches the CPU", kind.name, rec.name, dtype), function()
          run(kind, rec, dtype, true)
        end)
      end
    end
    test(kind.name .. ", delayed, bf16: inference forward (rowwise codes only) matches the CPU", function()
      run(kind, RECIPES[1], "bf16", false)
    end)
  end
end)
