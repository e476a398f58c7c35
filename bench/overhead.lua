-- Host time per call of lutra's Lua entry points beside the raw C calls they wrap, measured
-- side by side in one run. Run: make bench   (or: luajit bench/overhead.lua [--out FILE])
-- Each figure is the median over 15 batches of the per-call time of a batch, after warm-up;
-- batches of a figure and of the raw call beside it alternate.
-- OpenBLAS threads dominate tiny GEMMs: run with OPENBLAS_NUM_THREADS=1 for stable figures.
local lutra = require("lutra")
local timing = require("bench.support.timing")
local ffi, C, nn = lutra.ffi, lutra.C, lutra.nn

ffi.cdef [[
void cblas_sgemm(int order, int transa, int transb, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
]]
local blas = ffi.load("openblas")
local ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112

-- the command line, parsed with lua-argparse (Debian: lua-argparse)
local argparse = require("lutra.cli").argparse("overhead.lua")
local cli = argparse("overhead.lua", "Host time per call of lutra's Lua entry points beside the "
                     .. "raw C calls they wrap.")
cli:option("--out", "also write the table to this file")
local out_file = cli:parse(arg).out

local BATCHES = 15

-- Median per-call microseconds of fn and of base, `calls` calls per batch, after warm-up.
-- Batches of the two alternate, so both see the same machine state (turbo, neighbours).
local function measure_pair(calls, fn, base)
  for _ = 1, calls do fn() end
  if base then for _ = 1, calls do base() end end
  local tf, tb = {}, {}
  for b = 1, BATCHES do
    local t0 = lutra.now()
    for _ = 1, calls do fn() end
    local t1 = lutra.now()
    tf[b] = (t1 - t0) / calls * 1e6
    if base then
      for _ = 1, calls do base() end
      tb[b] = (lutra.now() - t1) / calls * 1e6
    end
  end
  return (timing.median(tf)), base and (timing.median(tb))
end

local rows = {}
local function report(name, calls, fn, base_name, base)
  local us, base_us = measure_pair(calls, fn, base)
  rows[#rows + 1] = { name = name, us = us, base = base_name, base_us = base_us }
end

-- autocast enter+exit from Lua, beside the two C calls it wraps
local recipe = lutra.recipe.delayed { amax_history_len = 16 }
local scope = lutra.autocast { recipe = recipe }
local raw_enter, raw_exit = C.lutra_autocast_enter, C.lutra_autocast_exit
report("autocast enter+exit (Lua methods)", 1000000, function() scope:enter() scope:exit() end,
  "lutra_autocast_enter+exit (FFI)", function() raw_enter(scope) raw_exit(scope) end)

-- Linear at small sizes (batch 16, 64 -> 64, no bias), beside the OpenBLAS GEMMs it issues
local N, IN, OUT = 16, 64, 64
local lin = nn.Linear(IN, OUT, { bias = false })
local x = lutra.tensor({ N, IN }):randn(1)
local dy = lutra.tensor({ N, OUT }):randn(2)
local w = lin:parameters()[1].value
local xd, wd = ffi.cast("float*", x.data), ffi.cast("float*", w.data)
local yd = ffi.new("float[?]", N * OUT)
local dyd = ffi.cast("float*", dy.data)
local dxd, dwd = ffi.new("float[?]", N * IN), ffi.new("float[?]", OUT * IN)

local function raw_fprop() -- y = x W^T
  blas.cblas_sgemm(ROW_MAJOR, NO_TRANS, TRANS, N, OUT, IN, 1, xd, IN, wd, IN, 0, yd, OUT)
end
local function raw_fwd_bwd()
  raw_fprop()
  blas.cblas_sgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, N, IN, OUT, 1, dyd, OUT, wd, IN, 0, dxd, IN)
  blas.cblas_sgemm(ROW_MAJOR, TRANS, NO_TRANS, OUT, IN, N, 1, dyd, OUT, xd, IN, 0, dwd, IN)
end

local n_gemm = 20000
report("Linear forward f32 16x64x64", n_gemm, function() lin:forward(x) end,
  "cblas_sgemm (FFI)", raw_fprop)
report("Linear forward+backward f32", n_gemm, function() lin:forward(x) lin:backward(dy) end,
  "3x cblas_sgemm (FFI)", raw_fwd_bwd)

-- FP8 forward: the quantizer casts and the dequantize+GEMM emulation are real work on the CPU,
-- so this ratio shows emulation cost, not front overhead; it is here to track it.
for _, name in ipairs { "delayed", "current" } do
  local fp8 = lutra.autocast { recipe = lutra.recipe.named(name, name == "delayed" and { amax_history_len = 16 } or nil) }
  report("Linear forward FP8 " .. name .. " (CPU emulation)", n_gemm / 4,
    function() fp8:enter() lin:forward(x) fp8:exit() end, "cblas_sgemm (FFI)", raw_fprop)
end

local opt = lutra.optim.AdamW(lin, { lr = 1e-3 })
report("AdamW step (64x64 params)", n_gemm, function() opt:step() end)

local lines = {}
local function emit(s) lines[#lines + 1] = s print(s) end
emit(string.format("lutra %s overhead benchmark, %s, LuaJIT %s", lutra.version(), os.date("!%Y-%m-%d"),
                   jit.version))
emit("")
emit("| what | us/call | beside | us/call | ratio |")
emit("|---|---:|---|---:|---:|")
for _, r in ipairs(rows) do
  if r.base then
    emit(string.format("| %s | %.4f | %s | %.4f | %.2fx |", r.name, r.us, r.base, r.base_us, r.us / r.base_us))
  else
    emit(string.format("| %s | %.4f | | | |", r.name, r.us))
  end
end
if out_file then
  local f = assert(io.open(out_file, "w"))
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
end
