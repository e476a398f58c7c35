-- The FFI binding every other file of the front shares: the loaded library, the status check,
-- name <-> code tables, and the out-parameter boxes reused by every call (one Lua state runs
-- one call at a time, so one box of each type is enough and nothing is allocated per call).
local ffi = require("ffi")

ffi.cdef(require("lutra.cdef"))

local function file_exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- LUTRA_LIB wins; then the build tree this file lives in (lua/lutra/ -> ../../liblutra.so);
-- then the installed C module path (luarocks puts liblutra.so in its LIBDIR); then the loader.
local function find_library()
  local env = os.getenv("LUTRA_LIB")
  if env and env ~= "" then return env end
  local source = debug.getinfo(1, "S").source
  local dir = source:match("^@(.*)[/\\]lutra[/\\]core%.lua$")
  if dir then
    local in_tree = dir .. "/../liblutra.so"
    if file_exists(in_tree) then return in_tree end
  end
  local installed = package.searchpath("liblutra", package.cpath)
  return installed or "lutra"
end

local C = ffi.load(find_library())

local M = { C = C, ffi = ffi }

-- Raises the library's message ("lutra_call: reason") as a Lua error at the caller's caller.
-- A call that returned LUTRA_RULES_PENDING succeeded: the scaling rules it set aside run here
-- (lutra/rules.lua sets M.run_rules), so every `if C.f(...) ~= 0 then core.fail() end` runs
-- them without a test on its fast path.
function M.fail()
  if M.run_rules and C.lutra_rules_status() ~= 0 then return M.run_rules() end
  error(ffi.string(C.lutra_last_error()), 3)
end

function M.check(status)
  if status ~= 0 then
    if status == C.LUTRA_RULES_PENDING and M.run_rules then return M.run_rules() end
    error(ffi.string(C.lutra_last_error()), 3)
  end
end

M.dtypes = { f32 = C.LUTRA_F32, bf16 = C.LUTRA_BF16, f16 = C.LUTRA_F16, e4m3 = C.LUTRA_E4M3,
             e5m2 = C.LUTRA_E5M2, e8m0 = C.LUTRA_E8M0, i32 = C.LUTRA_I32 }
M.devices = { cpu = C.LUTRA_CPU, cuda = C.LUTRA_CUDA }
M.roles = { input = C.LUTRA_ROLE_INPUT, weight = C.LUTRA_ROLE_WEIGHT,
            grad_output = C.LUTRA_ROLE_GRAD_OUTPUT }
M.role_list = { "input", "weight", "grad_output" }

-- Looks a name up in one of the tables above; a number passes through. For option parsing.
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

-- Rejects option keys a constructor does not know (a typo would otherwise be ignored).
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

function M.device(value, where)
  if value == nil then value = device_name end
  return M.code(M.devices, value, "device", where)
end

-- Wall-clock seconds (CLOCK_MONOTONIC) for progress lines and benchmarks: os.clock counts CPU
-- time of all threads, which BLAS threads inflate.
ffi.cdef [[
struct lutra_timespec { long tv_sec; long tv_nsec; };
int clock_gettime(int clk_id, struct lutra_timespec *tp);
]]
local timespec = ffi.new("struct lutra_timespec")
function M.now()
  ffi.C.clock_gettime(1, timespec)
  return tonumber(timespec.tv_sec) + tonumber(timespec.tv_nsec) * 1e-9
end

M.tensor_box = ffi.new("lutra_tensor*[1]")
M.float_box = ffi.new("float[2]")
M.int_box = ffi.new("int[3]")

return M
