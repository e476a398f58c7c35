-- Helpers of the specs under mpirun: the world group (MPI initialized once per process), data a
-- rank can recompute for any other rank, NMSE.
local lutra = require("lutra")
local M = {}

local world
function M.world()
  if not world then
    lutra.dist.init()
    world = lutra.dist.world()
  end
  return world
end

-- n values uniform in [-1, 1) from a seed that names (rank, salt): every rank can rebuild it
function M.rank_data(n, rank, salt, dtype)
  local t = lutra.tensor({ n }, dtype or "f32")
  t:uniform(1000003 * salt + rank, -1, 1)
  return t
end

function M.nmse(got, want)
  local num, den = 0, 0
  for i = 1, #want do
    num = num + (got[i] - want[i]) ^ 2
    den = den + want[i] ^ 2
  end
  return num / math.max(den, 1e-300)
end

return M
