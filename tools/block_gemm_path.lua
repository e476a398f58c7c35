-- Which path a block-scaled FP8 GEMM takes on cuda (run with LUTRA_LOG_PLANS=1).
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
