-- make install into a temporary PREFIX (and a DESTDIR staging): the header and its split headers,
-- liblutra.so.MAJOR.MINOR.PATCH with SONAME liblutra.so.MAJOR and the two links, lutra.pc, and
-- the Lua front; a C program built with `pkg-config --cflags --libs lutra` against the install
-- and run without LD_LIBRARY_PATH (the .pc carries the rpath); the embedding host built the same
-- way, its Lua finding the front through LUA_PATH made of the .pc's luadir;
-- luajit requiring lutra from the installed tree without LUTRA_LIB; and the not-found error
-- naming LUTRA_LIB and every path it tried.
local I = require("spec.support.install_tree")
local lutra = require("lutra")
local ffi = require("ffi")

local function version()
  local v = ffi.new("int[3]")
  assert(lutra.C.lutra_version(v, v + 1, v + 2) == 0)
  return v[0], v[1], v[2]
end

local function lines(cmd)
  local ok, out = I.sh(cmd)
  return ok, out
end

describe("make install", function()
  if not io.open("liblutra.so", "rb") then
    pending("skipped: liblutra.so is not built (make)")
    return
  end
  local tree = I.prefix()
  local has_pkg_config = I.sh("command -v pkg-config")
  local major, minor, patch = version()
  local full = string.format("liblutra.so.%d.%d.%d", major, minor, patch)
  local soname = "liblutra.so." .. major

  it("installs the header and every split header, byte for byte", function()
    assert.are.equal(I.read("src/lutra.h"), I.read(tree.include .. "/lutra.h"))
    local _, list = I.sh("ls src/lutra/*.h")
    local n = 0
    for path in list:gmatch("[^\n]+") do
      local name = path:match("([^/]+)$")
      assert.are.equal(I.read(path), I.read(tree.include .. "/lutra/" .. name), name)
      n = n + 1
    end
    assert.is_true(n >= 9, "split headers found: " .. n)
  end)

  it("installs the library versioned as lutra_version says, SONAME liblutra.so.MAJOR", function()
    local ok, kind = I.sh("stat -c %F " .. tree.lib .. "/" .. full)
    assert(ok and kind:match("regular file"), full .. " is not a regular file: " .. kind)
    assert.are.equal(full, (select(2, I.sh("readlink " .. tree.lib .. "/" .. soname)):gsub("%s+$", "")))
    assert.are.equal(soname, (select(2, I.sh("readlink " .. tree.lib .. "/liblutra.so")):gsub("%s+$", "")))
    local has_readelf = I.sh("command -v readelf")
    if has_readelf then
      local _, dyn = I.sh("readelf -d " .. tree.lib .. "/" .. full)
      assert.are.equal(soname, dyn:match("Library soname: %[([^%]]+)%]"))
    end
    assert.are.equal(I.read("liblutra.so"), I.read(tree.lib .. "/" .. full))
  end)

  it("writes lutra.pc with the install's paths and the library's version", function()
    if not has_pkg_config then
      pending("no pkg-config")
      return
    end
    local env = "PKG_CONFIG_PATH=" .. tree.pkgconfig .. " PKG_CONFIG_LIBDIR= "
    local ok, v = I.sh(env .. "pkg-config --modversion lutra")
    assert(ok, v)
    assert.are.equal(string.format("%d.%d.%d", major, minor, patch), (v:gsub("%s+$", "")))
    local _, flags = I.sh(env .. "pkg-config --cflags --libs lutra")
    assert(flags:find("-I" .. tree.include, 1, true), flags)
    assert(flags:find("-L" .. tree.lib, 1, true), flags)
    assert(flags:find("-llutra", 1, true), flags)
  end)

  it("builds and runs a C program with pkg-config --cflags --libs lutra", function()
    if not has_pkg_config then
      pending("no pkg-config")
      return
    end
    local cc = os.getenv("CC")
    if not cc or cc == "" then cc = "cc" end
    local exe = tree.root .. "/installed_check"
    local env = "PKG_CONFIG_PATH=" .. tree.pkgconfig .. " PKG_CONFIG_LIBDIR= "
    local ok, out = I.sh(string.format(
      "%s -std=c11 -Wall -Wextra -Werror -pedantic -o %s spec/support/installed_check.c " ..
      "$(%spkg-config --cflags --libs lutra) -lm", cc, exe, env))
    assert(ok, "building against the install failed:\n" .. out)
    -- the program resolves liblutra.so.MAJOR from the install, not from the build tree, with
    -- pkg-config's flags alone: lutra.pc's Libs carry the rpath (no LD_LIBRARY_PATH)
    local _, ldd = I.sh("env -u LD_LIBRARY_PATH ldd " .. exe)
    assert(ldd:find(soname .. " => " .. tree.lib .. "/" .. soname, 1, true), ldd)
    ok, out = I.sh("cd " .. tree.root .. " && env -u LD_LIBRARY_PATH ./installed_check")
    assert(ok and out:find("installed_check: 0 failures", 1, true), out)
    assert.is_nil(out:find("FAIL", 1, true), out)
    assert(out:find(string.format("version %d.%d.%d", major, minor, patch), 1, true), out)
  end)

  it("builds the embedding host with pkg-config alone; its Lua finds lutra through luadir", function()
    if not has_pkg_config then
      pending("no pkg-config")
      return
    end
    local lj, why = I.luajit_flags()
    if not lj then
      pending(why)
      return
    end
    local env = "PKG_CONFIG_PATH=" .. tree.pkgconfig .. " PKG_CONFIG_LIBDIR= "
    local ok, luadir = I.sh(env .. "pkg-config --variable=luadir lutra")
    luadir = luadir:gsub("%s+$", "")
    assert(ok and luadir == tree.luadir, luadir)
    local cc = os.getenv("CC")
    if not cc or cc == "" then cc = "cc" end
    local exe = tree.root .. "/installed_host"
    local out
    ok, out = I.sh(string.format("%s -std=c11 -O2 -Wall -Wextra -Werror -o %s examples/embed/host.c " ..
                                 "$(%spkg-config --cflags --libs lutra) %s -lm", cc, exe, env, lj))
    assert(ok, "building host.c against the install failed:\n" .. out)
    -- from another folder, without LD_LIBRARY_PATH or LUTRA_LIB, LUA_PATH built from luadir only
    local _, pwd = I.sh("pwd")
    local script = pwd:gsub("%s+$", "") .. "/examples/embed/train_step.lua"
    ok, out = I.sh(string.format("cd %s && env -u LD_LIBRARY_PATH -u LUTRA_LIB LUA_PATH='%s' %s 300 %s",
                                 tree.root, I.lua_path(luadir), exe, script))
    assert(ok, out)
    assert.is_nil(out:find("FAIL", 1, true), out)
    assert(out:find("inputs: the host's own buffers, wrapped", 1, true), out)
  end)

  it("lets luajit require lutra from the installed tree without LUTRA_LIB", function()
    -- from another directory, with only the installed tree on LUA_PATH: the values must be the
    -- ones this (build tree) library computes, from the installed file
    local script = tree.root .. "/use.lua"
    local f = assert(io.open(script, "w"))
    f:write([[
local lutra = require("lutra")
local t = lutra.tensor({5}):randn(777)
local v = t:to_table()
io.write(require("lutra.core").library_path, "\n")
for i = 1, #v do io.write(string.format("%.9g\n", v[i])) end
]])
    f:close()
    local ok, out = I.sh(string.format("cd %s && env -u LUTRA_LIB LUA_PATH='%s' luajit %s",
                                       tree.root, I.lua_path(tree.luadir), script))
    assert(ok, out)
    local got = {}
    for line in out:gmatch("[^\n]+") do got[#got + 1] = line end
    assert.are.equal(tree.lib .. "/" .. soname, got[1])
    local want = lutra.tensor({5}):randn(777):to_table()
    assert.are.equal(5, #got - 1)
    for i = 1, 5 do assert.are.equal(string.format("%.9g", want[i]), got[i + 1]) end
  end)

  it("stages into DESTDIR with PREFIX's paths, and the staged tree still finds its library", function()
    local stage = tree.root .. "/stage"
    local made, log = I.make("install DESTDIR=" .. stage .. " PREFIX=/opt/lutra-spec")
    assert(made, log)
    local base = stage .. "/opt/lutra-spec"
    assert.are.equal(I.read("src/lutra.h"), I.read(base .. "/include/lutra.h"))
    local pc = I.read(base .. "/lib/pkgconfig/lutra.pc")
    assert(pc:find("prefix=/opt/lutra-spec\n", 1, true), pc)
    assert(not pc:find(stage, 1, true), "DESTDIR leaked into lutra.pc:\n" .. pc)
    -- /opt/lutra-spec does not exist: the front falls back to PREFIX/lib beside its own tree
    local ok, out = I.sh(string.format(
      "cd %s && env -u LUTRA_LIB LUA_PATH='%s' luajit -e " ..
      "'require(\"lutra\"); io.write(require(\"lutra.core\").library_path)'",
      tree.root, I.lua_path(base .. "/share/lua/5.1")))
    assert(ok, out)
    assert.are.equal(base .. "/lib/" .. soname, out)
  end)

  it("fails to load with an error naming LUTRA_LIB and every path it tried", function()
    -- the Lua files alone, away from any library
    local bare = tree.root .. "/bare"
    assert(I.sh("mkdir -p " .. bare .. "/lutra && cp " .. tree.luadir .. "/lutra/*.lua " .. bare ..
                "/lutra/ && rm " .. bare .. "/lutra/libpath.lua"))
    local ok, out = I.sh(string.format(
      "cd %s && env -u LUTRA_LIB LD_LIBRARY_PATH= LUA_PATH='%s' LUA_CPATH='%s/?.so' luajit -e " ..
      "'require(\"lutra\")'", bare, I.lua_path(bare), bare))
    assert.is_false(ok)
    assert(out:find("LUTRA_LIB (not set)", 1, true), out)
    assert(out:find(bare .. "/../liblutra.so (build tree: no such file)", 1, true), out)
    assert(out:find("package.cpath (" .. bare .. "/?.so)", 1, true), out)
    assert(out:find(soname .. " through the system loader", 1, true), out)
    -- a LUTRA_LIB naming nothing is an error naming it, not a silent fall-through
    ok, out = I.sh(string.format("cd %s && LUTRA_LIB=%s/nowhere.so LUA_PATH='%s' luajit -e " ..
                                 "'require(\"lutra\")'", bare, bare, I.lua_path(bare)))
    assert.is_false(ok)
    assert(out:find("LUTRA_LIB names " .. bare .. "/nowhere.so", 1, true), out)
  end)
end)
