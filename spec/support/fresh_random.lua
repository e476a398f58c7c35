-- Fresh random integers for a spec: a generator of its own, seeded from the clock, whose seed the
-- spec names in its failures (math.random is one fixed-seed stream for the whole suite: drawing
-- from it would shift every later spec's inputs). Not a spec itself (no _spec in its name).
local M = {}

-- a generator: .seed, and .int(lo, hi), an integer in [lo, hi]. LUTRA_SPEC_SEED=N gives every
-- generator the seed N, to run a failure again.
function M.new()
  local g = { seed = tonumber(os.getenv("LUTRA_SPEC_SEED")) or os.time() % 2147483648 }
  local state = g.seed
  function g.int(lo, hi)
    state = (state * 1103515245 + 12345) % 2147483648
    return lo + math.floor(state / 256) % (hi - lo + 1)
  end
  return g
end

return M
