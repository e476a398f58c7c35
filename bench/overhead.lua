-- Host time per call of lutra's Lua entry points beside the raw C calls they wrap, measured
-- side by side in one run. Run: make bench   (or: luajit bench/overhead.lua [--out FILE])
-- Each figure is the median over 15 batches of the per-call time of a batch, after warm-up.
local lutra = require("lutra")
local ffi, C, nn = lutra.ffi, lutra.C, lutra.nn

ffi.cdef [[
void cblas_sgemm(int order, int transa, int transb, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
]]
local blas = ffi.load("openblas")
local ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112

local out_file
for i = 1, #arg do if arg[i] == "--out" then out_file = arg[i + 1] end end

local BATCHES = 15

-- median per-call microseconds of fn() run `calls` times per batch
local function measure(calls, fn)
  for _ = 1, calls do fn() end -- warm-up (and JIT compilation)
  local times = {}
  for b = 1, BATCHES do
    local t0 = lutra.now()
    for _ = 1, calls do fn() end
    times[b] = (lutra.now() - t0) / calls * 1e6
  end
  table.sort(times)
  return times[(BATCHES + 1) / 2]
end

local rows = {}
local function report(name, us, base_name, base_us)
  rows[#rows + 1] = { name = name, us = us, base = base_name, base_us = base_us }
end

-- autocast enter+exit from Lua, beside the two C calls it wraps
local recipe = lutra.recipe.delayed { amax_history_len = 16 }
local scope = lutra.autocast { recipe = recipe }
local raw_enter, raw_exit = C.lutra_autocast_enter, C.lutra_autocast_exit
local n_scope = 1000000
report("autocast enter+exit (Lua methods)", measure(n_scope, function() scope:enter() scope:exit() end),
  "lutra_autocast_enter+exit (FFI)", measure(n_scope, function() raw_enter(scope) raw_exit(scope) end))

-- Linear at small sizes (batch 16, 64 -> 64), beside the OpenBLAS GEMMs it issues
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
local raw_fwd_us = measure(n_gemm, raw_fprop)
report("Linear forward f32 16x64x64", measure(n_gemm, function() lin:forward(x) end),
  "cblas_sgemm (FFI)", raw_fwd_us)
local raw_fb_us = measure(n_gemm, raw_fwd_bwd)
report("Linear forward+backward f32", measure(n_gemm, function() lin:forward(x) lin:backward(dy) end),
  "3x cblas_sgemm (FFI)", raw_fb_us)

-- FP8 forward: the quantizer casts and the dequantize+GEMM emulation are real work on the CPU,
-- so this ratio shows emulation cost, not front overhead; it is here to track it.
for _, name in ipairs { "delayed", "current" } do
  local fp8 = lutra.autocast { recipe = lutra.recipe.named(name, name == "delayed" and { amax_history_len = 16 } or nil) }
  report("Linear forward FP8 " .. name .. " (CPU emulation)",
    measure(n_gemm / 4, function() fp8:enter() lin:forward(x) fp8:exit() end),
    "cblas_sgemm (FFI)", raw_fwd_us)
end

local opt = lutra.optim.AdamW(lin, { lr = 1e-3 })
report("AdamW step (64x64 params)", measure(n_gemm, function() opt:step() end), nil, nil)

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
