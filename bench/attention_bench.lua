#!/usr/bin/env luajit
-- nn.DotProductAttention on the GPU (cuDNN's fused SDPA through
-- src/backend/cuda/attention_cudnn.cpp), one process, side by side:
--   throughput  forward and backward TFLOP/s at GPT-2 124M's attention (B 16, T 1024, H 12,
--               D 64) and a Llama-like layer's (B 2, T 4096, H 32, Hkv 8, D 128), causal, with
--               the deterministic backward (the default) and without it (the module built after
--               setting LUTRA_CUDNN_DETERMINISTIC=0 in this process): each a warm-up, then the
--               mean over --reps calls between two synchronizations. Shapes of head_dim 128 add
--               an FP8 row ({fp8 = true} inside a DelayedScaling autocast scope: cuDNN's
--               sdpa_fp8, TransformerEngine's fp8_dpa), timed as the module runs in a step, so
--               with its casts (q, k, v and dO to FP8; O, dq, dk, dv back to the dtype) and the
--               scope's scale update at each forward's exit.
--   host        host time per call of a forward and a forward + backward (DotProductAttention
--               at B 1, T 128, H 4, D 64 and a TransformerLayer of hidden 256 on it, shapes
--               where the GPU keeps up with the host) beside the replay
--               floor: the same call captured from a stream of the floors' and its launches
--               (cuDNN's kernels and memsets) issued again raw from this process
--               (bench/host_replay.cu in build/libhost_floors.so), batches alternating, so the
--               ratio (lutra / floor) is measured on the same core in the same seconds; lutra
--               timed on its own stream (--caller-stream: on the floors' stream). Target
--               1.15x. Without the library the floor is left out. A repeated call is the
--               launch of its cached graph (call_graphs.c), and so is its floor then; with
--               LUTRA_GEMM_GRAPHS=0 lutra runs cuDNN's execute every call and the floor is
--               cuDNN's kernels launched raw.
-- FLOPs counted: the forward 4 B H T^2 D (S = Q K^T and O = P V, 2 B H T^2 D each), halved when
-- causal; the backward 2.5 times the forward (S recomputed, dV, dP, dQ, dK: FlashAttention's
-- convention, which PyTorch's and cuDNN's own benchmarks use).
-- Usage (on the GPU machine, from the repository root, after make with cuDNN found):
--   nvcc -std=c++17 -arch=sm_90 -O2 -shared -Xcompiler -fPIC -cudart shared \
--     bench/host_floors.cu bench/host_replay.cu -o build/libhost_floors.so -lcublasLt -lcuda
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" luajit bench/attention_bench.lua [--dtype bf16|f16]
--     [--part throughput|host|all] [--reps 20] [--batches 15] [--calls 20] [--quick]
--     [--caller-stream]
--     [--floors-lib build/libhost_floors.so] [--out FILE.md] [--device cuda|cpu]
-- --device cpu: tiny shapes on the CPU backend in f32, a smoke test of the script.
-- PyTorch at the same shapes: python3 bench/attention_torch.py.
local lutra = require("lutra")
local floors = require("bench.support.floors")
local report = require("bench.support.report")
local timing = require("bench.support.timing")
local ffi, nn = lutra.ffi, lutra.nn

local function parse(argv)
  local argparse = require("lutra.cli").argparse("attention_bench.lua")
  local p = argparse("attention_bench.lua", "DotProductAttention's TFLOP/s and host time per "
                     .. "call beside its raw launches.")
  p:option("--part", "which benchmarks", "all"):choices({ "throughput", "host", "all" })
  p:option("--dtype", "the attention's dtype", "bf16"):choices({ "bf16", "f16" })
  p:option("--reps", "calls per throughput figure", "20", tonumber)
  p:option("--batches", "timed batches per host figure", "15", tonumber)
  p:option("--calls", "calls per timed host batch", "20", tonumber)
  p:flag("--quick", "fewer repetitions and batches")
  p:flag("--caller-stream", "host part: time lutra on the replay floors' stream (a caller's) "
         .. "instead of its own"):target("caller_stream")
  p:option("--floors-lib", "bench/host_floors.cu's library", "build/libhost_floors.so")
   :target("floors-lib")
  p:option("--out", "also write the tables to this markdown file")
  p:option("--device", "cuda or cpu (cpu: tiny f32 shapes, a smoke test)", "cuda")
   :choices({ "cuda", "cpu" })
  return p:parse(argv)
end

local o = parse(arg)
local DEV = o.device
local CUDA = DEV == "cuda"
require("lutra.cli").need_device("attention_bench.lua", DEV)
local DTYPE = CUDA and o.dtype or "f32"
local REPS = o.quick and 3 or o.reps
local BATCHES, CALLS = o.quick and 3 or o.batches, o.quick and 5 or o.calls

local SHAPES = CUDA and {
  { name = "GPT-2 124M", B = 16, T = 1024, H = 12, Hkv = 12, D = 64, causal = true },
  { name = "Llama-like", B = 2, T = 4096, H = 32, Hkv = 8, D = 128, causal = true },
} or { { name = "smoke", B = 1, T = 64, H = 2, Hkv = 1, D = 128, causal = true } }

local function forward_flops(s)
  return 4 * s.B * s.H * s.T * s.T * s.D / (s.causal and 2 or 1)
end

local function describe_shape(s)
  return string.format("%s (B %d, T %d, H %d/%d, D %d%s)", s.name, s.B, s.T, s.H, s.Hkv, s.D,
                       s.causal and ", causal" or "")
end

-- a module of shape s with its inputs (q, k, v and the gradient of the output)
local function setup(s, fp8)
  local m = nn.DotProductAttention(s.H, s.D, { num_gqa_groups = s.Hkv, dtype = DTYPE,
                                               attn_mask_type = s.causal and "causal" or "no_mask",
                                               device = DEV, fp8 = fp8 })
  local q = lutra.tensor({ s.B, s.T, s.H, s.D }, DTYPE, DEV):randn(1)
  local k = lutra.tensor({ s.B, s.T, s.Hkv, s.D }, DTYPE, DEV):randn(2)
  local v = lutra.tensor({ s.B, s.T, s.Hkv, s.D }, DTYPE, DEV):randn(3)
  local dout = lutra.tensor({ s.B, s.T, s.H, s.D }, DTYPE, DEV):randn(4)
  return m, q, k, v, dout
end

-- LUTRA_CUDNN_DETERMINISTIC for the plans built from now on (read at each plan build)
pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
local function deterministic_backward(on)
  ffi.C.setenv("LUTRA_CUDNN_DETERMINISTIC", on and "1" or "0", 1)
end

local tables = {}

-- the FP8 rows' scope: a DelayedScaling recipe (HYBRID: E4M3 forward, E5M2 gradients)
local fp8_scope = lutra.autocast { recipe = lutra.recipe.delayed() }

local function throughput_part()
  local rows = {}
  for _, s in ipairs(SHAPES) do
    local variants = { { det = true }, { det = false } }
    if s.D == 128 then variants[3] = { fp8 = true } end
    for _, var in ipairs(variants) do
      deterministic_backward(var.det ~= false)
      local m, q, k, v, dout = setup(s, var.fp8)
      local forward = function() m:forward(q, k, v) end
      if var.fp8 then
        forward = function()
          fp8_scope:enter()
          local ok, err = pcall(m.forward, m, q, k, v)
          fp8_scope:exit()
          if not ok then error(err, 0) end
        end
      end
      local fwd = timing.mean_time(DEV, forward, REPS, 2)
      forward()
      local bwd = timing.mean_time(DEV, function() m:backward(dout) end, REPS, 2)
      local _, got_det = m:plans()
      local f = forward_flops(s)
      rows[#rows + 1] = string.format("| %s | %s | %s | %.3f | %.0f | %.3f | %.0f |",
                                      describe_shape(s), var.fp8 and "fp8 (delayed)" or DTYPE,
                                      tostring(got_det), fwd * 1e3, f / fwd / 1e12, bwd * 1e3,
                                      2.5 * f / bwd / 1e12)
      m, q, k, v, dout = nil, nil, nil, nil, nil
      collectgarbage()
      collectgarbage()
    end
  end
  deterministic_backward(true)
  tables[#tables + 1] = {
    head = "| shape | dtype | deterministic bwd | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s |",
    align = "|---|---|---|---:|---:|---:|---:|", rows = rows }
end

-- ---- host time beside the replay floor ---------------------------------------------------------
local hf, replay_stream
local stream_box, counts_box = ffi.new("void *[1]"), ffi.new("int64_t[5]")
local SLOT = 0

local function sync()
  lutra.synchronize(DEV)
  if replay_stream then hf.hf_replay_sync() end
end

local function load_replay()
  if not CUDA then return end
  local lib, why = floors.open(o["floors-lib"], 64, 64, 64)
  if not lib or not pcall(function() return lib.hf_replay_begin end) then
    io.stderr:write("attention_bench.lua: no replay floors (", tostring(why or "a library built "
                    .. "without bench/host_replay.cu"), "): floors left out\n")
    return
  end
  if lib.hf_replay_stream(stream_box) ~= 0 then return end
  hf, replay_stream = lib, stream_box[0]
  lutra.cuda_set_stream(replay_stream) -- lutra's captured calls and the floors on one stream
end

-- fn captured (after warm-up calls: its plan, workspace and outputs exist) and its launches
-- issued again raw by a function; nil (said on stderr) where there is no floor
local function replay_floor(fn, what)
  if not replay_stream then return nil end
  for _ = 1, 3 do fn() end
  sync()
  collectgarbage()
  collectgarbage("stop") -- no finalizer's free inside the capture
  local ok = hf.hf_replay_begin(stream_box) == 0
  if ok then
    ok = pcall(fn)
    if ok then ok = hf.hf_replay_end(SLOT) == 0 else hf.hf_replay_abort() end
  end
  collectgarbage("restart")
  ok = ok and hf.hf_replay_counts(SLOT, counts_box, counts_box + 1, counts_box + 2,
                                  counts_box + 3, counts_box + 4) == 0
  ok = ok and hf.hf_replay_issue(SLOT, 1) == 0
  sync()
  if not ok then
    io.stderr:write("attention_bench.lua: ", what, ": no replay floor (above)\n")
    hf.hf_replay_free(SLOT)
    return nil
  end
  -- what the call issued: lutra's cached calls are graph launches (one each), the rest raw
  local parts = {}
  for i, name in ipairs { "kernels", "copies", "memsets", "graph launches" } do
    local n = tonumber(counts_box[i - 1])
    if n > 0 then parts[#parts + 1] = string.format("%d %s", n, name) end
  end
  local launches = #parts > 0 and table.concat(parts, ", ") or "none"
  return function()
    if hf.hf_replay_issue(SLOT, 1) ~= 0 then
      error("attention_bench.lua: hf_replay_issue failed")
    end
  end, launches
end

-- medians of the host time per call of fn and of alt (nil: none), batches alternating
local function host_time(fn, alt)
  local a, b = {}, {}
  for _ = 1, BATCHES do
    sync()
    local t0 = lutra.now()
    for _ = 1, CALLS do fn() end
    a[#a + 1] = (lutra.now() - t0) / CALLS
    if alt then
      sync()
      t0 = lutra.now()
      for _ = 1, CALLS do alt() end
      b[#b + 1] = (lutra.now() - t0) / CALLS
    end
  end
  sync()
  return (timing.median(a)), alt and (timing.median(b)) or nil
end

-- host time is measured where the GPU keeps up with the host (a wider call would make the host
-- wait on a full launch queue, and the figure would be the GPU's): one short sequence
local HOST_SHAPE = CUDA and { name = "host", B = 1, T = 128, H = 4, Hkv = 4, D = 64, causal = true }
                   or SHAPES[1]
local HOST_LAYER = { hidden = 256, ffn = 1024, heads = 4 }

-- The floor is captured from the replay stream, lutra's calls are timed on lutra's own stream,
-- as a user's calls run by default: on a caller's stream, which someone else may be capturing,
-- each cached call also asks the stream's capture status (call_graphs.c); --caller-stream
-- times that path.
local function host_rows(rows, what, calls)
  for _, c in ipairs(calls) do
    local floor, launches = replay_floor(c[2], c[1])
    local own = replay_stream and not o.caller_stream
    if own then
      sync()
      lutra.cuda_set_stream(nil)
      for _ = 1, 3 do c[2]() end -- the own stream's cached calls made
    end
    local t, f = host_time(c[2], floor)
    if own then
      sync()
      lutra.cuda_set_stream(replay_stream)
    end
    if floor then hf.hf_replay_free(SLOT) end
    rows[#rows + 1] = string.format("| %s | %s | %.1f | %s | %s | %s |", what, c[1], t * 1e6,
                                    f and string.format("%.1f", f * 1e6) or "n/a",
                                    f and string.format("%.2f", t / f) or "n/a", launches or "n/a")
  end
end

local function host_part()
  load_replay()
  local rows = {}
  local s = HOST_SHAPE
  local m, q, k, v, dout = setup(s)
  host_rows(rows, "DotProductAttention " .. describe_shape(s), {
    { "forward", function() m:forward(q, k, v) end },
    { "forward + backward", function()
      m:forward(q, k, v)
      m:backward(dout)
    end },
  })
  local L = HOST_LAYER
  local layer = nn.TransformerLayer(L.hidden, L.ffn, L.heads, { dtype = DTYPE, device = DEV })
  local x = lutra.tensor({ s.B, s.T, L.hidden }, DTYPE, DEV):randn(5)
  local dy = lutra.tensor({ s.B, s.T, L.hidden }, DTYPE, DEV):randn(6)
  host_rows(rows, string.format("TransformerLayer (hidden %d, ffn %d, H %d, B %d, T %d)",
                                L.hidden, L.ffn, L.heads, s.B, s.T), {
    { "forward", function() layer:forward(x) end },
    { "forward + backward", function()
      layer:forward(x)
      layer:backward(dy)
    end },
  })
  tables[#tables + 1] = {
    head = "| module | call | lutra us | replay floor us | ratio | launches |",
    align = "|---|---|---:|---:|---:|---|", rows = rows }
end

if o.part ~= "host" then throughput_part() end
if o.part ~= "throughput" then host_part() end
report.tables(string.format("DotProductAttention on %s (%s)", DEV, DTYPE), tables, o.out)
