#!/usr/bin/env luajit
-- Host time per call of lutra's Lua entry points on a device, next to the floors of the GPU work
-- each call issues and to PyTorch doing the same work. Part of bench/host_suite.sh (the one
-- command on the GPU machine, which builds bench/host_floors.cu, runs bench/torch_overhead.py
-- and hands their outputs to this script); on its own:
--   luajit bench/host_overhead.lua [--device cuda|cpu] [--batch 64] [--in 64] [--out 64]
--          [--hidden 128] [--batches 15] [--floors-lib build/libhost_floors.so] [--torch FILE]
--          [--counts FILE] [--table FILE] [--quick]
--   LD_PRELOAD=build/launch_count.so luajit bench/host_overhead.lua --count FILE [shapes]
-- Method (the same in all three programs): per figure one warm-up batch, then 15 batches of
-- `calls` calls, the device synchronized before each batch so the queue starts empty; the host
-- wall time of the batch's loop divided by calls; the median over the batches. On cuda a batch
-- issues at most ~400 launches and GEMMs, so the queue never fills. Each figure's floor is the
-- raw work it issues (the launches and GEMMs, as counted from the code, the `work` of each
-- figure below, or with --counts as counted by bench/launch_count.so in a separate run, --count,
-- which also checks the code's counts), issued through bench/host_floors.cu's library loaded in
-- THIS process and timed by the same loop, its batches alternating with the figure's: the ratio
-- of the two medians is measured side by side, on the same core and in the same seconds.
-- --device cpu runs the same figures on the CPU backend (floors and PyTorch are then n/a), as
-- a smoke test that any machine can run; --quick uses 3 batches.
local lutra = require("lutra")
local floors = require("bench.support.floors")
local timing = require("bench.support.timing")
local ffi = lutra.ffi

-- the command line, parsed with lua-argparse (Debian: lua-argparse)
local function parse(argv)
  local argparse = require("lutra.cli").argparse("host_overhead.lua")
  local p = argparse("host_overhead.lua", "Host time per call of lutra's Lua entry points beside "
                     .. "the floors of the GPU work they issue and PyTorch doing the same work.")
  p:option("--device", "cuda or cpu", "cuda"):choices({ "cuda", "cpu" })
  p:option("--batch", "rows M", "64", tonumber)
  p:option("--in", "input features K", "64", tonumber)
  p:option("--out", "output features N", "64", tonumber)
  p:option("--hidden", "hidden width H", "128", tonumber)
  p:option("--batches", "timed batches per figure", "15", tonumber)
  p:option("--floors-lib", "bench/host_floors.cu's library (default build/libhost_floors.so)")
   :target("floors-lib")
  p:option("--torch", "bench/torch_overhead.py's figures")
  p:option("--counts", "launch and GEMM counts from a --count run")
  p:option("--count", "count launches and GEMMs (under build/launch_count.so) into this file")
  p:option("--table", "also write the table to this file")
  p:flag("--quick", "3 batches per figure")
  local o = p:parse(argv)
  if o.quick then o.batches = 3 end
  return o
end

local opt = parse(arg)
local DEV, M, K, N, H = opt.device, opt.batch, opt["in"], opt.out, opt.hidden
local CUDA = DEV == "cuda"
if CUDA and not lutra.device_available("cuda") then
  io.stderr:write("host_overhead.lua: lutra cannot use cuda here (no GPU, or a build without ",
                  "CUDA: make CUDA=1); run with --device cpu for the CPU backend\n")
  os.exit(1)
end
for _, d in ipairs { M, K, N, H } do
  assert(d % 16 == 0, "FP8 needs --batch, --in, --out and --hidden to be multiples of 16")
end

-- ---- inputs from the other programs -------------------------------------------------------

-- "<tag> <name> <value> ... # what" lines of a file into {name = value} and {name = what};
-- other '#' lines into notes.
local function read_figures(path, tag)
  local values, whats, notes = {}, {}, {}
  if not path then return values, whats, notes end
  local f = io.open(path)
  if not f then return values, whats, notes end
  for line in f:lines() do
    local name, v = line:match("^" .. tag .. "%s+(%S+)%s+(%S+)")
    if name then
      values[name] = tonumber(v)
      whats[name] = line:match("#%s*(.-)%s*$")
    elseif line:match("^#") then
      notes[#notes + 1] = (line:gsub("^#%s*", ""))
    end
  end
  f:close()
  return values, whats, notes
end

local torch, torch_whats, torch_notes = read_figures(opt.torch, "torch")
local counted = {}
if opt.counts then
  local f = io.open(opt.counts)
  if f then
    for line in f:lines() do
      local key, l, ms, mc, g = line:match("^count%s+(%S+)%s+(%d+)%s+(%d+)%s+(%d+)%s+(%d+)")
      if key then
        -- columns 5-7 (later counters): mallocs, frees, graph launches
        local rest = {}
        for v in line:match("^count%s+%S+%s+%d+%s+%d+%s+%d+%s+%d+(.*)$"):gmatch("%d+") do
          rest[#rest + 1] = tonumber(v)
        end
        counted[key] = { launches = tonumber(l), memsets = tonumber(ms), memcpys = tonumber(mc),
                         matmuls = tonumber(g), graphs = rest[3] or 0 }
      end
    end
    f:close()
  end
end

-- ---- the launch counter (only when bench/launch_count.so is preloaded) --------------------

ffi.cdef [[ void lutra_launch_counts(uint64_t out[7]); ]]
local have_counter, read_counter = pcall(function() return ffi.C.lutra_launch_counts end)
local counter_box = ffi.new("uint64_t[7]")
local function counter()
  read_counter(counter_box)
  local c = {}
  for i = 0, 6 do c[i + 1] = tonumber(counter_box[i]) end
  return c
end
if opt.count and not have_counter then
  io.stderr:write("host_overhead.lua: --count needs LD_PRELOAD=build/launch_count.so\n")
  os.exit(1)
end

-- ---- the floors: raw CUDA / cuBLASLt work issued from this process (cuda) ------------------

local hf, floor_ids, floor_notes = nil, {}, {}
if CUDA and not opt.count then
  local why
  hf, why = floors.open(opt["floors-lib"], M, K, N)
  if not hf then
    io.stderr:write("host_overhead.lua: ", why, ": build the floors' library as ",
                    "bench/host_suite.sh does, or pass --floors-lib\n")
    os.exit(1)
  end
  floor_ids = floors.ids(hf, true)
  floor_notes[1] = "floors: raw calls issued from this LuaJIT process by bench/host_floors.cu (" ..
    ffi.string(hf.hf_describe()) .. "), batches alternating with the figure's"
end

-- A function issuing the raw work of parts ({floor name, count} pairs) once. An epilogue GEMM
-- the heuristic refused in host_floors is issued as the plain GEMM of its name's prefix.
local function floor_id(name)
  return floor_ids[name] or floor_ids[name:match("^(lt_%w+_%w+)")] or error("no floor " .. name)
end
local function floor_fn(parts)
  local ids, ns = {}, {}
  for i, p in ipairs(parts) do ids[i], ns[i] = floor_id(p[1]), p[2] end
  local n = #ids
  return function()
    for i = 1, n do
      if hf.hf_issue(ids[i], ns[i]) ~= 0 then error("hf_issue failed (see above)") end
    end
  end
end

-- ---- timing -------------------------------------------------------------------------------

local median = timing.median -- the median, the smallest, the largest

local function sync()
  lutra.synchronize(DEV)
  if hf and hf.hf_sync() ~= 0 then error("hf_sync failed (see above)") end
end

-- A loop calling fn, compiled anew for each figure so that each gets its own LuaJIT trace
-- (one loop shared by all figures would pile up side traces for the different callees).
local LOOP = "local fn = ... return function(calls) for _ = 1, calls do fn() end end"
local function loop_of(fn) return assert(load(LOOP, "=bench_loop"))(fn) end

-- Median host us per call of fn over opt.batches batches of `calls` calls, after a warm-up
-- batch; span: us per call until the device has finished too (well above us: GPU-bound).
-- With floor (a function issuing the raw work fn's call issues), a batch of it precedes each
-- batch of fn, and its median comes back last.
local function measure(calls, fn, floor)
  local loop, floor_loop = loop_of(fn), floor and loop_of(floor)
  loop(calls)
  if floor_loop then floor_loop(calls) end
  sync()
  local us, span, floor_us = {}, {}, {}
  for b = 1, opt.batches do
    if floor_loop then
      sync()
      local t0 = lutra.now()
      floor_loop(calls)
      floor_us[b] = (lutra.now() - t0) / calls * 1e6
    end
    sync()
    local t0 = lutra.now()
    loop(calls)
    local t1 = lutra.now()
    sync()
    local t2 = lutra.now()
    us[b] = (t1 - t0) / calls * 1e6
    span[b] = (t2 - t0) / calls * 1e6
  end
  local med, lo, hi = median(us)
  return med, lo, hi, (median(span)), floor_loop and (median(floor_us)) or nil
end

-- Calls per batch: on cuda at most ~400 launches and GEMMs queued per batch; on the CPU a batch
-- of about 5 ms (probed), at least 3 calls.
local function calls_for(fig, fn)
  if fig.calls then return fig.calls end
  if CUDA then
    return math.max(10, math.min(200, math.floor(400 / fig.ops)))
  end
  fn()
  local t0 = lutra.now()
  for _ = 1, 3 do fn() end
  local per = (lutra.now() - t0) / 3
  return math.max(3, math.min(2000, math.floor(5e-3 / math.max(per, 1e-9))))
end

-- ---- the figures (bench/support/host_figures.lua) ----------------------------------------
local figures = require("bench.support.host_figures")(lutra, DEV, M, K, N, H)


-- ---- count mode: what each figure issues, as the preloaded counter sees it -----------------

if opt.count then
  local lines = {}
  for _, fig in ipairs(figures) do
    local fn = fig.setup() or function() end
    for _ = 1, 3 do fn() end -- plans, buffers and quantizers exist after the first calls
    sync()
    local a = counter()
    fn()
    local b = counter()
    sync()
    local line = string.format("count %s %d %d %d %d %d %d %d", fig.key, b[1] - a[1], b[2] - a[2],
                               b[3] - a[3], b[4] - a[4], b[5] - a[5], b[6] - a[6], b[7] - a[7])
    lines[#lines + 1] = line
    print(line .. "  # launches memsets memcpys matmuls mallocs frees graph-launches: " .. fig.name)
  end
  local f = assert(io.open(opt.count, "w"))
  f:write("# per call, after 3 warm-up calls; device ", DEV, "\n", table.concat(lines, "\n"), "\n")
  f:close()
  os.exit(0)
end

-- ---- floors -------------------------------------------------------------------------------

-- The raw work a figure issues, as {floor name, count} parts, and its description. With a
-- count from launch_count.so that differs from the code's table, the count wins: launches at
-- the empty-launch floor, GEMMs cycling through the figure's GEMM kinds (marked approximate).
local function floor_parts(fig)
  local w, c = fig.work, counted[fig.key]
  local launches, big = w.launch or 0, w.launch_big or 0
  local memsets, memcpys, graph = w.memset or 0, w.memcpy or 0, w.graph or 0
  local cached = 0 -- graph launches of calls lutra cached (counted)
  local gemms, approx = {}, w.approx
  for i, g in ipairs(w.matmul or {}) do gemms[i] = g end
  local note = ""
  if c then
    local diff = c.launches ~= launches + big or c.memsets ~= memsets or c.memcpys ~= memcpys
      or c.matmuls ~= #gemms or c.graphs ~= graph
    if diff then
      note = string.format(" (counted; the code table says %d launches, %d memsets, %d GEMMs)",
                           launches + big, memsets, #gemms)
      big = math.min(big, c.launches)
      launches, memsets, memcpys = c.launches - big, c.memsets, c.memcpys
      if c.graphs ~= graph and #gemms > 0 and c.graphs - graph == #gemms - c.matmuls then
        -- lutra replayed those GEMMs as cached graphs (src/backend/cuda/call_graphs.c)
        note = string.format(" (counted: %d of the %d GEMMs as cached graph launches)",
                             c.graphs - graph, #gemms)
      elseif c.graphs > graph then
        -- lutra replayed GEMMs and kernel launches as cached graphs (call_graphs.c)
        note = string.format(" (counted: %d GEMMs and %d launches of the code's table as %d " ..
                             "cached graph launches)", #gemms - c.matmuls,
                             (w.launch or 0) + (w.launch_big or 0) - c.launches, c.graphs - graph)
      end
      -- a cached call's graph (1-3 nodes) at the cheapest graph launch's floor; the code's
      -- own graphs (whole steps) at the 4-kernel graph's
      cached = math.max(0, c.graphs - graph)
      if c.matmuls ~= #gemms then
        local kinds = #gemms > 0 and gemms or { "lt_bf16_fprop" }
        gemms, approx = {}, c.matmuls > 0
        for i = 1, c.matmuls do gemms[i] = kinds[(i - 1) % #kinds + 1] end
      end
    else
      note = " (counted)"
    end
  end
  local parts, by_kind = {}, {}
  local function add(name, n) if n > 0 then parts[#parts + 1] = { name, n } end end
  add("launch", launches)
  add("launch_big", big)
  add("memset", memsets)
  add("memcpy", memcpys)
  add("graph_launch", graph)
  add("graph_launch1", cached)
  for _, g in ipairs(gemms) do
    if not by_kind[g] then
      by_kind[g] = { g, 0 }
      parts[#parts + 1] = by_kind[g]
    end
    by_kind[g][2] = by_kind[g][2] + 1
  end
  local words = {}
  local nl = launches + big
  if nl > 0 then words[#words + 1] = nl .. (nl == 1 and " launch" or " launches") end
  if memsets > 0 then words[#words + 1] = memsets .. " memset" .. (memsets > 1 and "s" or "") end
  if memcpys > 0 then words[#words + 1] = memcpys .. " memcpy" .. (memcpys > 1 and "s" or "") end
  if #gemms > 0 then words[#words + 1] = #gemms .. (#gemms == 1 and " GEMM" or " GEMMs") end
  local ng = graph + cached
  if ng > 0 then words[#words + 1] = ng .. (ng == 1 and " graph launch" or " graph launches") end
  local what = #words > 0 and table.concat(words, " + ") .. note or "no GPU work"
  return parts, what, approx
end

-- ---- run ----------------------------------------------------------------------------------

local header = string.format(
  "lutra %s host overhead, %s, %s (JIT %s), device %s; Linear x [%d, %d] -> [%d, %d], " ..
  "MLP %d-%d-%d-%d-%d; median of %d batches after a warm-up batch",
  lutra.version(), os.date("!%Y-%m-%d %H:%M UTC"), jit.version, jit.status() and "on" or "off",
  DEV, M, K, M, N, K, H, H, H, N, opt.batches)
print(header)
-- the raw floors on their own
local floors = {}
if hf then
  for name in pairs(floor_ids) do
    floors[name] = measure(200, floor_fn { { name, 1 } })
    print(string.format("floor %s %.4f", name, floors[name]))
  end
end
local results = {}
for _, fig in ipairs(figures) do
  local fn = fig.setup()
  if not fn then goto continue end
  local calls = calls_for(fig, fn)
  local parts, what, approx = floor_parts(fig)
  local with_floor = hf and #parts > 0 and floor_fn(parts) or nil
  local us, lo, hi, span, fl = measure(calls, fn, with_floor)
  results[#results + 1] = { fig = fig, us = us, lo = lo, hi = hi, span = span, calls = calls,
                            floor = fl, what = what, approx = approx }
  print(string.format("lutra %s %.4f min=%.4f max=%.4f calls=%d span=%.4f floor=%s  # %s", fig.key,
                      us, lo, hi, calls, span, fl and string.format("%.4f", fl) or "n/a", fig.name))
  if CUDA and span > 1.5 * us and fig.key ~= "autocast" then
    print(string.format("# warning: %s: the device takes %.2f us per call, the host %.2f us: " ..
                        "GPU-bound, use smaller shapes", fig.key, span, us))
  end
  io.stdout:flush()
  ::continue::
end

-- ---- the table ----------------------------------------------------------------------------

local floor_names = {
  { "launch", "empty kernel launch" },
  { "launch_big", "kernel launch with 7 KiB of parameters" },
  { "memset", "cudaMemsetAsync (4 bytes)" },
  { "memcpy", "cudaMemcpyAsync D2D (256 bytes)" },
  { "lt_bf16_fprop", "cublasLtMatmul BF16, fprop (TN)" },
  { "lt_bf16_dgrad", "cublasLtMatmul BF16, dgrad (NN)" },
  { "lt_bf16_wgrad", "cublasLtMatmul BF16, wgrad (NT)" },
  { "lt_fp8_fprop", "cublasLtMatmul FP8 E4M3, fprop (TN, fast accum)" },
  { "lt_fp8_dgrad", "cublasLtMatmul FP8 E4M3 x E5M2, dgrad (TN)" },
  { "lt_fp8_wgrad", "cublasLtMatmul FP8 E4M3 x E5M2, wgrad (TN)" },
  { "lt_set_attr", "cublasLtMatmulDescSetAttribute (not a launch)" },
  { "graph_launch", "cudaGraphLaunch, graph of 4 empty kernels" },
  { "graph_launch1", "cudaGraphLaunch, graph of 1 empty kernel" },
  { "lt_bf16_fprop_bias", "cublasLtMatmul BF16, fprop + BIAS" },
  { "lt_bf16_fprop_gelu_aux_bias", "cublasLtMatmul BF16, fprop + GELU_AUX_BIAS" },
  { "lt_bf16_dgrad_dgelu", "cublasLtMatmul BF16, dgrad + DGELU" },
  { "lt_bf16_wgrad_bgradb", "cublasLtMatmul BF16, wgrad + BGRADB" },
  { "lt_fp8_fprop_bias", "cublasLtMatmul FP8, fprop + BIAS" },
  { "lt_fp8_fprop_gelu_aux_bias", "cublasLtMatmul FP8, fprop + GELU_AUX_BIAS" },
}
local torch_names = {
  autocast = "torch.autocast('cuda', bf16) enter+exit",
  linear_fwd = "nn.Linear BF16 forward (grad on)",
  linear_fwdbwd = "nn.Linear BF16 forward + backward",
  fp8_linear = "eager per-tensor FP8 linear (amax, scale, cast, torch._scaled_mm)",
  adamw_step = "AdamW(fused=True) step, same MLP",
  mlp_step = "4-layer MLP step, BF16 params, AdamW(fused=True)",
  mlp_step_fp8 = "4-layer MLP step, FP8 Linears in eager PyTorch (torch._scaled_mm), AdamW(fused=True)",
  ln_linear_fwd = "F.layer_norm + nn.Linear BF16 forward (grad on)",
  ln_linear_fwdbwd = "F.layer_norm + nn.Linear BF16 forward + backward",
  ln_mlp_fwd = "F.layer_norm + Linear + GELU(tanh) + Linear BF16 forward (grad on)",
  ln_mlp_fwdbwd = "F.layer_norm + Linear + GELU(tanh) + Linear BF16 forward + backward",
}

local function fmt_ratio(v)
  if v == nil then return "n/a" end
  return (v >= 0.1 and string.format("%.2f", v) or string.format("%.2g", v)) .. "x"
end
local function fmt_us(v)
  if v == nil then return "n/a" end
  return v < 1 and string.format("%.4f", v) or string.format("%.2f", v)
end

local lines = {}
local function emit(s) lines[#lines + 1] = s end
emit(header)
for _, n in ipairs(floor_notes) do emit("- floors: " .. n) end
for _, n in ipairs(torch_notes) do emit("- PyTorch: " .. n) end
emit("")
emit("| figure | us/call | floor: raw work issued | floor us | ratio to floor | PyTorch us " ..
     "| ratio to PyTorch | target | met |")
emit("|---|---:|---|---:|---:|---:|---:|---|---|")
for _, f in ipairs(floor_names) do
  if floors[f[1]] then
    emit(string.format("| floor: %s | %s | | | | | | | |", f[2], fmt_us(floors[f[1]])))
  end
end
local met_all, checked = true, 0
for _, r in ipairs(results) do
  local fig = r.fig
  local fl, what, approx = r.floor, r.what, r.approx
  if not CUDA then fl, what = nil, "n/a (" .. DEV .. ")" end
  local t = CUDA and fig.torch and torch[fig.torch] or nil
  local rf = fl and r.us / fl or nil
  local rt = t and r.us / t or nil
  local target, met = "", ""
  local tg = fig.target
  if tg then
    local v
    if tg.kind == "abs" then
      target, v = string.format("< %.2f us", tg.max), r.us
    elseif tg.kind == "floor" then
      target, v = string.format("<= %.2fx floor", tg.max), rf
    else
      target, v = string.format("<= %.2fx PyTorch (%gx cheaper)", tg.max, 1 / tg.max), rt
    end
    if v == nil then
      met = "n/a"
    elseif v < tg.max or (tg.kind ~= "abs" and v == tg.max) then
      met, checked = "yes", checked + 1
    else
      met, met_all, checked = "**no**", false, checked + 1
    end
  end
  emit(string.format("| %s | %s | %s | %s | %s | %s | %s | %s | %s |", fig.name, fmt_us(r.us), what,
                     (fl and approx) and "~" .. fmt_us(fl) or fmt_us(fl), fmt_ratio(rf), fmt_us(t),
                     fmt_ratio(rt), target, met))
end
local gpu_bound = {}
for _, r in ipairs(results) do
  if CUDA and r.fig.key ~= "autocast" and r.span > 1.5 * r.us then
    gpu_bound[#gpu_bound + 1] = string.format("%s (device %.2f us per call)", r.fig.name, r.span)
  end
end
emit("")
emit("PyTorch figures: " .. (function()
  local seen, out = {}, {}
  for _, r in ipairs(results) do
    local k = r.fig.torch
    if k and not seen[k] then
      seen[k] = true
      out[#out + 1] = (torch_whats[k] or torch_names[k]) .. (torch[k] and "" or " (n/a)")
    end
  end
  return table.concat(out, "; ")
end)() .. ".")
local extras = {}
for k, v in pairs(torch) do
  if not torch_names[k] then
    extras[#extras + 1] = string.format("%s: %s us", torch_whats[k] or k, fmt_us(v))
  end
end
table.sort(extras)
if #extras > 0 then emit("PyTorch, more: " .. table.concat(extras, "; ") .. ".") end
emit("Each figure's floor is its raw work issued from the same process, batches alternating " ..
     "with the figure's (the MLP's GEMMs at the Linear shape, with their epilogues); floors " ..
     "marked ~ guessed GEMM kinds where the count differed from the code's table.")
if #gpu_bound > 0 then
  emit("GPU-bound (the device, not the host, set the pace; use smaller shapes): " ..
       table.concat(gpu_bound, "; ") .. ".")
end
emit(string.format("Targets: %d checked, %s.", checked,
                   checked == 0 and "none could be checked" or (met_all and "all met" or "NOT all met")))

print("")
print(table.concat(lines, "\n"))
if opt.table then
  local f = assert(io.open(opt.table, "w"))
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
  print("\n(table written to " .. opt.table .. ")")
end
