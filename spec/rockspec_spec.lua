-- lutra-scm-1.rockspec through luarocks, as README gives it
-- (`luarocks --lua-version 5.1 make lutra-scm-1.rockspec`), into a temporary tree: from a copy
-- of the checkout's files as a clone has them (git ls-files) plus this build's outputs and
-- configuration stamps, so that make finds the library built and only installs; then luajit on that tree's paths
-- (`luarocks path`) requires lutra without LUTRA_LIB. Skipped without luarocks or git.
local I = require("spec.support.install_tree")

local function trim(s) return (s:gsub("%s+$", "")) end

describe("lutra-scm-1.rockspec", function()
  if not io.open("liblutra.so", "rb") then
    pending("skipped: liblutra.so is not built (make)")
    return
  end
  if not I.sh("command -v luarocks") then
    pending("skipped: luarocks is not installed (apt-get install luarocks)")
    return
  end
  if not I.sh("command -v git") then
    pending("skipped: git is not installed (apt-get install git)")
    return
  end
  if not I.sh("git rev-parse --is-inside-work-tree") then
    pending("skipped: not a git checkout")
    return
  end

  it("names no machine path in source.url and passes luarocks lint", function()
    local spec = I.read("lutra-scm-1.rockspec")
    local url = spec:match('url%s*=%s*"([^"]+)"')
    assert(url, "no source.url")
    assert(url:match("^git%+https://") or url:match("^https://"), "source.url " .. url)
    assert.is_nil(url:find("file:", 1, true), url)
    local ok, out = I.sh("luarocks --lua-version 5.1 lint lutra-scm-1.rockspec")
    assert(ok, out)
  end)

  it("installs with luarocks --lua-version 5.1 make, and luajit requires it from the tree", function()
    local tree = I.prefix()
    local src, rocks = tree.root .. "/rock-src", tree.root .. "/rocks"
    local config = I.cuda_setting()
    local build = config == "CUDA=1" and "build/cuda" or "build/cpu"
    local ok, out = I.sh(string.format(
      "mkdir -p %s && git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C %s && " ..
      "tar -cf - build/config %s %s build/onnx-* liblutra.so liblutra.so.0 lua/lutra/cdef.lua | " ..
      "tar -xf - -C %s",
      src, src, build, config == "CUDA=1" and "build/cuda_archs" or "", src))
    assert(ok, out)
    -- the CUDA switch the library was built with goes to make through the environment
    ok, out = I.sh(string.format(
      "cd %s && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL %s luarocks --lua-version 5.1 make " ..
      "lutra-scm-1.rockspec --tree %s", src, config, rocks))
    assert(ok, "luarocks make failed:\n" .. out)
    assert(out:find("lutra scm%-1 is now installed"), out)
    -- nothing was rebuilt: the tree's library is this build's
    assert.are.equal(I.read("liblutra.so"), I.read(rocks .. "/lib/lua/5.1/liblutra.so"))
    local _, paths = I.sh("luarocks --lua-version 5.1 --tree " .. rocks .. " path")
    local lua_path = paths:match("LUA_PATH='([^']*)'")
    local lua_cpath = paths:match("LUA_CPATH='([^']*)'")
    assert(lua_path and lua_cpath, paths)
    ok, out = I.sh(string.format(
      "cd %s && env -u LUTRA_LIB LUA_PATH='%s' LUA_CPATH='%s' luajit -e " ..
      "'local l = require(\"lutra\"); local y = l.nn.Linear(4, 3, {seed = 1}):forward(" ..
      "l.tensor({2, 4}):randn(2)); io.write(require(\"lutra.core\").library_path, \" \", " ..
      "string.format(\"%%.9g\", y:to_table()[1]))'", tree.root, lua_path, lua_cpath))
    assert(ok, out)
    local path, value = out:match("^(%S+) (%S+)$")
    assert.are.equal(rocks .. "/lib/lua/5.1/liblutra.so", path)
    local lutra = require("lutra")
    local want = lutra.nn.Linear(4, 3, { seed = 1 }):forward(lutra.tensor({ 2, 4 }):randn(2))
    assert.are.equal(string.format("%.9g", want:to_table()[1]), trim(value))
  end)
end)
