-- The Lua API reference (make doc: LDoc over config.ld's files): LDoc runs without a warning,
-- every public function and method of those files is in it with a summary (an item without a
-- `---` doc comment would silently be left out), and the lutra module's usage example (several
-- modules, FP8 for the middle one only, one optimizer) runs and trains. Skipped without ldoc
-- (Debian's lua-ldoc).
local I = require("spec.support.install_tree")

-- module functions that other front files use and users do not
local internal = { ["lutra.tensor"] = { borrow = true } }

local function config_files()
  local files = {}
  for f in I.read("config.ld"):match("file%s*=%s*(%b{})"):gmatch('"([^"]+)"') do
    files[#files + 1] = f
  end
  return files
end

local function module_name(path)
  local src = I.read(path)
  return src:match("\n%-%- @module ([%w_.]+)") or src:match("^%-%-%- .-%-%- @module ([%w_.]+)"), src
end

describe("the Lua API reference", function()
  if not I.sh("command -v ldoc") then
    pending("skipped: ldoc is not installed (apt-get install lua-ldoc)")
    return
  end

  it("builds with LDoc without warnings", function()
    local _, dir = I.sh("mktemp -d /tmp/lutra-doc-XXXXXX")
    dir = dir:gsub("%s+$", "")
    local ok, out = I.sh("ldoc --fatalwarnings -c config.ld -d " .. dir .. " .")
    local html = io.open(dir .. "/modules/lutra.nn.html", "r")
    I.sh("rm -rf " .. dir)
    assert(ok, out)
    assert.is_nil(out:lower():find("warning", 1, true), out)
    assert(html, "no page for lutra.nn in\n" .. out)
    html:close()
  end)

  it("documents every public function and method with a summary", function()
    local ok, out = I.sh("LUA_PATH='tools/?.lua;;' ldoc -c config.ld --filter ldoc_items.list .")
    assert(ok, out)
    local documented = {}
    for mod, name, summary in out:gmatch("([^\t\n]+)\t[^\t\n]*\t([^\t\n]+)\t([^\n]*)") do
      documented[mod .. " " .. name] = summary
    end
    local files, checked = config_files(), 0
    assert.is_true(#files >= 8, "config.ld lists " .. #files .. " files")
    for _, path in ipairs(files) do
      local mod, src = module_name(path)
      assert(mod, path .. " has no @module")
      local public = {}
      for name in src:gmatch("\nfunction M%.([%w_]+)%(") do
        if not (internal[mod] and internal[mod][name]) then public[#public + 1] = name end
      end
      for class, name in src:gmatch("\nfunction (%u[%w_]*):([%w_]+)%(") do
        public[#public + 1] = class .. ":" .. name
      end
      for name in src:gmatch("\nM%.(%u[%w_]*) = activation%(") do public[#public + 1] = name end
      for _, name in ipairs(public) do
        local summary = documented[mod .. " " .. name]
        assert(summary, path .. ": " .. mod .. " " .. name .. " is not in the reference")
        assert(summary:match("%S"), mod .. " " .. name .. " has an empty summary")
        checked = checked + 1
      end
    end
    assert.is_true(checked >= 90, checked .. " items checked")
  end)

  it("has a usage example in the lutra module that runs and trains", function()
    local src = I.read("lua/lutra/init.lua")
    local usage = src:match("\n%-%- @usage\n(.-)\n[^%-]")
    assert(usage, "no @usage block in lua/lutra/init.lua")
    local code = usage:gsub("%-%- ?", "", 1):gsub("\n%-%- ?", "\n")
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write(code)
    f:close()
    local ok, out = I.sh("LUA_PATH='lua/?.lua;lua/?/init.lua;;' OPENBLAS_NUM_THREADS=1 luajit " .. path)
    os.remove(path)
    assert(ok, out)
    local losses = {}
    for step, loss in out:gmatch("(%d+)\t([%d.]+)") do losses[#losses + 1] = tonumber(loss) end
    assert.is_true(#losses >= 3, out)
    assert.is_true(losses[#losses] < 0.9 * losses[1], "the example did not train:\n" .. out)
  end)
end)
