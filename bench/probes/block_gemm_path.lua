-- Which path lutra's GEMM plans take for block-scaled FP8 (1x128 activations x 128x128 weights)
-- on this GPU: cuBLASLt's native block modes or the BF16 fallback (bench/probes/probe_block_gemm.cu
-- asks cuBLASLt itself). On the GPU machine:
--   LUTRA_LOG_PLANS=1 LUTRA_DEVICE=cuda luajit bench/probes/block_gemm_path.lua
-- prints each operand's scaling, and each new plan's path on stderr.
local lutra = require("lutra")
local R = lutra.recipe
for _, s in ipairs { { 256, 384, 640 }, { 4096, 4096, 1024 } } do
  local m, n, k = s[1], s[2], s[3]
  local r = R.block {}
  local qa = lutra.quantizer(r, "weight", { device = "cuda" })
  local qb = lutra.quantizer(r, "input", { device = "cuda" })
  local a = qa:quantize(lutra.tensor({ n, k }, "bf16", "cuda"):randn(1))
  local b = qb:quantize(lutra.tensor({ m, k }, "bf16", "cuda"):randn(2))
  print(a:scaling_name(), b:scaling_name())
  lutra.gemm(a, true, b, false, lutra.tensor({ m, n }, "bf16", "cuda"))
end
lutra.synchronize()
