-- Central finite differences for the gradient specs. Not a spec itself (no _spec in its name).
local M = {}

-- d f / d vec[i] for every i, (f(vec + h e_i) - f(vec - h e_i)) / 2h: f reads vec, through
-- set(vec) before each evaluation when set is given; vec is left as it was
function M.central(vec, f, h, set)
  local out = {}
  for i = 1, #vec do
    local v = vec[i]
    vec[i] = v + h
    if set then set(vec) end
    local lp = f()
    vec[i] = v - h
    if set then set(vec) end
    local lm = f()
    vec[i] = v
    if set then set(vec) end
    out[i] = (lp - lm) / (2 * h)
  end
  return out
end

return M
