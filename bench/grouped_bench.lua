#!/usr/bin/env luajit
-- GroupedLinear benchmarks (issue 13), one process, side by side:
--   host   host time per call of a GroupedLinear forward and forward+backward, 8 and 64
--          experts, bf16 and FP8 (delayed, current), device m_splits that change every call
--          (a ring of --ring pre-made device tensors, 16 by default: nothing is read or written by
--          the host; --ring 1 keeps one tensor whose contents the caller would rewrite), next
--          to the floor of the raw launches each call issues: one call captured from the stream
--          lutra runs on and its launches issued again exactly as captured (the CUTLASS kernel's
--          2-CTA cluster, dynamic shared memory and parameter block included; bench/host_replay.cu)
--          from this process, batches alternating with lutra's, so the ratio (lutra / that
--          floor) is measured on the same core in the same seconds. Beside it the older floor of
--          as many empty <<<1, 32>>> launches as launches() below counts, which understates what
--          those launches cost; a captured kernel count unlike that count is warned about.
--   gemm   GPU throughput of the grouped GEMM (forward of a GroupedLinear, the splits on the
--          device) at tokens 16384, 4096 -> 4096 and 1024 -> 4096, 8 and 64 experts, balanced
--          and skewed routing, bf16 and FP8 current scaling, against one dense GEMM of the same
--          FLOPs (an nn.Linear of [16384, in] -> out: one cuBLASLt matmul).
--   step   a training step (forward, the weights quantized in the call, + backward) at the gemm
--          part's shapes, bf16 against FP8 delayed and current, medians of alternating rounds.
--   fp8    where an FP8 grouped forward's time goes: the same shapes timed with the weights
--          quantized every call (as in gemm), with the FP8 weights cached (is_first_microbatch
--          false: input cast + GEMM), under delayed scaling with cached weights (one cast pass,
--          no amax pass), beside the bf16 grouped forward and the dense FP8 Linear both ways.
--          The differences are the weight quantization and the input's amax pass; for the time
--          of each kernel run it under Nsight Systems:
--            nsys profile -o grouped_fp8 --stats=true luajit bench/grouped_bench.lua --part fp8
-- Usage (on the GPU machine, from the repository root, after make):
--   nvcc -std=c++17 -arch=sm_90 -O2 -shared -Xcompiler -fPIC -cudart shared \
--     bench/host_floors.cu bench/host_replay.cu -o build/libhost_floors.so -lcublasLt -lcuda
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" luajit bench/grouped_bench.lua [--part host|gemm|fp8|all]
--     [--rows 16] [--in 64] [--out 64] [--batches 15] [--calls 200] [--ring 16] [--quick]
--     [--floors-lib build/libhost_floors.so] [--device cuda|cpu]   (--help lists them)
-- --device cpu runs the host part on the CPU backend (no floors) as a smoke test.
-- HF_REPLAY_LOG=1 prints each captured kernel (grid, shared memory, parameter bytes, cluster).
-- PyTorch at the same shapes: python3 bench/torch_grouped.py.
local lutra = require("lutra")
local floors = require("bench.support.floors")
local timing = require("bench.support.timing")
local ffi, nn = lutra.ffi, lutra.nn

-- the command line, parsed with lua-argparse (Debian: lua-argparse)
local function parse(argv)
  local argparse = require("lutra.cli").argparse("grouped_bench.lua")
  local p = argparse("grouped_bench.lua", "GroupedLinear host time per call beside its raw "
                     .. "launches, and grouped GEMM throughput beside one dense GEMM.")
  p:option("--part", "which benchmarks", "all")
   :choices({ "host", "gemm", "fp8", "step", "all" })
  p:option("--rows", "rows per expert (host part)", "16", tonumber)
  p:option("--in", "input features (host part)", "64", tonumber)
  p:option("--out", "output features (host part)", "64", tonumber)
  p:option("--batches", "timed batches per figure", "15", tonumber)
  p:option("--calls", "calls per timed batch", "200", tonumber)
  p:option("--ring", "device splits tensors the host part cycles through", "16", tonumber)
  p:flag("--quick", "3 batches of 50 calls, fewer GEMM repetitions")
  p:flag("--caller-stream", "host part: time lutra on the replay floors' stream (a caller's) "
         .. "instead of its own")
  p:option("--floors-lib", "bench/host_floors.cu's library", "build/libhost_floors.so")
   :target("floors-lib")
  p:option("--device", "cuda or cpu (cpu: the host part on the CPU backend)", "cuda")
   :choices({ "cuda", "cpu" })
  local opt = p:parse(argv)
  if opt.quick then opt.batches, opt.calls = 3, 50 end
  return opt
