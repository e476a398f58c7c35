-- Installs the built library into a temporary PREFIX once per busted run (make install with the
-- CUDA setting the library was built with, so that make does not reconfigure it), for
-- spec/install_spec.lua and spec/one_instance_spec.lua. Not a spec itself.
local M = {}

-- runs cmd in sh; returns whether it exited 0, its output (stderr too) and the exit status.
-- The status is echoed by the shell: LuaJIT without 5.2 compatibility has pclose report
-- success whatever the command's status.
M.sh = require("spec.support.shell").sh

function M.read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- the CUDA setting liblutra.so was built with ("CUDA=0" / "CUDA=1"): whether it needs libcudart.
-- Not build/config, which records the last make run (a make without CUDA= reconfigures it) and
-- would have make rebuild the library in the other configuration.
function M.cuda_setting()
  local ok, dyn = M.sh("readelf -d liblutra.so")
  if ok then return dyn:find("libcudart", 1, true) and "CUDA=1" or "CUDA=0" end
  local f = io.open("build/config", "r")
  if not f then return nil end
  local line = f:read("*l")
  f:close()
  return line
end

-- make with the environment of a plain shell: busted may run under make test, whose MAKEFLAGS
-- (jobserver descriptors) mean nothing to a new make
function M.make(args)
  local config = M.cuda_setting()
  if not config then error("cannot tell how liblutra.so was built (no readelf, no build/config)", 0) end
  return M.sh("env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory " .. config ..
              " " .. args)
end

local cached
-- the install's root: {prefix =, lib =, luadir =, include =, pkgconfig =}; errors if make fails
function M.prefix()
  if cached then return cached end
  local ok, dir = M.sh("mktemp -d /tmp/lutra-install-XXXXXX")
  assert(ok, dir)
  dir = dir:gsub("%s+$", "")
  local prefix = dir .. "/prefix"
  local made, out = M.make("install PREFIX=" .. prefix)
  if not made then error("make install failed:\n" .. out, 0) end
  -- removed when the Lua state closes (busted's exit), after every spec that uses it
  local sentinel = newproxy(true)
  getmetatable(sentinel).__gc = function() os.execute("rm -rf '" .. dir .. "'") end
  cached = { sentinel = sentinel, root = dir, prefix = prefix, lib = prefix .. "/lib", include = prefix .. "/include",
             luadir = prefix .. "/share/lua/5.1", pkgconfig = prefix .. "/lib/pkgconfig",
             log = out }
  return cached
end

-- compiler flags for a program embedding LuaJIT: pkg-config's, else the Debian paths (a machine
-- without pkg-config, its headers and library found through C_INCLUDE_PATH / LIBRARY_PATH);
-- nil and why when neither compiles
function M.luajit_flags()
  local ok, flags = M.sh("pkg-config --cflags --libs luajit")
  if ok then return (flags:gsub("%s+$", "")) end
  flags = "-I/usr/include/luajit-2.1 -lluajit-5.1"
  local probe = os.tmpname()
  local f = assert(io.open(probe .. ".c", "w"))
  f:write("#include <lua.h>\n#include <lauxlib.h>\nint main(void) { lua_State *L = luaL_newstate(); " ..
          "lua_close(L); return 0; }\n")
  f:close()
  local built = M.sh(string.format("cc -o %s %s.c %s", probe, probe, flags))
  os.remove(probe .. ".c")
  os.remove(probe)
  if built then return flags end
  return nil, "LuaJIT's development files (libluajit-5.1-dev) are not found"
end

-- LUA_PATH for the installed tree only (no build tree, no ;; default with the checkout)
function M.lua_path(luadir)
  return luadir .. "/?.lua;" .. luadir .. "/?/init.lua"
end

return M
