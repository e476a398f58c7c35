--- Quantizers chosen per module: lutra.recipe.custom{factory = function(role, module_kind, name)
-- return {kind = "current", format = "e4m3", power_2_scale = false, amax_epsilon = 0} end}
-- (TransformerEngine's CustomRecipe qfactory). role is "input", "weight" or "grad_output",
-- module_kind the module's ("linear", "layernorm_linear", "linear_parallel", "grouped_linear":
-- a GroupedLinear's experts share its choice, and it takes none of rowwise, nvfp4 or a hybrid
-- columnwise_format), name the one given at construction (nn.Linear(..., {name = "head"})) or "".
-- kind: none, delayed, current, mxfp8, block_1d, block_2d, rowwise, nvfp4;
-- format: e4m3 or e5m2 (default e4m3, e5m2 for grad_output; e2m1 for nvfp4, whose role options
-- are lutra/nvfp4.lua's). The delayed fields (margin, amax_history_len,
-- amax_compute_algo, scaling_factor_compute_algo, reduce_amax) are the recipe's.
-- The factory runs once per module and recipe, at the module's first forward under it: that
-- forward returns LUTRA_FACTORY_PENDING from C before doing anything, this file asks the
-- factory for the three roles and stores the choice, and the forward runs again (nn.lua).
-- @module lutra.factory
local core = require("lutra.core")
local chk = require("lutra.check")
local ffi, C = core.ffi, core.C

local M = {}

-- in the Lua registry, like lutra/rules.lua's (ids are the process's; busted reloads modules)
local reg = debug.getregistry()
reg.lutra_factories = reg.lutra_factories or { fns = {}, where = {}, count = 0 }
local F = reg.lutra_factories

--- Registers a factory function; returns the id a custom recipe carries.
-- @local internal: lutra.recipe.custom calls it
function M.register(fn, where)
  F.count = F.count + 1
  F.fns[F.count] = fn
  F.where[F.count] = where
  return F.count
end

local quant_kinds = { none = C.LUTRA_QUANT_NONE, delayed = C.LUTRA_QUANT_DELAYED,
                      current = C.LUTRA_QUANT_CURRENT, mxfp8 = C.LUTRA_QUANT_MXFP8,
                      block_1d = C.LUTRA_QUANT_BLOCK_1D, block_2d = C.LUTRA_QUANT_BLOCK_2D,
                      rowwise = C.LUTRA_QUANT_ROWWISE, nvfp4 = C.LUTRA_QUANT_NVFP4 }
local fp8_dtypes = { e4m3 = C.LUTRA_E4M3, e5m2 = C.LUTRA_E5M2, e2m1 = C.LUTRA_E2M1 }
local allowed = { kind = true, format = true, power_2_scale = true, amax_epsilon = true,
                  columnwise_format = true }
local nvfp4 = require("lutra.nvfp4")
for k in pairs(nvfp4.role_fields) do allowed[k] = true end

local id_box = ffi.new("int[1]")
local str_box = ffi.new("const char*[2]")
local choices = ffi.new("lutra_factory_choice[3]")

-- The factory's choice for each role into `choices` (errors name the factory and the role).
local function choose(fn, kind, name)
  local where = string.format("lutra.recipe.custom: the factory (for %s '%s')", kind, name)
  for i, role in ipairs(core.role_list) do
    local c = fn(role, kind, name)
    if type(c) ~= "table" then
      error(string.format("%s returned %s for %s (expected a table {kind=, format=, ...})", where,
                          chk.got(c), role), 0)
    end
    core.check_options(c, allowed, where .. " " .. role)
    if c.kind == nil then error(string.format("%s: %s has no kind", where, role), 0) end
    local ch = choices[i - 1]
    ch.kind = core.code(quant_kinds, c.kind, "kind", where .. " " .. role)
    local dflt = c.kind == "nvfp4" and "e2m1" or (role == "grad_output" and "e5m2" or "e4m3")
    ch.format = core.code(fp8_dtypes, c.format or dflt, "format", where .. " " .. role)
    if nvfp4.stray_options(c) then
      error(string.format("%s: %s has NVFP4 options but kind %s", where, role, chk.got(c.kind)), 0)
    end
    ch.nvfp4 = c.kind == "nvfp4" and nvfp4.options(c, where .. " " .. role) or 0
    ch.power_2_scale = chk.flag(c.power_2_scale, role .. ".power_2_scale", where, 0)
    ch.amax_epsilon = c.amax_epsilon == nil and 0 or chk.number(c.amax_epsilon, "amax_epsilon", where)
    ch.columnwise_format = c.columnwise_format == nil and 0 or
                           core.code(fp8_dtypes, c.columnwise_format, "columnwise_format", where)
  end
end

--- Asks the factory of the waiting module (if one waits) and stores its choice: true when it did.
-- @local internal: lutra.nn's forward calls it (as core.resolve_factory)
function M.resolve()
  if C.lutra_factory_status() == 0 then return false end
  core.check(C.lutra_factory_request(id_box, str_box, str_box + 1))
  local id = id_box[0]
  local fn = F.fns[id]
  if not fn then error("lutra.recipe.custom: factory " .. id .. " is not registered in this Lua state", 0) end
  local kind, name = ffi.string(str_box[0]), ffi.string(str_box[1])
  local ok, err = pcall(choose, fn, kind, name)
  if not ok then
    C.lutra_factory_cancel() -- nothing waits now: the module asks again at its next forward
    error(err, 0)
  end
  local st = C.lutra_factory_resolve(choices)
  if st ~= 0 then
    C.lutra_factory_cancel()
    core.fail()
  end
  return true
end

core.resolve_factory = M.resolve
return M