end

local o = parse(arg)
local DEV = o.device
local CUDA = DEV == "cuda"
require("lutra.cli").need_device("grouped_bench.lua", DEV, "use --device cpu")

local median = timing.median

-- GPU time per call: 3 warm-up calls, then the mean over 20 (--quick: 5) between two syncs
local function gpu_time(fn) return timing.mean_time(DEV, fn, o.quick and 5 or 20, 3) end

local hf -- bench/host_floors.cu's library, when loaded (cuda)

-- lutra's stream, the replay floors' and the empty launches' own
local replay_stream -- nil: no replay floors (cpu, no library, or one built without them)
local function sync()
  lutra.synchronize(DEV)
  if hf then hf.hf_sync() end
  if replay_stream then hf.hf_replay_sync() end
end

-- per batch: sync, `calls` calls of fn, the host time of the loop / calls, then the same for
-- each function of the list alts in turn; fn's median, and the alts' medians in a list.
-- Every switch between fn and an alt waits for both streams: a replay floor re-issues a call's
-- work on the replay stream while fn runs on lutra's own, and both write the module's buffers
-- (its copy of the splits, which the backward's GEMMs read). Overlapping, a backward can read
-- another forward's half-written splits and set the module's bad-split flag, which the check
-- after each mode reports.
local function host_time(fn, calls, batches, alts)
  local a, b, m = {}, {}, {}
  fn()
  for j, alt in ipairs(alts) do
    sync()
    alt()
    b[j] = {}
  end
  for _ = 1, batches do
    sync()
    local t0 = lutra.now()
    for _ = 1, calls do fn() end
    a[#a + 1] = (lutra.now() - t0) / calls
    for j, alt in ipairs(alts) do
      sync()
      t0 = lutra.now()
      for _ = 1, calls do alt() end
      b[j][#b[j] + 1] = (lutra.now() - t0) / calls
    end
  end
  sync()
  for j = 1, #alts do m[j] = median(b[j]) end
  return median(a), m
end

-- ---- floors ----------------------------------------------------------------------------------
local floor_ids = {}
local function load_floors(M, K, N)
  if not CUDA then return end
  local lib, why = floors.open(o["floors-lib"], M, K, N)
  if not lib then
    io.stderr:write("grouped_bench.lua: no floors library (", why, "): ratios left out\n")
    return
  end
  hf, floor_ids = lib, floors.ids(lib)
end

-- The launches one call issues (kernels/grouped_*.cu, src/nn/grouped/), whatever the number
-- of experts (the device splits are read in place: the forward GEMM's k_setup keeps the copy
-- its backward reads, so no copy is issued): per quantization k_cast (after k_amax under
-- current scaling; + k_dbias for grad_output with a bias), per GEMM one launch of its cached
-- graph (src/backend/cuda/call_graphs.c: k_setup + the CUTLASS kernel, FPROP adding the bias in
-- its epilogue, + k_dbias in a bf16 WGRAD; without graphs, LUTRA_GEMM_GRAPHS=0, those are
-- launched one by one: 2 a GEMM, 3 for a bf16 WGRAD), and the scope's one fused delayed-scaling
-- update per direction. A quantization is one launch of its cached graph too, unless
-- LUTRA_LAUNCH_GRAPHS=0.
local GRAPHS = os.getenv("LUTRA_GEMM_GRAPHS") ~= "0"
local KERNEL_GRAPHS = os.getenv("LUTRA_LAUNCH_GRAPHS") ~= "0"
local function launches(mode, backward)
  local quant = (mode == "current" and not KERNEL_GRAPHS) and 2 or 1
  local gemm = GRAPHS and 1 or 2
  local wgrad_bf16 = GRAPHS and 1 or 3
  local fwd = mode == "bf16" and gemm or (2 * quant + gemm + (mode == "delayed" and 1 or 0))
  -- grad_output's quantization and its k_dbias: one graph launch when kernels are cached
  local dy_quant = KERNEL_GRAPHS and 1 or quant + 1
  local bwd = mode == "bf16" and gemm + wgrad_bf16
              or (dy_quant + 2 * gemm + (mode == "delayed" and 1 or 0))
  return 0, fwd + (backward and bwd or 0) -- memcpys, launches
end

local function floor_fn(copies, kernels)
  if not hf then return nil end
  local mc, ln = floor_ids.memcpy, floor_ids.launch
  return function()
    hf.hf_issue(mc, copies)
    hf.hf_issue(ln, kernels)
  end
end

-- ---- replay floors: one call captured, its launches issued again raw (bench/host_replay.cu) --
-- lutra runs the whole host part on the replay stream (non-blocking, as lutra's own stream is):
-- the capture must be of the stream lutra issues to, the warm-up calls before it must have
-- made that stream's buffers (nothing may be first allocated inside a capture), and the call
-- and its floor then run on the same kind of stream, neither with an advantage. The capture is
-- the library's, not lutra.graph's: lutra does not know of it, so the captured call takes the
-- eager path the timed calls take (under lutra_graph_begin it would not: cached one-GEMM graphs
-- run directly there, and what a graph uses is held).
local REPLAY_SLOT = 0
local stream_box, counts_box = ffi.new("void *[1]"), ffi.new("int64_t[5]")

local function load_replay()
  if not hf or replay_stream then return end
  -- a library built before bench/host_replay.cu lacks the symbols
  if not pcall(function() return hf.hf_replay_begin end) then
    io.stderr:write("grouped_bench.lua: the floors library has no replay floors (build it again ",
                    "with bench/host_replay.cu): replay floors n/a\n")
    return
  end
  if hf.hf_replay_stream(stream_box) ~= 0 then return end
  replay_stream = stream_box[0]
end

-- fn (one call) captured into REPLAY_SLOT; true, or false after saying why (the capture is then
-- discarded whole, the autocast scopes fn entered are left, and the floor is n/a). The garbage
-- is collected first and the collector stopped meanwhile: a finalizer that frees a tensor inside
-- the capture would put a free node in it, which the floor refuses.
local function capture(fn, what)
  local depth = lutra.autocast_state()
  collectgarbage()
  collectgarbage("stop")
  local ok, err = hf.hf_replay_begin(stream_box) == 0, "hf_replay_begin failed (above)"
  if ok then
    ok, err = pcall(fn)
    if ok then
      ok, err = hf.hf_replay_end(REPLAY_SLOT) == 0, "hf_replay_end refused it (above)"
    else
      hf.hf_replay_abort()
      lutra.autocast_unwind(depth)
    end
  end
  collectgarbage("restart")
  if not ok then
    io.stderr:write("grouped_bench.lua: ", what, ": no replay floor: ", tostring(err), "\n")
  end
  return ok
end

-- The replay floor of fn (`fwd` or `step`): a function issuing the captured launches once, and
-- the captured counts {kernels, copies, memsets, graphs}; nil when there is none. warm eager
-- calls come first (buffers, plans, CUTLASS's initialized GEMMs and the second sighting that
-- makes a cached graph of each GEMM call, one per splits tensor of the ring, are all made there,
-- not inside the capture, whose call then launches those graphs as the timed calls do). The captured
-- call ran nothing on the GPU while lutra's host state advanced (the ring of splits, the amax
-- history's position), so two eager calls follow before anything is timed; and the re-issued
-- launches write lutra's live buffers with the captured call's inputs, harmless for a timing
-- floor since every timed lutra call rewrites what it reads. One trial issue, waited for,
-- shows a floor that fails before it is timed.
local function replay_floor(fn, what, warm)
  if not replay_stream then return nil end
  for _ = 1, warm do fn() end
  if not capture(fn, what) then return nil end
  local b = counts_box
  local ok = hf.hf_replay_counts(REPLAY_SLOT, b, b + 1, b + 2, b + 3, b + 4) == 0
  fn()
  fn()
  ok = ok and hf.hf_replay_issue(REPLAY_SLOT, 1) == 0
  sync()
  if not ok then
    io.stderr:write("grouped_bench.lua: ", what, ": no replay floor (above)\n")
    hf.hf_replay_free(REPLAY_SLOT)
    return nil
  end
  local slot = REPLAY_SLOT
  local function floor()
    if hf.hf_replay_issue(slot, 1) ~= 0 then error("grouped_bench.lua: hf_replay_issue failed") end
  end
  return floor, { kernels = tonumber(b[0]), copies = tonumber(b[1]), memsets = tonumber(b[2]),
                  graphs = tonumber(b[3]) }
end

-- what the table's launches column shows: the captured work when there is a capture (said on
-- stderr where it is not what launches() counted), else the count
local function launch_column(what, cap, copies, kernels)
  if not cap then return copies + kernels end
  if cap.kernels ~= kernels or cap.copies ~= copies or cap.memsets ~= 0 or cap.graphs ~= 0 then
    io.stderr:write(string.format("grouped_bench.lua: %s: captured %d kernels, %d copies, %d "
                                  .. "memsets, %d graph launches; launches() counts %d kernels, "
                                  .. "%d copies\n", what, cap.kernels, cap.copies, cap.memsets,
                                  cap.graphs, kernels, copies))
  end
  return cap.kernels + cap.copies + cap.memsets + cap.graphs
end

local recipes = { bf16 = false, ["bf16-per-expert"] = false, ["bf16-per-expert-graphs"] = false,
                  delayed = function() return lutra.recipe.delayed { amax_history_len = 16 } end,
                  current = function() return lutra.recipe.current {} end }

local function random_splits(E, T, skew, seed)
  math.randomseed(seed)
  local s, left = {}, T
  for e = 1, E do
    local v
    if e == E then
      v = left
    elseif skew then -- about half the tokens to expert 1, the rest spread geometrically
      v = math.min(left, math.floor(left * (e == 1 and 0.5 or 0.3)))
    else
      v = math.min(left, math.max(0, math.floor(T / E + (math.random() - 0.5) * T / E)))
    end
    s[e], left = v, left - v
  end
  return s
end

-- a markdown table's heading (after an empty line unless first), header row and rule
local function table_head(title, columns, first)
  print((first and "" or "\n") .. "## " .. title)
  print("| " .. table.concat(columns, " | ") .. " |")
  print(string.rep("|---", #columns) .. "|")
end

-- the GPU parts' shapes: T tokens of K features into N, x and the dense Linear beside the grouped
local T_GPU, GPU_SHAPES = 16384, { { 4096, 4096 }, { 1024, 4096 } }
local function dense_at(K, N)
  return lutra.tensor({ T_GPU, K }, "bf16", DEV):randn(5),
         nn.Linear(K, N, { dtype = "bf16", device = DEV, bias = false, seed = 6 })
end

-- fn(g) for a bf16 GroupedLinear g of E experts, K -> N, without bias on the device; then g's
-- device splits checked (a bad split fails the bench) and g freed
local function with_grouped(E, K, N, fn)
  local g = nn.GroupedLinear(E, K, N, { dtype = "bf16", device = DEV, bias = false, seed = 7 })
  fn(g)
  g:check_splits()
  g:destroy()
end

local function host_part()
  local K, N = o["in"], o.out
  table_head(string.format("GroupedLinear host time per call (%s, %d rows per expert, %d -> %d)",
                           DEV, o.rows, K, N),
             { "experts", "mode", "call", "lutra us", "replay floor us", "ratio",
               "empty-launch floor us", "launches" }, true)
  load_floors(8 * o.rows, K, N) -- (hf_init's shapes are its GEMM floors', unused here)
  load_replay()
  if replay_stream then lutra.cuda_set_stream(replay_stream) end
  for _, E in ipairs { 8, 64 } do
    local T = E * o.rows
    for _, mode in ipairs { "bf16", "delayed", "current", "bf16-per-expert",
                            "bf16-per-expert-graphs" } do
      local m = nn.GroupedLinear(E, K, N, { dtype = "bf16", device = DEV, seed = 1 })
      -- the second path: host splits (a ring of Lua tables), one cuBLASLt GEMM per expert;
      -- "bf16-per-expert" with its split-pattern graphs off (16 patterns that keep changing),
      -- "-graphs" with 4 patterns that keep returning, each pass a graph replay once seen twice
      local graphs = mode == "bf16-per-expert-graphs"
      local per_expert = mode == "bf16-per-expert" or graphs
      if per_expert then
        m:set_path("per_expert")
        m:set_graph_capacity(graphs and 64 or 0)
      end
      local x = lutra.tensor({ T, K }, "bf16", DEV):randn(2)
      local dy = lutra.tensor({ T, N }, "bf16", DEV):randn(3)
      local ring = {}
      local ring_n = graphs and 4 or o.ring
      for i = 1, ring_n do
        ring[i] = per_expert and random_splits(E, T, false, i)
                  or lutra.from_table(random_splits(E, T, false, i), { E }, "i32", DEV)
      end
      local scope = recipes[mode] and lutra.autocast { recipe = recipes[mode]() } or nil
      local i = 0
      local function fwd()
        i = i % ring_n + 1
        if scope then scope:enter() end
        m:forward(x, ring[i])
        if scope then scope:exit() end
      end
      local function step() fwd(); m:backward(dy) end
      for _, fig in ipairs { { "forward", fwd, false }, { "forward+backward", step, true } } do
        local copies, kernels = launches(mode, fig[3])
        -- per expert: a staged host-to-device copy of the splits and E GEMMs per pass (with
        -- graphs: one graph launch per pass)
        if per_expert then copies, kernels = 1, E * (fig[3] and 3 or 1) end
        if graphs then kernels = fig[3] and 2 or 1 end
        local what = string.format("%d experts %s %s", E, mode, fig[1])
        local replay, cap, empty
        if not per_expert then
          replay, cap = replay_floor(fig[2], what, 2 * ring_n + 1)
          empty = floor_fn(copies, kernels)
        end
        -- timed on lutra's own stream, as a user's calls run by default (a caller's stream,
        -- which someone else may be capturing, costs each cached call a capture-status query:
        -- --caller-stream times that); the floor stays on the replay stream it was captured on
        if replay_stream and not o.caller_stream then
          lutra.synchronize(DEV)
          lutra.cuda_set_stream(nil)
          for _ = 1, 2 * ring_n + 1 do fig[2]() end -- the own stream's caches made
        end
        local alts = {}
        if replay then alts[#alts + 1] = replay end
        if empty then alts[#alts + 1] = empty end
        local t, m_alts = host_time(fig[2], o.calls, o.batches, alts)
        local f, fe = replay and m_alts[1], empty and m_alts[#alts]
        if replay then hf.hf_replay_free(REPLAY_SLOT) end
        if replay_stream and not o.caller_stream then
          lutra.synchronize(DEV)
          lutra.cuda_set_stream(replay_stream)
        end
        local function us(v) return v and string.format("%.2f", v * 1e6) or "n/a" end
        print(string.format("| %d | %s | %s | %.2f | %s | %s | %s | %d |", E, mode, fig[1],
                            t * 1e6, us(f), f and string.format("%.2f", t / f) or "n/a", us(fe),
                            launch_column(what, cap, copies, kernels)))
      end
      if CUDA then m:check_splits() end
    end
  end
  -- back to lutra's own stream for the GPU parts, the replay stream's work done
  if replay_stream then
    lutra.synchronize(DEV)
    lutra.cuda_set_stream(nil)
  end
end

-- the rows of grouped GEMM g (E experts, K -> N) on x under mode (run(f): f inside the mode's
-- scope) against the dense forward's time td: balanced and skewed routing, and for bf16 the
-- per-expert cuBLASLt path with the same (host) splits
local function gemm_rows(g, E, K, N, x, mode, run, td)
  local T = T_GPU
  local flops = 2 * T * K * N
  for _, skew in ipairs { false, true } do
    local host = random_splits(E, T, skew, 9)
    local sp = lutra.from_table(host, { E }, "i32", DEV)
    local function row(what, t)
      print(string.format("| %d | %d -> %d | %s | %s | %.0f | %.0f | %.2f |", E, K, N,
                          skew and "skewed" or "balanced", what, flops / t / 1e12,
                          flops / td / 1e12, td / t))
    end
    row(mode, gpu_time(function() run(function() g:forward(x, sp) end) end))
    if mode == "bf16" then
      g:set_path("per_expert")
      row("bf16 per-expert", gpu_time(function() g:forward(x, host) end))
      g:set_path("grouped")
    end
  end
end

local function gemm_part()
  if not CUDA then return end
  table_head("Grouped GEMM throughput (forward, tokens 16384, device splits)",
             { "experts", "in -> out", "routing", "mode", "grouped TFLOP/s", "dense TFLOP/s",
               "ratio" })
  for _, shape in ipairs(GPU_SHAPES) do
    local K, N = shape[1], shape[2]
    local x, dense = dense_at(K, N)
    for _, mode in ipairs { "bf16", "current" } do
      local scope = recipes[mode] and lutra.autocast { recipe = recipes[mode]() } or nil
      local function run(f) if scope then return scope:run(f) end return f() end
      local td = gpu_time(function() run(function() dense:forward(x) end) end)
      for _, E in ipairs { 8, 64 } do
        with_grouped(E, K, N, function(g) gemm_rows(g, E, K, N, x, mode, run, td) end)
      end
    end
  end
end

-- the FP8 grouped forward taken apart (see the header): microseconds per call and TFLOP/s
local function fp8_part()
  if not CUDA then return end
  local T = T_GPU
  table_head("FP8 grouped forward, where the time goes (tokens 16384, balanced device splits)",
             { "experts", "in -> out", "variant", "us/call", "TFLOP/s", "x dense FP8 (cached)" })
  local cur = lutra.autocast { recipe = lutra.recipe.current {} }
  local del = lutra.autocast { recipe = lutra.recipe.delayed { amax_history_len = 16 } }
  for _, shape in ipairs(GPU_SHAPES) do
    local K, N = shape[1], shape[2]
    local flops = 2 * T * K * N
    local x, dense = dense_at(K, N)
    cur:run(function() dense:forward(x, true) end)
    local td_cached = gpu_time(function() cur:run(function() dense:forward(x, false) end) end)
    local td_requant = gpu_time(function() cur:run(function() dense:forward(x) end) end)
    for _, E in ipairs { 8, 64 } do
      with_grouped(E, K, N, function(g)
        local sp = lutra.from_table(random_splits(E, T, false, 9), { E }, "i32", DEV)
        local rows = {
          { "dense FP8 current, weight quantized every call", td_requant },
          { "dense FP8 current, weight cached", td_cached },
          { "grouped bf16", gpu_time(function() g:forward(x, sp) end) },
          { "grouped current, weights quantized every call",
            gpu_time(function() cur:run(function() g:forward(x, sp) end) end) },
        }
        -- the weights quantized once under scope, then the forward reading them cached
        local function cached(scope)
          scope:run(function() g:forward(x, sp, true) end)
          return gpu_time(function() scope:run(function() g:forward(x, sp, false) end) end)
        end
        rows[#rows + 1] = { "grouped current, weights cached", cached(cur) }
        rows[#rows + 1] = { "grouped delayed, weights cached", cached(del) }
        for _, r in ipairs(rows) do
          print(string.format("| %d | %d -> %d | %s | %.1f | %.0f | %.2f |", E, K, N, r[1],
                              r[2] * 1e6, flops / r[2] / 1e12, td_cached / r[2]))
        end
      end)
    end
  end
end

-- A GroupedLinear training step (forward with the experts' weights quantized in the call, as
-- after every optimizer step, then backward: dgrad and wgrad) per mode: us per step, medians of
-- 5 rounds alternating the modes, and BF16's step over each FP8 step (issue 43's target: 1.3x)
local function step_part()
  if not CUDA then return end
  local T = T_GPU
  table_head("GroupedLinear training step (forward + backward, tokens 16384, device splits; "
             .. "weights quantized every step)",
             { "experts", "in -> out", "routing", "bf16 us", "delayed us", "current us",
               "bf16 / delayed", "bf16 / current" })
  local scopes = { delayed = lutra.autocast { recipe = recipes.delayed() },
                   current = lutra.autocast { recipe = recipes.current() } }
  for _, shape in ipairs(GPU_SHAPES) do
    local K, N = shape[1], shape[2]
    local x = lutra.tensor({ T, K }, "bf16", DEV):randn(5)
    local dy = lutra.tensor({ T, N }, "bf16", DEV):randn(6)
    for _, E in ipairs { 8, 64 } do
      with_grouped(E, K, N, function(g)
        for _, skew in ipairs { false, true } do
          local sp = lutra.from_table(random_splits(E, T, skew, 9), { E }, "i32", DEV)
          local fns = {
            bf16 = function() g:forward(x, sp); g:backward(dy) end,
            delayed = function() scopes.delayed:run(function() g:forward(x, sp, true) end)
                                 g:backward(dy) end,
            current = function() scopes.current:run(function() g:forward(x, sp, true) end)
                                 g:backward(dy) end,
          }
          local t = { bf16 = {}, delayed = {}, current = {} }
          for r = 1, o.quick and 2 or 5 do
            for _, m in ipairs { "bf16", "delayed", "current" } do
              t[m][r] = timing.time_per_call(DEV, fns[m], o.quick and 2 or 5, 1)
            end
          end
          local b, d, c = median(t.bf16), median(t.delayed), median(t.current)
          print(string.format("| %d | %d -> %d | %s | %.0f | %.0f | %.0f | %.2f | %.2f |", E, K,
                              N, skew and "skewed" or "balanced", b * 1e6, d * 1e6, c * 1e6,
                              b / d, b / c))
        end
      end)
    end
  end
end

if o.part == "host" or o.part == "all" then host_part() end
if o.part == "gemm" or o.part == "all" then gemm_part() end
if o.part == "fp8" or o.part == "all" then fp8_part() end
if o.part == "step" or o.part == "all" then step_part() end
