--- Internal: the FFI binding every other file of the front shares: the loaded library, the status check,
-- name <-> code tables, and the out-parameter boxes reused by every call (one Lua state runs
-- one call at a time, so one box of each type is enough and nothing is allocated per call).
-- @module lutra.core
local ffi = require("ffi")

ffi.cdef(require("lutra.cdef"))

local function file_exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- The library's SONAME (liblutra.so.MAJOR): the cdef carries the header's version enum.
local soname = "liblutra.so." .. tonumber(ffi.C.LUTRA_VERSION_MAJOR)
pcall(ffi.cdef, "void *dlopen(const char *file, int mode);") -- declared elsewhere already is fine
local RTLD_LAZY, RTLD_NOLOAD = 1, 4

-- One library per process: a host that links liblutra (or loaded it before running Lua) shares
-- its instance (its tensors, autocast scopes, seed generator) instead of getting a second copy
-- from a file. Looked up by SONAME without loading (dlopen RTLD_NOLOAD finds a copy loaded
-- RTLD_LOCAL too), then in the process's global symbols (a host with lutra linked in).
local function already_loaded()
  if ffi.C.dlopen(soname, RTLD_LAZY + RTLD_NOLOAD) ~= nil then
    return ffi.load(soname), soname .. " (already loaded)"
  end
  if pcall(function() return ffi.C.lutra_version end) then
    return ffi.C, "the process's own symbols"
  end
end

