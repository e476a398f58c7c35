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

local timing = require("bench.support.timing")
local cli = require("lutra.cli")

local function parse(argv)
  local argparse = cli.argparse("rowwise_bench.lua")
  local p = argparse("rowwise_bench.lua", "Rowwise scaling's quantization bandwidth and GEMM time.")
  p:option("--device", "cuda or cpu (cpu: a smoke test)", "cuda"):choices({ "cuda", "cpu" })
  p:option("--size", "the square matrix size (a multiple of 16)", "8192"):convert(tonumber)
  p:option("--out", "also write the table to this markdown file")
  p:flag("--quick", "a small size and fewer runs")
  return p:parse(argv)
end

local opt = parse(arg)
local DEV = opt.device
cli.need_device("rowwise_bench.lua", DEV)
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
  { "current scaling cast (E4M3, both copies)", R.current { fp8_format = "e4m3" }, true, true },
  { "rowwise, rowwise copy only", R.rowwise(), true, false },
  { "rowwise, columnwise copy only", R.rowwise(), false, true },
  { "rowwise, both copies", R.rowwise(), true, true },
}
for _, c in ipairs(cases) do
  local q = lutra.quantizer(c[2], "input", { device = DEV, rowwise = c[3], columnwise = c[4] })
  row(c[1], time_per_call(function() q:quantize(x) end), 2 * N * N)
end

local gemm_rows = {}
local d = lutra.tensor({ N, N }, "bf16", DEV)
local w = lutra.tensor({ N, N }, "bf16", DEV):randn(2)
local flops = 2 * N * N * N
local function gemm_row(name, a, b)
  local t = time_per_call(function() lutra.gemm(a, true, b, false, d) end)
  gemm_rows[#gemm_rows + 1] = string.format("| %s | %.1f | %.0f |", name, t * 1e6, flops / t / 1e12)
end
gemm_row("bf16 GEMM", w, x)
local cur = R.current { fp8_format = "e4m3" }
gemm_row("per-tensor FP8 GEMM (current scaling)",
         lutra.quantizer(cur, "weight", { device = DEV }):quantize(w),
         lutra.quantizer(cur, "input", { device = DEV }):quantize(x))
gemm_row("rowwise GEMM (dequantize to bf16 + bf16 GEMM)",
         lutra.quantizer(R.rowwise(), "weight", { device = DEV }):quantize(w),
         lutra.quantizer(R.rowwise(), "input", { device = DEV }):quantize(x))

local title = string.format("Rowwise scaling on %s, %d x %d (bf16 input)", DEV, N, N)
require("bench.support.report").tables(title, {
  { head = "| op | us | GB/s (input) |", align = "|---|---:|---:|", rows = rows },
  { head = "| GEMM | us | TFLOP/s |", align = "|---|---:|---:|", rows = gemm_rows },
}, opt.out)
