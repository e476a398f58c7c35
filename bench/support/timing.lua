-- Timing helpers shared by the benchmark scripts (bench/*.lua, run from the repository root:
-- require("bench.support.timing")). Not a benchmark itself.
local lutra = require("lutra")

local M = {}

-- The median of the numbers in t (t itself is not reordered; of an even count, the upper of the
-- two middle values), then the smallest and the largest.
function M.median(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  return s[math.floor(#s / 2) + 1], s[1], s[#s]
end

-- Seconds per call of fn on device: one warm-up call, then `runs` runs of `iters` calls each
-- between two synchronizations; the median of the runs' wall time / iters.
function M.time_per_call(device, fn, iters, runs)
  fn()
  lutra.synchronize(device)
  local t = {}
  for r = 1, runs do
    local t0 = lutra.now()
    for _ = 1, iters do fn() end
    lutra.synchronize(device)
    t[r] = (lutra.now() - t0) / iters
  end
  return (M.median(t))
end

-- Seconds per call of fn on device, on average: `warmups` calls, then `reps` calls between two
-- synchronizations.
function M.mean_time(device, fn, reps, warmups)
  for _ = 1, warmups do fn() end
  lutra.synchronize(device)
  local t0 = lutra.now()
  for _ = 1, reps do fn() end
  lutra.synchronize(device)
  return (lutra.now() - t0) / reps
end

return M
