-- A few tiled quantizations of one bf16 8192x8192 tensor on cuda (MXFP8, then a per-tensor cast
-- with its transpose), for profilers: tools/gpu-check.sh ncu runs Nsight Compute on it
-- (luajit bench/probes/quantize_once.lua on the GPU machine).
local lutra = require("lutra")
local R = lutra.recipe
local x = lutra.tensor({ 8192, 8192 }, "bf16", "cuda"):randn(1)
local mx = lutra.quantizer(R.mxfp8 {}, "input", { device = "cuda" })
local cast = lutra.quantizer(R.delayed {}, "input", { device = "cuda" })
for _ = 1, 2 do mx:quantize(x) end
for _ = 1, 2 do cast:quantize(x) end
lutra.synchronize()
