-- The packed input of nn.DotProductAttention's module protocol, for specs: each row laid out
-- [q heads | k heads | v heads]. Not a spec itself (no _spec in its name).
local M = {}

-- parts: three flat 1-based tables of rows of widths[1], widths[2], widths[3] elements; the
-- packed flat table of rows rows
function M.pack(parts, widths, rows)
  local x, W = {}, widths[1] + widths[2] + widths[3]
  for r = 0, rows - 1 do
    local at = r * W
    for p = 1, 3 do
      for e = 1, widths[p] do x[at + e] = parts[p][r * widths[p] + e] end
      at = at + widths[p]
    end
  end
  return x
end

-- the packed flat table x split into its three parts (M.pack's inverse)
function M.split(x, widths, rows)
  local parts, W = { {}, {}, {} }, widths[1] + widths[2] + widths[3]
  for r = 0, rows - 1 do
    local at = r * W
    for p = 1, 3 do
      for e = 1, widths[p] do parts[p][r * widths[p] + e] = x[at + e] end
      at = at + widths[p]
    end
  end
  return parts
end

return M
