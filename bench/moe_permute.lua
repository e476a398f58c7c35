#!/usr/bin/env luajit
-- The MoE routing kernels (lutra.moe: router, permute, unpermute and their backwards) on the
-- GPU: their bandwidth against a device-to-device copy of the same bytes, and their host cost
-- per call against the raw launches they issue. On the GPU machine, from the repository root,
-- with liblutra.so built with CUDA (the floors library once; optional):
--   nvcc -std=c++17 -arch=sm_90 -O2 -shared -Xcompiler -fPIC -cudart shared \
--     bench/host_floors.cu bench/host_replay.cu -o build/libhost_floors.so -lcublasLt -lcuda
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" luajit bench/moe_permute.lua [--device cuda|cpu]
--          [--floors-lib build/libhost_floors.so] [--out FILE.md] [--quick]
--   (--help lists them)
-- Bandwidth: per op a warm-up, then ITERS calls between two synchronizations; the time per call
-- is the wall time / ITERS, the median of 5 such runs. "Moved" counts each byte a kernel must
-- read or write once (rows, indices, probabilities); "copy" is lutra's tensor copy
-- (cudaMemcpyAsync device to device) of a [tokens * k, hidden] tensor, its moved bytes read +
-- write. The ratio is the op's GB/s over the copy's.
-- Host cost: small shapes (the GPU work is shorter than the issue), the device synchronized
-- before each batch of 50 calls (at most 200 launches: the queue never fills), the host wall
-- time of the batch / 50, the median of 15 batches; beside it the same number of empty kernel
-- launches from bench/host_floors.cu's library in this process (when --floors-lib loads),
-- batches alternating. --device cpu runs everything on the CPU backend (a smoke test: the
-- figures are then CPU compute, not host overhead).
local lutra = require("lutra")
local floors = require("bench.support.floors")
local timing = require("bench.support.timing")
local ffi, moe = lutra.ffi, lutra.moe

-- the command line, parsed with lua-argparse (Debian: lua-argparse)
local function parse(argv)
  local argparse = require("lutra.cli").argparse("moe_permute.lua")
  local p = argparse("moe_permute.lua", "Bandwidth and host cost of the MoE routing kernels "
                     .. "(router, permute, unpermute and their backwards).")
  p:option("--device", "cuda or cpu (cpu: a smoke test)", "cuda"):choices({ "cuda", "cpu" })
  p:option("--floors-lib", "bench/host_floors.cu's library (default build/libhost_floors.so)")
   :target("floors-lib")
  p:option("--out", "also write the tables to this markdown file")
  p:flag("--quick", "one small shape, fewer runs and batches")
  return p:parse(argv)
end

local opt = parse(arg)
local DEV = opt.device
require("lutra.cli").need_device("moe_permute.lua", DEV)
local ITERS, RUNS = opt.quick and 2 or 20, opt.quick and 1 or 5

local median = timing.median
local function time_per_call(fn) return timing.time_per_call(DEV, fn, ITERS, RUNS) end

