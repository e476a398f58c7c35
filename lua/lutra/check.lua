--- Internal: the argument checks shared by every file of the front. Each raises "where:
-- name must be ... (got ...)" at the caller of the front function (level 3 by default: this
-- helper, the front function, its caller), before anything reaches the FFI, whose own
-- conversion errors name no call and would truncate 1.5 to 1 or turn "1" into 1 without a
-- word. The checks are plain type/compare tests and ffi.istype on ctypes made once, so they
-- compile into the traces of a training loop without building anything.
-- @module lutra.check
local ffi = require("lutra.core").ffi

local M = {}

local function got(v)
  if type(v) == "string" then return string.format("%q", v) end
  if type(v) == "cdata" then return tostring(ffi.typeof(v)) end
  return tostring(v)
end
--- How a value is named in an error message: a string quoted, a cdata by its ctype.
-- @local internal: the front's argument checks
M.got = got

--- Raises "where: message" (fmt and its arguments, as string.format) at the caller of
-- the front function that called it.
-- @local internal: the front's argument checks
function M.fail(where, fmt, ...)
  error(where .. ": " .. string.format(fmt, ...), 4)
end

local function raise(level, where, name, what, v)
  error(string.format("%s: %s must be %s (got %s)", where, name, what, got(v)), level + 1)
end

local function is_integer(v)
  return type(v) == "number" and v == v and v == math.floor(v) and v > -math.huge and v < math.huge
end

--- an integer in [min, max] (bounds optional); a number is needed, "1" is refused
-- @local internal: the front's argument checks
function M.integer(v, name, where, min, max, level)
  level = level or 3
  if not is_integer(v) then
    raise(level, where, name, min == 1 and "a positive integer" or "an integer", v)
  end
  if (min and v < min) or (max and v > max) then
    local range
    if min == 1 then range = "a positive integer"
    elseif min and max then range = string.format("an integer in %d..%d", min, max)
    elseif min then range = string.format("an integer >= %d", min)
    else range = string.format("an integer <= %d", max) end
    raise(level, where, name, range, v)
  end
  return v
end

--- a positive integer (a dim, a feature count)
-- @local internal: the front's argument checks
function M.positive(v, name, where, level)
  if not is_integer(v) or v < 1 then raise(level or 3, where, name, "a positive integer", v) end
  return v
end

local u64 = ffi.typeof("uint64_t")
local i64 = ffi.typeof("int64_t")
--- A seed: an integer in 0..2^53 (what a Lua number holds exactly) or a uint64_t cdata.
-- @local internal: the front's argument checks
function M.seed(v, name, where, level)
  if ffi.istype(u64, v) then return v end
  if ffi.istype(i64, v) and v >= 0 then return v end
  if not is_integer(v) or v < 0 or v > 2 ^ 53 then
    raise(level or 3, where, name, "an integer in 0..2^53 or a uint64_t", v)
  end
  return v
end

--- a finite number (NaN and infinities refused)
-- @local internal: the front's argument checks
function M.finite(v, name, where, level)
  if type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge then
    raise(level or 3, where, name, "a finite number", v)
  end
  return v
end

--- any number, NaN and infinities included (the C side decides what it accepts)
-- @local internal: the front's argument checks
function M.number(v, name, where, level)
  if type(v) ~= "number" then raise(level or 3, where, name, "a number", v) end
  return v
end

--- A string.
-- @local internal: the front's argument checks
function M.string(v, name, where, level)
  if type(v) ~= "string" then raise(level or 3, where, name, "a string", v) end
  return v
end

--- A boolean.
-- @local internal: the front's argument checks
function M.boolean(v, name, where, level)
  if type(v) ~= "boolean" then raise(level or 3, where, name, "a boolean", v) end
  return v
end

--- nil or a boolean; returns 1/0 for the C struct, or dflt when nil
-- @local internal: the front's argument checks
function M.flag(v, name, where, dflt, level)
  if v == nil then return dflt end
  if type(v) ~= "boolean" then raise(level or 3, where, name, "a boolean", v) end
  return v and 1 or 0
end

