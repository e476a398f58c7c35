--- Internal: print(module) and Sequential indexing, for the module metatype of lutra.nn.
--   print(net)      lutra.nn.Sequential(
--                     (1): lutra.nn.Linear(in=64, out=256, bias=true, f32, cpu)
--                     (2): lutra.nn.silu
--                     (3): lutra.nn.Linear(in=256, out=10, bias=true, f32, cpu)
--                   )
--   net[1], #net    a child (1-based) and the number of children of a Sequential
-- A child handle holds its own reference to the module and keeps the Sequential alive too (its
-- owner, as a module's output tensors keep the module), so net[1] stays valid whatever the
-- garbage collector does; an index outside 1..#net is an error naming it.
-- Every module kind prints its kind and its parameters' shapes, dtype and device (the linear
-- layers as in=, out=): read from the module, so that a new kind prints without code here.
-- @module lutra.module_tree
local core = require("lutra.core")
local tensor = require("lutra.tensor")
local ffi, C, check = core.ffi, core.C, core.check
local owners = tensor.owners

local M = {}

local int_box = ffi.new("int[1]")
local child_box = ffi.new("lutra_module*[1]")
local param = ffi.new("lutra_param")
local tied_box = ffi.new("const char *[1]")

-- a module handle as a reference (lutra_module &): indexing it with a number reaches __index,
-- where a pointer would do pointer arithmetic; C calls take it as the pointer
local ref_t = ffi.typeof("lutra_module &")
--- A module handle as a reference that Lua owns (see above).
-- @local internal: lutra.nn's Sequential uses it
function M.own_ref(p) return ffi.gc(ffi.cast(ref_t, p), C.lutra_module_unref) end

local function kind(m) return ffi.string(C.lutra_module_kind(m)) end

--- The number of children of a Sequential (#seq).
-- @local internal: lutra.nn's module metatype uses it
function M.count(m)
  check(C.lutra_sequential_count(m, int_box))
  return int_box[0]
end

--- A Sequential's i-th child (seq[i], 1-based): a handle of its own that keeps the
-- Sequential alive; an index outside 1..#seq is an error naming the range.
-- @local internal: lutra.nn's module metatype uses it
function M.child(m, i)
  local n = M.count(m)
  if type(i) ~= "number" or i ~= math.floor(i) or i < 1 or i > n then
    error(string.format("lutra.nn.Sequential: index %s is out of range 1..%d", tostring(i), n), 3)
  end
  check(C.lutra_sequential_child(m, i - 1, child_box))
  local c = M.own_ref(child_box[0])
  owners[c] = m
  return c
end

local function dims(t)
  local s = {}
  for i = 0, t.ndim - 1 do s[i + 1] = tostring(tonumber(t.shape[i])) end
  return table.concat(s, "x")
end

-- the module's own line: kind, and what its parameters say
local function line(m)
  local k = kind(m)
  -- a freed module (whose kind C no longer gives) prints as one
  if C.lutra_module_num_params(m, int_box) ~= 0 then return "lutra.nn.module(freed)" end
  local np = int_box[0]
  if k == "rotary_embedding" then return require("lutra.rope").describe(m) end
  if k == "dot_product_attention" then return require("lutra.attention").describe(m) end
  if k == "moe_mlp" then return require("lutra.transformer").describe_moe(m) end
  if np == 0 then return "lutra.nn." .. k end
  check(C.lutra_module_param(m, 0, param))
  local w = param.value
  local dtype, device = tensor.dtype_names[tonumber(w.dtype)], w:device_name()
  if k == "linear" then
    check(C.lutra_linear_tied_to(m, tied_box))
    return string.format("lutra.nn.Linear(in=%d, out=%d, bias=%s, %s, %s%s)",
                         tonumber(w.shape[1]), tonumber(w.shape[0]), tostring(np > 1), dtype, device,
                         tied_box[0] ~= nil and ", tied to " .. ffi.string(tied_box[0]) or "")
  end
  if k == "embedding" then
    return string.format("lutra.nn.Embedding(%d, %d, %s, %s)", tonumber(w.shape[0]),
                         tonumber(w.shape[1]), dtype, device)
  end
  local shapes = {}
  for i = 0, np - 1 do
    check(C.lutra_module_param(m, i, param))
    shapes[#shapes + 1] = "[" .. dims(param.value) .. "]"
  end
  return string.format("lutra.nn.%s(%s, %s, %s)", k, table.concat(shapes, " "), dtype, device)
end

-- the children of a C Sequential or of a module written in Lua (lutra.lua_module), or nil
local function children(m)
  if type(m) == "table" then
    local kids = type(m.children) == "function" and m:children() or {}
    return #kids > 0 and kids or nil
  end
  if kind(m) ~= "sequential" or C.lutra_sequential_count(m, int_box) ~= 0 then return nil end
  local kids = {}
  for i = 1, int_box[0] do
    check(C.lutra_sequential_child(m, i - 1, child_box))
    kids[i] = ffi.gc(child_box[0], C.lutra_module_unref)
  end
  return kids
end

-- a Lua module's name: its class's (lutra.nn.Sequential for the Sequential in Lua)
local function lua_name(m)
  return m.__display or (type(m.kind) == "function" and m:kind()) or "lua module"
end

local function describe(m, indent, out)
  local kids = children(m)
  local lua = type(m) == "table"
  if kids == nil then
    out[#out + 1] = lua and lua_name(m) or line(m)
    return
  end
  out[#out + 1] = (lua and lua_name(m) or "lutra.nn.Sequential") .. "(\n"
  for i, c in ipairs(kids) do
    out[#out + 1] = string.format("%s  (%d): ", indent, i)
    describe(c, indent .. "  ", out)
    out[#out + 1] = "\n"
  end
  out[#out + 1] = indent .. ")"
end

--- The module tree as print(module) shows it (a module written in Lua too).
-- @local internal: lutra.nn's module metatype and lutra.lua_module's classes use it
function M.tostring(m)
  local out = {}
  describe(m, "", out)
  return table.concat(out)
end

return M
