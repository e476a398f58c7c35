--- Internal: method lookup per module kind, for the module metatype of lutra.nn.
-- Every module handle (a `lutra_module *` or `lutra_module &` cdata) shares one FFI metatype,
-- whatever its kind. Its `__index` first looks the key up in the methods every kind has
-- (forward, backward, parameters, ...: one table lookup, as a plain method table costs, so a
-- training loop's calls stay as fast as before), then in the methods of the handle's kind
-- (a GroupedLinear's set_splits, a Linear's quantizer, ...). A key neither has is an error
-- naming the kind and the key ("Linear has no method 'set_splits'") instead of a nil that
-- would fail later inside C.
--
-- The kind of a handle is asked of C (lutra_module_kind) the first time one of its kind's own
-- methods is looked up, and remembered in a weak-keyed table by the handle; so handles made
-- anywhere (constructors, a Sequential's children, lutra.load, C) get the right methods, and
-- the per-kind lookup costs one table lookup more after the first.
-- @module lutra.module_methods
local core = require("lutra.core")
local ffi, C = core.ffi, core.C

local M = {}

--- The kinds defined so far: C kind name (lutra_module_kind) -> {name =, methods =}.
-- @local internal registry (the specs read it to check every kind of C has its entry)
M.kinds = {}

-- every method of any kind, for a freed module (whose kind C no longer gives): the call then
-- reaches C, which names the module as freed
local freed = { name = "module (freed)", methods = {}, indexable = true }
-- method name -> the name of a kind that has it, for the error's hint
local owner_of = {}

--- Defines a module kind: its C name, the name users make it by and its own methods.
-- @local called once per kind by the files that define modules
-- @tparam string kind the C kind (lutra_module_kind's result, e.g. "grouped_linear")
-- @tparam string name the Lua name, e.g. "GroupedLinear"
-- @tparam[opt] table methods name -> function, the kind's methods beside the shared ones
-- @tparam[opt] boolean indexable true for a Sequential (m[i] is a child)
function M.define(kind, name, methods, indexable)
  local own = {}
  for k, f in pairs(methods or {}) do
    own[k] = f
    freed.methods[k] = f
    owner_of[k] = owner_of[k] or name
  end
  M.kinds[kind] = { name = name, methods = own, indexable = indexable or false }
  return M.kinds[kind]
end

-- handle -> its kind's entry in M.kinds
local kind_of_handle = setmetatable({}, { __mode = "k" })

local function resolve(m)
  local kind_name = ffi.string(C.lutra_module_kind(m))
  local kind = M.kinds[kind_name]
  if kind == nil then
    if kind_name == "?" then return freed end -- not remembered: C's error names the handle
    -- a kind C has and Lua has not defined: the shared methods only
    kind = M.define(kind_name, kind_name)
  end
  kind_of_handle[m] = kind
  return kind
end

--- The kind entry ({name =, methods =}) of a module handle.
-- @local for the metatype's __index and the specs
function M.kind_of(m) return kind_of_handle[m] or resolve(m) end

local function no_method(kind, key)
  if type(key) == "number" then
    error(string.format("%s cannot be indexed by %s (only a Sequential has children)",
                        kind.name, tostring(key)), 3)
  end
  local owner = owner_of[key]
  error(string.format("%s has no method '%s'%s", kind.name, tostring(key),
                      owner and " (it is a method of " .. owner .. ")" or ""), 3)
end

--- The metatype's `__index`: shared methods, then the kind's, then a Sequential's children.
-- @local installed once by lutra.nn
-- @tparam table shared the methods every kind has
-- @tparam function child child(m, i): a Sequential's i-th child
function M.index(shared, child)
  return function(m, key)
    local f = shared[key]
    if f ~= nil then return f end
    local kind = kind_of_handle[m] or resolve(m)
    f = kind.methods[key]
    if f ~= nil then return f end
    if kind.indexable and type(key) == "number" then return child(m, key) end
    no_method(kind, key)
  end
end

return M
