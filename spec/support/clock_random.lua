-- Fresh random integers for one spec file: a linear congruential generator of the file's own,
-- seeded from the clock (name g.seed in failures so that a run can be repeated). math.random is
-- one stream for the whole suite: drawing from it would shift every later spec's "random" inputs.
-- Not a spec itself (no _spec in its name).
--   local g = require("spec.support.clock_random")()
--   g.random(lo, hi)   an integer in [lo, hi]
return function()
  local g = { seed = os.time() % 2147483648 }
  local state = g.seed
  function g.random(lo, hi)
    state = (state * 1103515245 + 12345) % 2147483648
    return lo + math.floor(state / 256) % (hi - lo + 1)
  end
  return g
end
