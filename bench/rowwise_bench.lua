#!/usr/bin/env luajit
-- Rowwise scaling on the GPU (lutra/formats.h, kernels/quantize_rowwise.cu): the quantization of
-- each copy alone and of both, against per-tensor current scaling's cast of the same tensor and a
-- device copy, and a GEMM of rowwise operands (on Hopper: both dequantized to BF16, then a BF16
-- GEMM) against the BF16 and the per-tensor FP8 GEMM of the same shape. On the GPU machine, from
-- the repository root, with liblutra.so built with CUDA:
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" luajit bench/rowwise_bench.lua [--device cuda|cpu]
--          [--size N] [--out FILE.md] [--quick]
-- Per op a warm-up, then ITERS calls between two synchronizations, the median of 5 runs.
-- "GB/s" counts the bf16 input read once (2 bytes per element); the quantizations write 1 byte
-- per element per copy more. --device cpu is a smoke test.
local lutra = require("lutra")
local R = lutra.recipe

local b = require("bench.support.format_bench").new(
  "rowwise_bench.lua", "Rowwise scaling's quantization bandwidth and GEMM time.")
local cases = {
  { "current scaling cast (E4M3, both copies)", R.current { fp8_format = "e4m3" }, true, true },
  { "rowwise, rowwise copy only", R.rowwise(), true, false },
  { "rowwise, columnwise copy only", R.rowwise(), false, true },
  { "rowwise, both copies", R.rowwise(), true, true },
}
for _, c in ipairs(cases) do
  b:quantize_row(c[1], lutra.quantizer(c[2], "input", { device = b.device, rowwise = c[3],
                                                       columnwise = c[4] }))
end

local function quantized(recipe, role, t)
  return lutra.quantizer(recipe, role, { device = b.device }):quantize(t)
end
b:gemm_row("bf16 GEMM", b.w, b.x)
local cur = R.current { fp8_format = "e4m3" }
b:gemm_row("per-tensor FP8 GEMM (current scaling)", quantized(cur, "weight", b.w),
           quantized(cur, "input", b.x))
b:gemm_row("rowwise GEMM (dequantize to bf16 + bf16 GEMM)", quantized(R.rowwise(), "weight", b.w),
           quantized(R.rowwise(), "input", b.x))
b:report("Rowwise scaling")
