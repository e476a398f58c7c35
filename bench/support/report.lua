-- How the benchmark scripts print their figures (bench/*.lua, run from the repository root:
-- require("bench.support.report")). Not a benchmark itself.
local M = {}

-- A title line, then each table {head = "| a | b |", align = "|---|---:|", rows = {...}}
-- after a blank line, written to stdout and, when out is given, to that file as well.
function M.tables(title, tables, out)
  local lines = { title }
  for _, t in ipairs(tables) do
    lines[#lines + 1] = ""
    lines[#lines + 1] = t.head
    lines[#lines + 1] = t.align
    for _, r in ipairs(t.rows) do lines[#lines + 1] = r end
  end
  local text = table.concat(lines, "\n") .. "\n"
  io.write(text)
  if out then
    local f = assert(io.open(out, "w"))
    f:write(text)
    f:close()
  end
end

return M
