-- Where a GroupedLinear forward's host time goes (a tool: nothing is asserted): the forward of
-- bench/grouped_bench.lua's host part (16 rows per expert, 64 -> 64, device splits from a ring
-- of 16) in a loop under gperftools' CPU profiler (libprofiler, ProfilerStart/ProfilerStop
-- around the loop only), batches of 200 calls with a sync between them as the bench times
-- them. An unsynced loop fills the driver's launch queue, and its samples then show the host
-- waiting for the GPU (sched_yield inside cuGraphLaunch). The syncs' own samples are those
-- outside lutra_grouped_forward.
--   CPUPROFILE_FREQUENCY=4000 luajit bench/profile_grouped.lua OUT_PREFIX [experts] [calls]
-- writes OUT_PREFIX-bf16.prof and OUT_PREFIX-delayed.prof; read them with
--   google-pprof --text "$(command -v luajit)" OUT_PREFIX-bf16.prof
local lutra = require("lutra")
local ffi, nn = lutra.ffi, lutra.nn
ffi.cdef [[ int ProfilerStart(const char *fname); void ProfilerStop(void); ]]
local prof = ffi.load(os.getenv("LIBPROFILER") or "libprofiler.so.0")
local prefix, E, calls = arg[1] or "grouped", tonumber(arg[2] or 8), tonumber(arg[3] or 2000000)
local rows, K, N = 16, 64, 64
local T = E * rows
for _, mode in ipairs { "bf16", "delayed" } do
  local m = nn.GroupedLinear(E, K, N, { dtype = "bf16", device = "cuda", seed = 1 })
  local x = lutra.tensor({ T, K }, "bf16", "cuda"):randn(2)
  local ring = {}
  for i = 1, 16 do
    math.randomseed(i)
    local s, left = {}, T
    for e = 1, E do
      local share = math.floor(T / E + (math.random() - 0.5) * T / E)
      local v = e == E and left or math.min(left, math.max(0, share))
      s[e], left = v, left - v
    end
    ring[i] = lutra.from_table(s, { E }, "i32", "cuda")
  end
  local scope = mode == "delayed"
                and lutra.autocast { recipe = lutra.recipe.delayed { amax_history_len = 16 } }
                or nil
  local i = 0
  local function fwd()
    i = i % 16 + 1
    if scope then scope:enter() end
    m:forward(x, ring[i])
    if scope then scope:exit() end
  end
  for _ = 1, 2000 do fwd() end
  lutra.synchronize("cuda")
  local n = 200 * math.floor((mode == "bf16" and calls or calls / 4) / 200)
  prof.ProfilerStart(prefix .. "-" .. mode .. ".prof")
  local timed = 0
  for _ = 1, n / 200 do
    local t1 = lutra.now()
    for _ = 1, 200 do fwd() end
    timed = timed + (lutra.now() - t1)
    lutra.synchronize("cuda")
  end
  local t = timed / n
  prof.ProfilerStop()
  lutra.synchronize("cuda")
  print(string.format("%d experts %s forward: %.3f us a call over %d calls (profiled, "
                      .. "syncs excluded)", E, mode, t * 1e6, n))
  m:check_splits()
  m:destroy()
end