local lines = {}
local function out(fmt, ...)
  local s = string.format(fmt, ...)
  print(s)
  lines[#lines + 1] = s
end

-- ---- bandwidth -------------------------------------------------------------------------------
local SHAPES = opt.quick and { { T = 512, H = 256, E = 8, k = 2 } } or {
  { T = 16384, H = 4096, E = 8, k = 2 }, { T = 16384, H = 1024, E = 64, k = 2 },
  { T = 16384, H = 4096, E = 64, k = 8 }, { T = 4096, H = 7168, E = 256, k = 8 },
}
out("## MoE routing kernels on %s: bandwidth against a device copy (bf16 rows, f32 probs)", DEV)
out("")
out("| tokens | hidden | experts | k | op | us/call | moved MB | GB/s | x copy |")
out("|---:|---:|---:|---:|---|---:|---:|---:|---:|")
for _, s in ipairs(SHAPES) do
  local T, H, E, k = s.T, s.H, s.E, s.k
  local es, n = 2, s.T * s.k
  local x = lutra.tensor({ T, H }, "bf16", DEV):randn(1)
  local logits = lutra.tensor({ T, E }, "f32", DEV):randn(2)
  local router, disp = moe.TopK(E, k, { device = DEV }), moe.Dispatcher(E, { device = DEV })
  local probs, idx = router:forward(logits)
  local xe = lutra.tensor({ n, H }, "bf16", DEV):randn(3)
  local dy = lutra.tensor({ T, H }, "bf16", DEV):randn(4)
  local src, dst = lutra.tensor({ n, H }, "bf16", DEV):randn(5), lutra.tensor({ n, H }, "bf16", DEV)
  disp:permute(x, idx)
  disp:unpermute(xe, probs)
  local copy_s = time_per_call(function() dst:copy(src) end)
  local copy_bytes = 2 * n * H * es
  local copy_bw = copy_bytes / copy_s
  local rows = n * H * es
  local ops = {
    { "copy [T*k, H]", function() dst:copy(src) end, copy_bytes },
    { "router forward", function() router:forward(logits) end, T * E * 4 + n * 8 },
    { "router backward", function() router:backward(probs) end, 2 * T * E * 4 + n * 8 },
    { "permute", function() disp:permute(x, idx) end, T * H * es + rows + n * 8 },
    { "unpermute", function() disp:unpermute(xe, probs) end, rows + T * H * es + n * 8 },
    { "permute backward", function() disp:permute_backward(xe) end, rows + T * H * es + n * 4 },
    { "unpermute backward", function() disp:unpermute_backward(dy) end,
      T * H * es + 2 * rows + n * 12 },
  }
  for _, o in ipairs(ops) do
    local sec = o[1]:find("^copy") and copy_s or time_per_call(o[2])
    local bw = o[3] / sec
    out("| %d | %d | %d | %d | %s | %.1f | %.1f | %.0f | %.2f |", T, H, E, k, o[1], sec * 1e6,
        o[3] / 1e6, bw / 1e9, bw / copy_bw)
  end
  router:destroy()
  disp:destroy()
end

-- ---- host cost per call ----------------------------------------------------------------------
local hf
if DEV == "cuda" then
  hf = floors.open(opt["floors-lib"], 64, 64, 64)
end
local BATCH, BATCHES = 50, opt.quick and 3 or 15
local function host_us(fn, launches)
  local tf, tl = {}, {}
  for _ = 1, BATCH do fn() end
  for b = 1, BATCHES do
    lutra.synchronize(DEV)
    local t0 = lutra.now()
    for _ = 1, BATCH do fn() end
    tf[b] = (lutra.now() - t0) / BATCH * 1e6
    if hf then
      lutra.synchronize(DEV)
      hf.hf_sync()
      local t1 = lutra.now()
      hf.hf_issue(0, BATCH * launches) -- floor 0: an empty kernel launch + cudaGetLastError
      tl[b] = (lutra.now() - t1) / BATCH * 1e6
      hf.hf_sync()
    end
  end
  return median(tf), hf and median(tl)
end

local T, H, E, k = 64, 64, 8, 2
local x = lutra.tensor({ T, H }, "bf16", DEV):randn(1)
local logits = lutra.tensor({ T, E }, "f32", DEV):randn(2)
local router, disp = moe.TopK(E, k, { device = DEV }), moe.Dispatcher(E, { device = DEV })
local probs, idx = router:forward(logits)
local xe = lutra.tensor({ T * k, H }, "bf16", DEV):randn(3)
local dy = lutra.tensor({ T, H }, "bf16", DEV):randn(4)
disp:permute(x, idx)
disp:unpermute(xe, probs)
out("")
out("## Host cost per call on %s (tokens %d, hidden %d, experts %d, k %d)", DEV, T, H, E, k)
out("")
out("| call | launches | us/call | raw launches us | ratio |")
out("|---|---:|---:|---:|---:|")
for _, o in ipairs {
  { "router:forward", function() router:forward(logits) end, 1 },
  { "router:backward", function() router:backward(probs) end, 1 },
  { "disp:permute", function() disp:permute(x, idx) end, 4 },
  { "disp:unpermute", function() disp:unpermute(xe, probs) end, 1 },
  { "disp:permute_backward", function() disp:permute_backward(xe) end, 1 },
  { "disp:unpermute_backward", function() disp:unpermute_backward(dy) end, 1 },
} do
  local us, floor = host_us(o[2], o[3])
  out("| %s | %d | %.2f | %s | %s |", o[1], o[3], us, floor and string.format("%.2f", floor) or "n/a",
      floor and string.format("%.2f", us / floor) or "n/a")
end

if opt.out then
  local f = assert(io.open(opt.out, "w"))
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
end
