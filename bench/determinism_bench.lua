#!/usr/bin/env luajit
-- What the determinism switch costs (lutra.deterministic; src/lutra/determinism.h), one process,
-- switch off and on side by side, batches alternating so that both run in the same seconds:
--   gemm   bf16 GEMMs (lutra.gemm, D [m, n] = B [m, k] A [k, n]) of the shapes where cuBLASLt's
--          heuristic takes split-K (small outputs over long sums: weight gradients of narrow
--          layers) and of a square one where it does not: ms per GEMM, the median of --batches
--          batches of --calls calls each.
--   step   a GPT-like training step (token embedding, --layers TransformerLayers with attention
--          dropout 0.1, LayerNorm, a linear head, cross-entropy, AdamW; bf16): ms per step,
--          likewise; the switch adds the deterministic attention backward (its dP workspace)
--          where LUTRA_CUDNN_DETERMINISTIC=0 would otherwise be honoured, so this process sets
--          LUTRA_CUDNN_DETERMINISTIC=0 for the "off" column's plans.
-- Usage (GPU machine, repository root, after make with cuDNN found):
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" luajit bench/determinism_bench.lua [--batches 9]
--     [--calls 20] [--layers 2] [--out FILE.md] [--device cuda|cpu]
-- --device cpu: tiny shapes in f32, a smoke test of the script.
local lutra = require("lutra")
local ffi = require("ffi")
local report = require("bench.support.report")
local timing = require("bench.support.timing")
local nn = lutra.nn

local function parse(argv)
  local argparse = require("lutra.cli").argparse("determinism_bench.lua")
  local p = argparse("determinism_bench.lua", "GEMM and training-step time with the "
                     .. "determinism switch off and on.")
  p:option("--batches", "timed batches per figure", "9", tonumber)
  p:option("--calls", "calls per timed batch", "20", tonumber)
  p:option("--layers", "TransformerLayers of the step", "2", tonumber)
  p:option("--device", "cuda or cpu (cpu: tiny f32 shapes, a smoke test)", "cuda")
   :choices({ "cuda", "cpu" })
  p:option("--out", "also write the tables to this markdown file")
  return p:parse(argv)
end

local o = parse(arg)
local DEV = o.device
require("lutra.cli").need_device("determinism_bench.lua", DEV)
local CPU = DEV == "cpu"
local DTYPE = CPU and "f32" or "bf16"
pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
ffi.C.setenv("LUTRA_CUDNN_DETERMINISTIC", "0", 1)

-- the median ms per call of fn with the switch off and on, batches alternating
local function off_on(fn)
  local t = { [false] = {}, [true] = {} }
  for _, on in ipairs { false, true } do -- warm-up: plans, workspaces
    lutra.deterministic(on)
    fn()
  end
  for _ = 1, o.batches do
    for _, on in ipairs { false, true } do
      lutra.deterministic(on)
      t[on][#t[on] + 1] = timing.mean_time(DEV, fn, o.calls, 0) * 1e3
    end
  end
  lutra.deterministic(false)
  return (timing.median(t[false])), (timing.median(t[true]))
end

local function row(name, off, on)
  return string.format("| %s | %.3f | %.3f | %.2fx |", name, off, on, on / off)
end

local GEMMS = CPU and { { 16, 16, 512 } } or {
  { 768, 768, 16384 }, { 64, 64, 65536 }, { 256, 768, 32768 }, { 4096, 4096, 4096 } }

local gemm_rows = {}
for _, s in ipairs(GEMMS) do
  local m, n, k = s[1], s[2], s[3]
  local a = lutra.tensor({ k, n }, DTYPE, DEV):randn(1)
  local b = lutra.tensor({ m, k }, DTYPE, DEV):randn(2)
  local d = lutra.tensor({ m, n }, DTYPE, DEV)
  local off, on = off_on(function() lutra.gemm(a, "N", b, "N", d) end)
  gemm_rows[#gemm_rows + 1] = row(string.format("m %d, n %d, k %d", m, n, k), off, on)
end

local B, T, VOCAB, DIM, HEADS = 8, 1024, 50304, 768, 12
if CPU then B, T, VOCAB, DIM, HEADS = 2, 16, 64, 32, 2 end
local where = { dtype = DTYPE, device = DEV }
local layers = {}
for i = 1, o.layers do
  layers[i] = nn.TransformerLayer(DIM, 4 * DIM, HEADS, { attention_dropout = 0.1, dtype = DTYPE,
                                                          device = DEV })
end
local tok, norm = nn.Embedding(VOCAB, DIM, where), nn.LayerNorm(DIM, where)
local head = nn.Linear(DIM, VOCAB, { bias = false, dtype = DTYPE, device = DEV })
local all = nn.Sequential(tok, norm, head, unpack(layers))
local opt, loss = lutra.optim.AdamW(all, { lr = 1e-4 }), nn.CrossEntropyLoss()
local ids = {}
for i = 1, B * T do ids[i] = (i * 7919) % VOCAB end
local x = lutra.from_table(ids, { B, T }, "i32", DEV)
local function step()
  local h = tok:forward(x)
  for i = 1, #layers do h = layers[i]:forward(h) end
  loss:forward(head:forward(norm:forward(h)), x)
  local dh = norm:backward(head:backward(loss:backward()))
  for i = #layers, 1, -1 do dh = layers[i]:backward(dh) end
  tok:backward(dh, false)
  opt:step()
end
local off, on = off_on(step)
local step_rows = { row(string.format("B %d, T %d, dim %d, %d layers, vocab %d", B, T, DIM,
                                      o.layers, VOCAB), off, on) }

local align = "|---|---:|---:|---:|"
report.tables("The determinism switch's cost on " .. DEV .. " (" .. DTYPE .. ")", {
  { head = "| GEMM | off ms | on ms | on / off |", align = align, rows = gemm_rows },
  { head = "| training step | off ms | on ms | on / off |", align = align, rows = step_rows },
}, o.out)