--- A table.
-- @local internal: the front's argument checks
function M.table(v, name, where, level)
  if type(v) ~= "table" then raise(level or 3, where, name, "a table", v) end
  return v
end

--- a cdata of one of the front's object types (ct: a ctype made once with ffi.typeof);
-- what: the kind named in the message ("a tensor")
-- @local internal: the front's argument checks
function M.object(v, ct, what, name, where, level)
  if not ffi.istype(ct, v) then raise(level or 3, where, name, what, v) end
  return v
end

--- M.object, or nil.
-- @local internal: the front's argument checks
function M.optional_object(v, ct, what, name, where, level)
  if v ~= nil and not ffi.istype(ct, v) then raise(level or 3, where, name, what .. " or nil", v) end
  return v
end

M.tensor_t = ffi.typeof("lutra_tensor *")
-- a lutra_tensor made by ffi.new (a view the specs build over borrowed memory) is one too
local tensor_struct_t = ffi.typeof("lutra_tensor")
--- a file path: a non-empty string without NUL bytes (the C call would end it there:
-- "ck.st\0.bak" would be "ck.st")
-- @local internal: the front's argument checks
function M.path(v, name, where, level)
  level = level or 3
  if type(v) ~= "string" or v == "" then raise(level, where, name, "a non-empty string", v) end
  local nul = v:find("\0", 1, true)
  if nul then
    error(string.format("%s: %s holds a NUL byte at position %d (%q)", where, name, nul, v), level)
  end
  return v
end

M.module_t = ffi.typeof("lutra_module *")
-- a Sequential's handle (and a child taken from one) is a reference, so that seq[i] reaches
-- the metatype's __index instead of pointer arithmetic (lua/lutra/module_tree.lua)
M.module_ref_t = ffi.typeof("lutra_module &")
--- Whether v is a module handle (a pointer or a reference).
-- @local internal: the front's argument checks
function M.is_module(v)
  return ffi.istype(M.module_t, v) or ffi.istype(M.module_ref_t, v)
end
M.recipe_t = ffi.typeof("lutra_recipe *")
M.group_t = ffi.typeof("lutra_group *")

local function is_tensor(v)
  return ffi.istype(M.tensor_t, v) or ffi.istype(tensor_struct_t, v)
end
--- Whether v is a tensor (a pointer, or a struct made by ffi.new).
-- @local internal: the front's argument checks
M.is_tensor = is_tensor

--- nil passes: the C call refuses NULL with its own name ("lutra_module_forward: input is
-- NULL"); anything else that is not a tensor would reach the FFI's conversion error
-- @local internal: the front's argument checks
function M.tensor(v, name, where, level)
  if v ~= nil and not is_tensor(v) then raise(level or 3, where, name, "a tensor", v) end
  return v
end

-- the number of elem-typed elements a sized cdata array (ffi.new("float[?]", n), float[8])
-- holds, or nil when v is not one: a pointer carries no length, so a short buffer behind it
-- would be overrun
local array_elems = {} -- ctype id -> element type name, or false when not an array
local function elem_name(ct)
  return tostring(ct):match("^ctype<(.-) ?%[[%d?]*%]>$") or false
end
local elem_sizes = { float = 4, int = 4 }
-- per array object, its count (false: not an array of that element type), found once: a loop
-- that reads into the same buffer every step stays on its trace (tonumber of a ctype, below,
-- aborts LuaJIT's trace recorder with "bad argument type")
local counts = { float = setmetatable({}, { __mode = "k" }), int = setmetatable({}, { __mode = "k" }) }
--- The number of elem-typed elements of a sized cdata array, or nil (see above).
-- @local internal: the front's argument checks
function M.array_count(v, elem)
  if type(v) ~= "cdata" then return nil end
  local known = counts[elem]
  local count = known[v]
  if count ~= nil then return count or nil end
  local ct = ffi.typeof(v)
  local id = tonumber(ct)
  local name = array_elems[id]
  if name == nil then
    name = elem_name(ct)
    array_elems[id] = name
  end
  count = name == elem and ffi.sizeof(v) / elem_sizes[elem]
  known[v] = count
  return count or nil
end

return M
