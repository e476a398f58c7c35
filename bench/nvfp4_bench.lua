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
local timing = require("bench.support.timing")
local R = lutra.recipe

local function parse(argv)
  local argparse = require("lutra.cli").argparse("nvfp4_bench.lua")
  local p = argparse("nvfp4_bench.lua", "NVFP4 quantization bandwidth and GEMM time.")
  p:option("--device", "cuda or cpu (cpu: a smoke test)", "cuda"):choices({ "cuda", "cpu" })
  p:option("--size", "the square matrix size (a multiple of 16)", "8192"):convert(tonumber)
  p:option("--out", "also write the table to this markdown file")
  p:flag("--quick", "a small size and fewer runs")
  return p:parse(argv)
end

local opt = parse(arg)
local DEV = opt.device
require("lutra.cli").need_device("nvfp4_bench.lua", DEV)
local N = opt.quick and 256 or opt.size
local ITERS, RUNS = opt.quick and 2 or 20, opt.quick and 1 or 5

local function time_per_call(fn) return timing.time_per_call(DEV, fn, ITERS, RUNS) end

local x = lutra.tensor({ N, N }, "bf16", DEV):randn(1)
local y = lutra.tensor({ N, N }, "bf16", DEV)
local rows = {}
local function row(name, t, bytes)
  rows[#rows + 1] = string.format("| %s | %.1f | %.0f |", name, t * 1e6, bytes / t / 1e9)
end

row("copy (bf16, read + write)", time_per_call(function() y:copy(x) end), 4 * N * N)
local cases = {
  { "current scaling cast (E4M3, both copies)", R.current { fp8_format = "e4m3" }, "input" },
  { "nvfp4 input (1x16, RHT columnwise)", R.nvfp4(), "input" },
  { "nvfp4 weight (16x16 tiles)", R.nvfp4(), "weight" },
  { "nvfp4 grad_output (SR, RHT)", R.nvfp4(), "grad_output" },
}
for _, c in ipairs(cases) do
  local q = lutra.quantizer(c[2], c[3], { device = DEV })
  row(c[1], time_per_call(function() q:quantize(x) end), 2 * N * N)
end

local gemm_rows = {}
local d = lutra.tensor({ N, N }, "bf16", DEV)
local w = lutra.tensor({ N, N }, "bf16", DEV):randn(2)
local t_bf16 = time_per_call(function() lutra.gemm(w, true, x, false, d) end)
local r = R.nvfp4 { disable_rht = true }
local wq = lutra.quantizer(r, "weight", { device = DEV }):quantize(w)
local xq = lutra.quantizer(r, "input", { device = DEV }):quantize(x)
local t_fp4 = time_per_call(function() lutra.gemm(wq, true, xq, false, d) end)
local flops = 2 * N * N * N
gemm_rows[1] = string.format("| bf16 GEMM | %.1f | %.0f |", t_bf16 * 1e6, flops / t_bf16 / 1e12)
gemm_rows[2] = string.format("| nvfp4 GEMM (dequantize to bf16 + bf16 GEMM) | %.1f | %.0f |",
                             t_fp4 * 1e6, flops / t_fp4 / 1e12)

local title = string.format("NVFP4 on %s, %d x %d (bf16 input)", DEV, N, N)
require("bench.support.report").tables(title, {
  { head = "| op | us | GB/s (input) |", align = "|---|---:|---:|", rows = rows },
  { head = "| GEMM | us | TFLOP/s |", align = "|---|---:|---:|", rows = gemm_rows },
}, opt.out)
