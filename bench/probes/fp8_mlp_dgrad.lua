-- Does cuBLASLt run the FP8 MLP's dgrad with its DGELU epilogue here, and what does each way of
-- forming the first Linear's FP8 grad_output cost: GPT-2's FC2 dgrad (dy [M, 768] E5M2 x W [768,
-- 3072] E4M3 -> bf16 [M, 3072]) plain, with DGELU and with DGELU_BGRAD; the cast of its output
-- with and without the bias gradient; then Sequential(Linear, GELU, Linear) forward + backward
-- under delayed HYBRID scaling, whose fusions say which path ran (the derivative in the dgrad
-- GEMM, or in the first Linear's grad_output cast where the plan declines it).
--   LUTRA_LOG_PLANS=1 luajit bench/probes/fp8_mlp_dgrad.lua [M]     (the plans' paths on stderr)
--   luajit bench/probes/fp8_mlp_dgrad.lua M mlp                     (the MLP only: any library)
-- Run it with two libraries (LUTRA_LIB) to compare the MLP step before and after a change.
-- Medians of 7 runs of 20 calls (bench/support/timing.lua); DEVICE=cpu for a dry run.
local lutra = require("lutra")
local T = require("bench.support.timing")
local R = lutra.recipe
local DEVICE = os.getenv("DEVICE") or "cuda"
local M, K, N = tonumber(arg[1] or 16384), 768, 3072
local iters, runs = DEVICE == "cpu" and 1 or 20, DEVICE == "cpu" and 1 or 7
local function us(f) return T.time_per_call(DEVICE, f, iters, runs) * 1e6 end

local r = R.delayed { fp8_format = "hybrid" }
if arg[2] ~= "mlp" then
  local W = lutra.tensor({ K, N }, "bf16", DEVICE):randn(1, 0, 0.02)
  local dy = lutra.tensor({ M, K }, "bf16", DEVICE):randn(2, 0, 1)
  local Wq = lutra.quantizer(r, "weight", { device = DEVICE }):quantize(W)
  local dyq = lutra.quantizer(r, "grad_output", { device = DEVICE }):quantize(dy)
  local D = lutra.tensor({ M, N }, "bf16", DEVICE)
  local pre = lutra.tensor({ M, N }, "bf16", DEVICE):randn(3, 0, 1)
  local dbias = lutra.tensor({ N }, "bf16", DEVICE)
  local qg = lutra.quantizer(r, "grad_output", { device = DEVICE })
  local cases = {
    { "dgrad GEMM", function() lutra.gemm_ex(Wq, false, dyq, false, D, {}) end },
    { "dgrad GEMM + DGELU", function()
      lutra.gemm_ex(Wq, false, dyq, false, D, { epilogue = "dgelu", aux = pre })
    end },
    { "dgrad GEMM + DGELU_BGRAD", function()
      lutra.gemm_ex(Wq, false, dyq, false, D,
                    { epilogue = "dgelu_bgrad", aux = pre, dbias = dbias })
    end },
    { "grad_output cast + bias gradient", function() qg:quantize_dbias(D, dbias) end },
    { "grad_output cast", function() qg:quantize(D) end },
  }
  for round = 1, 2 do
    for _, c in ipairs(cases) do
      print(string.format("round %d: %-34s [%d, %d] %9.1f us", round, c[1], M, N, us(c[2])))
    end
  end
end

local nn = lutra.nn
local seq = nn.Sequential(nn.Linear(K, N, { dtype = "bf16", device = DEVICE, seed = 31 }),
                          nn.GELU(),
                          nn.Linear(N, K, { dtype = "bf16", device = DEVICE, seed = 32 }))
local x = lutra.tensor({ M, K }, "bf16", DEVICE):randn(7)
local g = lutra.tensor({ M, K }, "bf16", DEVICE):randn(8)
local scope = lutra.autocast { recipe = r }
local function step()
  scope:run(function() seq:forward(x, { grad = true }) end)
  seq:backward(g)
end
for round = 1, 3 do
  local t = us(step)
  print(string.format("round %d: MLP %d -> %d -> %d forward + backward %9.1f us, fusions %d / %d",
                      round, K, N, K, t, seq:fusions()))
end
