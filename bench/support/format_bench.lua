-- The frame of the format benchmarks (bench/nvfp4_bench.lua, bench/rowwise_bench.lua): the
-- command line, N x N bf16 operands on the device, quantizations timed beside a device copy and
-- GEMMs beside the BF16 one, and the two tables. Not a benchmark itself.
local lutra = require("lutra")
local cli = require("lutra.cli")
local timing = require("bench.support.timing")
local report = require("bench.support.report")

local B = {}
B.__index = B

-- The bench `script` ("NAME.lua", what its usage line shows) from the command line; times the
-- device copy of x first, so that every table starts with it.
function B.new(script, description)
  local p = cli.argparse(script)(script, description)
  p:option("--device", "cuda or cpu (cpu: a smoke test)", "cuda"):choices({ "cuda", "cpu" })
  p:option("--size", "the square matrix size (a multiple of 16)", "8192"):convert(tonumber)
  p:option("--out", "also write the table to this markdown file")
  p:flag("--quick", "a small size and fewer runs")
  local opt = p:parse(arg)
  cli.need_device(script, opt.device)
  local n = opt.quick and 256 or opt.size
  local dev = opt.device
  local b = setmetatable({ opt = opt, device = dev, n = n, iters = opt.quick and 2 or 20,
                           runs = opt.quick and 1 or 5, quant_rows = {}, gemm_rows = {} }, B)
  b.x = lutra.tensor({ n, n }, "bf16", dev):randn(1)
  b.w = lutra.tensor({ n, n }, "bf16", dev):randn(2)
  b.d = lutra.tensor({ n, n }, "bf16", dev)
  local y = lutra.tensor({ n, n }, "bf16", dev)
  b:row("copy (bf16, read + write)", function() y:copy(b.x) end, 4 * n * n)
  return b
end

-- seconds per call of fn (timing.time_per_call with the bench's iterations and runs)
function B:time(fn) return timing.time_per_call(self.device, fn, self.iters, self.runs) end

-- a row of the first table: fn timed, GB/s over `bytes`
function B:row(name, fn, bytes)
  local t = self:time(fn)
  self.quant_rows[#self.quant_rows + 1] = string.format("| %s | %.1f | %.0f |", name, t * 1e6,
                                                        bytes / t / 1e9)
end

-- quantizer q's quantization of x, GB/s over its bf16 input
function B:quantize_row(name, q)
  self:row(name, function() q:quantize(self.x) end, 2 * self.n * self.n)
end

-- a row of the GEMM table: a^T b into the bench's bf16 output, TFLOP/s
function B:gemm_row(name, a, b)
  local t = self:time(function() lutra.gemm(a, true, b, false, self.d) end)
  self.gemm_rows[#self.gemm_rows + 1] = string.format("| %s | %.1f | %.0f |", name, t * 1e6,
                                                      2 * self.n ^ 3 / t / 1e12)
end

-- both tables under "WHAT on DEVICE, N x N (bf16 input)", to stdout and --out
function B:report(what)
  local title = string.format("%s on %s, %d x %d (bf16 input)", what, self.device, self.n, self.n)
  report.tables(title, {
    { head = "| op | us | GB/s (input) |", align = "|---|---:|---:|", rows = self.quant_rows },
    { head = "| GEMM | us | TFLOP/s |", align = "|---|---:|---:|", rows = self.gemm_rows },
  }, self.opt.out)
end

return B
