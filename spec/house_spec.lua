-- The house rules a newcomer relies on: DEVELOPING.md's Layout names every source folder of the
-- tree (so the map cannot fall behind a move), no source file in src/, kernels/ or lua/ is over
-- 600 lines, and README.md, which users read on a fresh machine, points at nothing outside the
-- repository.
local I = require("spec.support.install_tree")

local MAX_LINES = 600
local ROOTS = { "src", "kernels", "lua", "spec", "bench", "tools", "examples" }

local function lines_of(cmd)
  local p = assert(io.popen(cmd))
  local out = {}
  for l in p:lines() do out[#out + 1] = l end
  p:close()
  return out
end

-- the folders git tracks files in (any depth), or every folder where this is not a checkout
local function source_folders()
  local seen, list = {}, {}
  local files = lines_of("git ls-files " .. table.concat(ROOTS, " ") .. " 2>/dev/null")
  if #files == 0 then files = lines_of("find " .. table.concat(ROOTS, " ") .. " -type f") end
  for _, f in ipairs(files) do
    local dir = f:match("^(.*)/[^/]+$")
    while dir and not seen[dir] do
      seen[dir] = true
      list[#list + 1] = dir
      dir = dir:match("^(.*)/[^/]+$")
    end
  end
  table.sort(list)
  return list, files
end

describe("the house", function()
  local folders, files = source_folders()

  it("finds the tree's folders", function()
    assert.is_true(#folders >= #ROOTS, "no folders found under " .. table.concat(ROOTS, " "))
  end)

  it("describes every source folder in DEVELOPING.md's Layout", function()
    local doc = I.read("DEVELOPING.md")
    local layout = doc:match("\n## Layout\n(.-)\n## ") or doc:match("\n## Layout\n(.*)$")
    assert(layout, "DEVELOPING.md has no '## Layout' section")
    local missing = {}
    for _, dir in ipairs(folders) do
      if not layout:find("`" .. dir .. "/`", 1, true) then missing[#missing + 1] = dir .. "/" end
    end
    assert(#missing == 0, "DEVELOPING.md's Layout does not describe: " .. table.concat(missing, ", ")
      .. " (write each as `path/` with what it holds)")
  end)

  it("keeps source files in src/, kernels/ and lua/ at " .. MAX_LINES .. " lines or fewer", function()
    local long = {}
    for _, f in ipairs(files) do
      if f:match("^src/") or f:match("^kernels/") or f:match("^lua/") then
        local n = 0
        for _ in io.lines(f) do n = n + 1 end
        if n > MAX_LINES then long[#long + 1] = f .. " (" .. n .. ")" end
      end
    end
    assert(#long == 0, "over " .. MAX_LINES .. " lines: " .. table.concat(long, ", "))
  end)

  it("keeps README.md inside the repository", function()
    local readme = I.read("README.md")
    assert.is_nil(readme:find("../shared", 1, true), "README.md points at ../shared")
    assert.is_nil(readme:find("BENCHMARKS.md", 1, true), "README.md points at BENCHMARKS.md")
  end)
end)
