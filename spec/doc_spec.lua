-- The Lua API reference (make doc: LDoc over config.ld's files): LDoc runs without a warning,
-- every public function and method of those files is in it with a summary (an item without a
-- `---` doc comment would silently be left out), and the lutra module's usage example (several
-- modules, FP8 for the middle one only, one optimizer) runs and trains. Skipped without ldoc
-- (Debian's lua-ldoc).
-- The Lua API reference (make doc: LDoc over config.ld's files): LDoc runs without a warning;
-- every file of lua/lutra (but the generated cdef.lua) is a module of it, named as it is
-- required; every function a module returns and every method (`function Class:name(`) has a
-- `---` doc comment with a summary (an item without one would silently be left out), public or
-- marked @local (internal, with the reason); and the lutra module's usage example (several
-- modules, FP8 for the middle one only, one optimizer) runs and trains. Skipped without ldoc
-- (Debian's lua-ldoc).
local I = require("spec.support.install_tree")

-- the files of the Lua front: path -> the name it is required by
local function front_files()
  local _, out = I.sh("ls lua/lutra/*.lua")
  local files = {}
  for path in out:gmatch("[^\n]+") do
    local base = path:match("^lua/lutra/([%w_]+)%.lua$")
    if base and base ~= "cdef" then -- cdef.lua: generated from the C headers, not a module
      files[path] = base == "init" and "lutra" or "lutra." .. base
    end
  end
  return files
end

-- LDoc's items with the local ones (tools/ldoc_items.lua): modules by file, items by module
local function reference()
  local ok, out = I.sh("LUA_PATH='tools/?.lua;;' ldoc --all -c config.ld --filter ldoc_items.list .")
  assert(ok, out)
  local module_of, items = {}, {}
  for file, mod, name, visibility, summary in
      out:gmatch("([^\t\n]*)\t([^\t\n]+)\t([^\t\n]*)\t([^\t\n]+)\t([^\n]*)") do
    if visibility == "module" then
      module_of[file] = mod
      items[mod] = items[mod] or {}
    else
      -- LDoc names a module function documented inside a class's section Class.name; only an
      -- internal one (@local, not shown) may stand there
      if visibility == "local" then name = name:gsub("^%u[%w_]*%.", "") end
      items[mod][name] = { summary = summary, is_local = visibility == "local" }
    end
  end
  return module_of, items
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

  it("has every file of lua/lutra as a module, named as it is required", function()
    local module_of = reference()
    local n = 0
    for path, name in pairs(front_files()) do
      assert(module_of[path], path .. " is not in the reference (config.ld's file list)")
      assert.are.equal(name, module_of[path], path .. "'s @module")
      n = n + 1
    end
    assert.is_true(n >= 20, n .. " files")
  end)

  it("documents every public function and method with a summary", function()
    local module_of, items = reference()
    -- the function objects documented anywhere (lutra.save is lutra.checkpoint.save)
    local documented = {}
    for mod, its in pairs(items) do
      local t = require(mod)
      for name, item in pairs(its) do
        assert(item.summary:match("%S"), mod .. " " .. name .. " has an empty summary")
        assert(item.is_local or not name:match("^%u[%w_]*%."), mod .. " " .. name
               .. ": a module function inside a class's section (end it: --- @section end)")
        if type(t[name]) == "function" then documented[t[name]] = true end
      end
    end
    local public = 0
    for path, name in pairs(front_files()) do
      local mod = module_of[path]
      local its = items[mod]
      -- what the module returns: documented (public, or @local with the reason) in it or where
      -- it is defined
      for key, v in pairs(require(name)) do
        if type(v) == "function" then
          local item = its[key]
          assert(item or documented[v], path .. ": " .. name .. "." .. key .. " has no doc comment")
          if item and not item.is_local then public = public + 1 end
        end
      end
      -- methods: function Class:name(
      for class, method in I.read(path):gmatch("\nfunction (%u[%w_]*):([%w_]+)%(") do
        local item = its[class .. ":" .. method]
        assert(item, path .. ": " .. class .. ":" .. method .. " has no doc comment")
        if not item.is_local then public = public + 1 end
      end
    end
    -- 164 when this check was written: a file or a class missing from the reference shows here
    assert.is_true(public >= 160, public .. " public functions and methods")
  end)

  it("has a usage example in the lutra module that runs and trains", function()
    local src = I.read("lua/lutra/init.lua")
    local usage = src:match("\n%-%- @usage\n(.-)\n[^%-]")
    assert(usage, "no @usage block in lua/lutra/init.lua")
    local code = usage:gsub("%-%- ?", "", 1):gsub("\n%-%- ?", "\n")
    local ok, out = require("spec.support.shell").luajit_chunk(code, "OPENBLAS_NUM_THREADS=1")
    assert(ok, out)
    local losses = {}
    for step, loss in out:gmatch("(%d+)\t([%d.]+)") do losses[#losses + 1] = tonumber(loss) end
    assert.is_true(#losses >= 3, out)
    assert.is_true(losses[#losses] < 0.9 * losses[1], "the example did not train:\n" .. out)
  end)
end)