-- Otherwise: LUTRA_LIB; the build tree this file lives in (lua/lutra/ -> ../liblutra.so); the
-- library `make install` put beside it (lutra/libpath.lua, written by make install, and
-- PREFIX/lib for a tree moved since); luarocks' C module path; the system loader by SONAME.
-- A file that exists but does not load is an error (a silent fall-through would run another
-- build); nothing found is an error naming LUTRA_LIB and every path tried.
local function load_library()
  local C, from = already_loaded()
  if C then return C, from end
  local tried = {}
  local function try(path, what)
    if not file_exists(path) then
      tried[#tried + 1] = path .. " (" .. what .. ": no such file)"
      return nil
    end
    local ok, lib = pcall(ffi.load, path)
    if ok then return lib, path end
    error(string.format("lutra: cannot load %s (%s): %s", path, what, tostring(lib)), 0)
  end
  local env = os.getenv("LUTRA_LIB")
  if env and env ~= "" then
    local lib = try(env, "LUTRA_LIB")
    if lib then return lib, env end
    error("lutra: LUTRA_LIB names " .. env .. ", which does not exist", 0)
  end
  tried[#tried + 1] = "LUTRA_LIB (not set)"
  local source = debug.getinfo(1, "S").source
  local dir = source:match("^@(.*)[/\\]lutra[/\\]core%.lua$")
  if dir then
    local lib = try(dir .. "/../liblutra.so", "build tree")
    if lib then return lib, dir .. "/../liblutra.so" end
    local chunk = loadfile(dir .. "/lutra/libpath.lua")
    local recorded = chunk and chunk()
    if type(recorded) == "string" then
      lib = try(recorded, "installed by make install")
      if lib then return lib, recorded end
    end
    local prefix = dir:match("^(.*)/share/lua/5%.1$")
    if prefix then
      lib = try(prefix .. "/lib/" .. soname, "PREFIX/lib")
      if lib then return lib, prefix .. "/lib/" .. soname end
    end
  end
  local rock = package.searchpath("liblutra", package.cpath)
  if rock then return try(rock, "package.cpath"), rock end
  tried[#tried + 1] = "liblutra.so on package.cpath (" .. package.cpath .. ")"
  local ok, lib = pcall(ffi.load, soname)
  if ok then return lib, soname end
  tried[#tried + 1] = soname .. " through the system loader (" .. tostring(lib) .. ")"
  error("lutra: liblutra not found; set LUTRA_LIB to the path of liblutra.so or install lutra " ..
        "(make install PREFIX=...). Tried:\n  " .. table.concat(tried, "\n  "), 0)
end

local C, library_path = load_library()

local M = { C = C, ffi = ffi, library_path = library_path }

--- Raises the library's message ("lutra_call: reason") as a Lua error at the caller's caller.
-- A call that returned LUTRA_RULES_PENDING succeeded: the scaling rules it set aside run here
-- (lutra/rules.lua sets M.run_rules), so every `if C.f(...) ~= 0 then core.fail() end` runs
-- them without a test on its fast path.
-- @local internal: every file of the front uses it
function M.fail()
  if M.run_rules and C.lutra_rules_status() ~= 0 then return M.run_rules() end
  error(ffi.string(C.lutra_last_error()), 3)
end

--- Raises the library's message as M.fail does when status is not 0 (LUTRA_OK).
-- @local internal: every file of the front uses it
function M.check(status)
  if status ~= 0 then
    if status == C.LUTRA_RULES_PENDING and M.run_rules then return M.run_rules() end
    error(ffi.string(C.lutra_last_error()), 3)
  end
end

M.dtypes = { f32 = C.LUTRA_F32, bf16 = C.LUTRA_BF16, f16 = C.LUTRA_F16, e4m3 = C.LUTRA_E4M3,
             e5m2 = C.LUTRA_E5M2, e8m0 = C.LUTRA_E8M0, i32 = C.LUTRA_I32, e2m1 = C.LUTRA_E2M1 }
M.devices = { cpu = C.LUTRA_CPU, cuda = C.LUTRA_CUDA }
M.roles = { input = C.LUTRA_ROLE_INPUT, weight = C.LUTRA_ROLE_WEIGHT,
            grad_output = C.LUTRA_ROLE_GRAD_OUTPUT }
M.role_list = { "input", "weight", "grad_output" }

--- Looks a name up in one of the tables above; a number passes through. For option parsing.
-- @local internal: every file of the front uses it
function M.code(tbl, value, what, where)
  if type(value) == "number" then
    if value ~= math.floor(value) or value < -2 ^ 31 or value >= 2 ^ 31 then
      error(string.format("%s: %s code must be an integer (got %s)", where, what, tostring(value)), 3)
    end
    return value
  end
  local code = tbl[value]
  if code == nil then
    local names = {}
    for k in pairs(tbl) do names[#names + 1] = k end
    table.sort(names)
    error(string.format("%s: unknown %s '%s' (expected one of: %s)", where, what,
                        tostring(value), table.concat(names, ", ")), 3)
  end
  return code
end

--- Rejects option keys a constructor does not know (a typo would otherwise be ignored).
-- @local internal: every file of the front uses it
function M.check_options(opts, allowed, where)
  if opts == nil then return {} end
  if type(opts) ~= "table" then error(where .. ": options must be a table", 3) end
  for k in pairs(opts) do
    if not allowed[k] then error(string.format("%s: unknown option '%s'", where, tostring(k)), 3) end
  end
  return opts
end

-- The default device for examples and specs: LUTRA_DEVICE=cpu|cuda, read once at load.
local device_name = os.getenv("LUTRA_DEVICE")
if device_name == nil or device_name == "" then device_name = "cpu" end
M.default_device_name = device_name

--- The device code of a device name (nil: the default device).
-- @local internal: every file of the front uses it
function M.device(value, where)
  if value == nil then value = device_name end
  return M.code(M.devices, value, "device", where)
end

--- Names a module for a factory recipe's choice (lutra_module_set_name; the constructor has
-- checked that name is nil or a string); nil: unnamed. Returns m.
-- @local internal: the constructors of the modules a factory recipe chooses for
function M.set_name(m, name)
  if name ~= nil then M.check(C.lutra_module_set_name(m, name)) end
  return m
end

-- CLOCK_MONOTONIC's for M.now
ffi.cdef [[
struct lutra_timespec { long tv_sec; long tv_nsec; };
int clock_gettime(int clk_id, struct lutra_timespec *tp);
]]
local timespec = ffi.new("struct lutra_timespec")
--- Wall-clock seconds (CLOCK_MONOTONIC) for progress lines and benchmarks: os.clock counts
-- CPU time of all threads, which BLAS threads inflate. lutra.now is this function.
-- @local internal: lutra exports it as lutra.now
function M.now()
  ffi.C.clock_gettime(1, timespec)
  return tonumber(timespec.tv_sec) + tonumber(timespec.tv_nsec) * 1e-9
end

M.tensor_box = ffi.new("lutra_tensor*[1]")
M.float_box = ffi.new("float[2]")
M.int_box = ffi.new("int[3]")

return M
