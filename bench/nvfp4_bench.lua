#!/usr/bin/env luajit
-- NVFP4 on the GPU (lutra/nvfp4.h, kernels/quantize_nvfp4.cu): each role's quantization (both
-- copies) against per-tensor current scaling's cast of the same tensor and a device copy, and an
-- NVFP4 GEMM (on Hopper: both operands dequantized to BF16, then a BF16 GEMM) against the BF16
-- GEMM of the same shape. On the GPU machine, from the repository root, with liblutra.so built
-- with CUDA:
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" luajit bench/nvfp4_bench.lua [--device cuda|cpu]
--          [--size N] [--out FILE.md] [--quick]
-- Per op a warm-up, then ITERS calls between two synchronizations, the median of 5 runs.
-- "GB/s" counts the bf16 input read once (2 bytes per element); the quantizations write 1.125
-- bytes per element more (both copies with their scales). --device cpu is a smoke test.
local lutra = require("lutra")
local R = lutra.recipe

local b = require("bench.support.format_bench").new("nvfp4_bench.lua",
                                                     "NVFP4 quantization bandwidth and GEMM time.")
local cases = {
  { "current scaling cast (E4M3, both copies)", R.current { fp8_format = "e4m3" }, "input" },
  { "nvfp4 input (1x16, RHT columnwise)", R.nvfp4(), "input" },
  { "nvfp4 weight (16x16 tiles)", R.nvfp4(), "weight" },
  { "nvfp4 grad_output (SR, RHT)", R.nvfp4(), "grad_output" },
}
for _, c in ipairs(cases) do
  b:quantize_row(c[1], lutra.quantizer(c[2], c[3], { device = b.device }))
end

b:gemm_row("bf16 GEMM", b.w, b.x)
local r = R.nvfp4 { disable_rht = true }
b:gemm_row("nvfp4 GEMM (dequantize to bf16 + bf16 GEMM)",
           lutra.quantizer(r, "weight", { device = b.device }):quantize(b.w),
           lutra.quantizer(r, "input", { device = b.device }):quantize(b.x))
b:report("NVFP4")
