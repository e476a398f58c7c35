--- Recipes from option tables, parsed once. Field names and defaults follow TransformerEngine.
--   lutra.recipe.delayed{margin=0, fp8_format="hybrid", amax_history_len=1024,
--                        amax_compute_algo="max", reduce_amax=true}
--     amax_compute_algo may be a function(history, n), and scaling_factor_compute_algo a
--     function(amax, old_scale, fp8_max, margin): Lua scaling rules (lutra/rules.lua)
--   lutra.recipe.current{fp8_format="hybrid", power_2_scale=false, amax_epsilon=0}
--   lutra.recipe.mxfp8{fp8_format="e4m3"}
--   lutra.recipe.block{fp8_format="e4m3", power_2_scale=true, amax_epsilon=0,
--                      block_dim={input=1, weight=2, grad_output=1}}
--   lutra.recipe.custom{input={kind="current", format="e4m3"}, weight={...},
--                       grad_output={kind="delayed", format="e5m2"}, margin=0, ...}
--     a role's columnwise_format (e4m3/e5m2) different from its format makes it hybrid (TE's
--     hybrid quantizer): the rowwise copy (fprop; dgrad's gradient) in format, the columnwise
--     one (wgrad's input and gradient, dgrad's weight) in columnwise_format, two quantizations
--   lutra.recipe.custom{factory=function(role, module_kind, name) return {kind=, format=} end}
--     (per module, asked once per module: lutra/factory.lua)
-- Per-role options (power_2_scale, amax_epsilon, block_dim) take one value for all roles or a
-- table {input=..., weight=..., grad_output=...}.
-- @module lutra.recipe
local core = require("lutra.core")
local chk = require("lutra.check")
local rules = require("lutra.rules")
local factory = require("lutra.factory")
local nvfp4 = require("lutra.nvfp4")
local ffi, C, check = core.ffi, core.C, core.check

local M = {}

local formats = { e4m3 = C.LUTRA_FORMAT_E4M3, hybrid = C.LUTRA_FORMAT_HYBRID,
                  e5m2 = C.LUTRA_FORMAT_E5M2 }
local algos = { max = C.LUTRA_AMAX_MAX, most_recent = C.LUTRA_AMAX_MOST_RECENT }
local quant_kinds = { none = C.LUTRA_QUANT_NONE, delayed = C.LUTRA_QUANT_DELAYED,
                      current = C.LUTRA_QUANT_CURRENT, mxfp8 = C.LUTRA_QUANT_MXFP8,
                      block_1d = C.LUTRA_QUANT_BLOCK_1D, block_2d = C.LUTRA_QUANT_BLOCK_2D,
                      rowwise = C.LUTRA_QUANT_ROWWISE, nvfp4 = C.LUTRA_QUANT_NVFP4 }
local kind_names = { [0] = "delayed", "current", "mxfp8", "block", "custom", "custom" }
local fp8_dtypes = { e4m3 = C.LUTRA_E4M3, e5m2 = C.LUTRA_E5M2, e2m1 = C.LUTRA_E2M1 }

local Recipe = {}
Recipe.__index = Recipe

local function own(r) return ffi.gc(r, C.lutra_recipe_unref) end

-- Converters for option values: each refuses what it cannot take exactly ("no" for a boolean,
-- 1.5 or "1" for an integer) instead of truncating or treating it as true. Level 5: the
-- converter, per_role or fill, make, the constructor, its caller.
local I32 = 2 ^ 31
local function bool(where, name)
  return function(v) return chk.flag(v, name, where, nil, 5) end
end
local function int32(where, name)
  return function(v) return chk.integer(v, name, where, -I32, I32 - 1, 5) end
end
local function num(where, name)
  return function(v) return chk.number(v, name, where, 5) end
end

-- Writes a per-role option into arr[0..2].
local function per_role(arr, value, where, name, convert)
  if value == nil then return end
  if type(value) == "table" then
    for k in pairs(value) do
      if core.roles[k] == nil then
        error(string.format("%s: %s has unknown role '%s'", where, name, tostring(k)), 4)
      end
    end
    for i, role in ipairs(core.role_list) do
      if value[role] ~= nil then arr[i - 1] = convert(value[role]) end
    end
  else
    local v = convert(value)
    for i = 0, 2 do arr[i] = v end
  end
end

-- Options every recipe takes (lutra/recipe_options.h):
--   gemm = {fprop = {use_split_accumulator = false}, dgrad = {...}, wgrad = {...}}
--     TransformerEngine's MMParams per GEMM (defaults: false for fprop, true for dgrad and
--     wgrad); false runs the FP8 GEMM with cuBLASLt's fast accumulation
--   backward_override = "high_precision" | "dequantized": the backward GEMMs in high precision,
--     from the saved high-precision x and W, or from the forward's FP8 x and W dequantized
local overrides = { fp8 = C.LUTRA_BACKWARD_FP8, high_precision = C.LUTRA_BACKWARD_HIGH_PRECISION,
                    dequantized = C.LUTRA_BACKWARD_DEQUANTIZED }
local gemm_names = { fprop = C.LUTRA_GEMM_FPROP, dgrad = C.LUTRA_GEMM_DGRAD, wgrad = C.LUTRA_GEMM_WGRAD }

local function with_options(r, opts, where)
  if opts.gemm == nil and opts.backward_override == nil then return r end
  local o = ffi.new("lutra_recipe_options")
  C.lutra_recipe_options_defaults(o)
  if opts.gemm ~= nil then
    if type(opts.gemm) ~= "table" then
      error(string.format("%s: gemm must be a table {fprop=, dgrad=, wgrad=} (got %s)", where,
                          chk.got(opts.gemm)), 4)
    end
    for name, g in pairs(opts.gemm) do
      local i = gemm_names[name]
      if i == nil then
        error(string.format("%s: gemm has unknown GEMM '%s' (expected fprop, dgrad or wgrad)",
                            where, tostring(name)), 4)
      end
      core.check_options(g, { use_split_accumulator = true }, where .. " gemm." .. name)
      if g.use_split_accumulator ~= nil then
        o.use_split_accumulator[i] = chk.flag(g.use_split_accumulator,
                                              "gemm." .. name .. ".use_split_accumulator", where, 0, 4)
      end
    end
  end
  if opts.backward_override ~= nil then
    o.backward_override = core.code(overrides, opts.backward_override, "backward_override", where)
  end
  local box = ffi.new("lutra_recipe*[1]")
  check(C.lutra_recipe_with_options(r, o, box))
  return own(box[0])
end

local function make(ctor, desc_type, defaults, opts, allowed, where, fill)
  allowed.gemm, allowed.backward_override = true, true
  opts = core.check_options(opts, allowed, where)
  local d = ffi.new(desc_type)
  defaults(d)
  fill(d, opts)
  local box = ffi.new("lutra_recipe*[1]")
  check(ctor(d, box))
  return with_options(own(box[0]), opts, where)
end

-- The delayed-scaling fields shared by the delayed and custom recipes. amax_compute_algo and
-- scaling_factor_compute_algo may be Lua functions (lutra/rules.lua): the recipe then carries
-- their rule id.
local function fill_delayed(d, o, where)
  if o.margin ~= nil then d.margin = int32(where, "margin")(o.margin) end
  if o.amax_history_len ~= nil then
    d.amax_history_len = int32(where, "amax_history_len")(o.amax_history_len)
  end
  local amax_fn, scale_fn = nil, nil
  if type(o.amax_compute_algo) == "function" then
    amax_fn = o.amax_compute_algo
  elseif o.amax_compute_algo ~= nil then
    d.amax_compute_algo = core.code(algos, o.amax_compute_algo, "amax_compute_algo", where)
  end
  local sf = o.scaling_factor_compute_algo
  if sf ~= nil then
    if type(sf) ~= "function" then
      error(string.format("%s: scaling_factor_compute_algo must be a function (got %s)", where,
                          chk.got(sf)), 5)
    end
    scale_fn = sf
  end
  if amax_fn or scale_fn then d.rule = rules.register(amax_fn, scale_fn, where) end
  if o.reduce_amax ~= nil then d.reduce_amax = bool(where, "reduce_amax")(o.reduce_amax) end
end

--- TransformerEngine's DelayedScaling: scales from an amax history, updated once per
-- outermost autocast exit. FP8 shapes: both matrix dims multiples of 16.
--
-- @tparam[opt] table opts {margin = 0, fp8_format = "hybrid" (or "e4m3"),
-- amax_history_len = 1024, amax_compute_algo = "max" (or "most_recent"), reduce_amax = true}
function M.delayed(opts)
  local where = "lutra.recipe.delayed"
  return make(C.lutra_recipe_delayed, "lutra_delayed_desc", C.lutra_delayed_defaults, opts,
    { margin = true, fp8_format = true, amax_history_len = true, amax_compute_algo = true,
      scaling_factor_compute_algo = true, reduce_amax = true }, where, function(d, o)
      if o.fp8_format ~= nil then d.fp8_format = core.code(formats, o.fp8_format, "fp8_format", where) end
      fill_delayed(d, o, where)
    end)
end

--- Float8CurrentScaling: each tensor scaled by its own amax. FP8 shapes: multiples of 16.
--
-- @tparam[opt] table opts {fp8_format = "hybrid", power_2_scale = false, amax_epsilon = 0}
-- (the last two per role: one value or {input =, weight =, grad_output =})
function M.current(opts)
  local where = "lutra.recipe.current"
  return make(C.lutra_recipe_current, "lutra_current_desc", C.lutra_current_defaults, opts,
    { fp8_format = true, power_2_scale = true, amax_epsilon = true }, where, function(d, o)
      if o.fp8_format ~= nil then d.fp8_format = core.code(formats, o.fp8_format, "fp8_format", where) end
      per_role(d.power_2_scale, o.power_2_scale, where, "power_2_scale", bool(where, "power_2_scale"))
      per_role(d.amax_epsilon, o.amax_epsilon, where, "amax_epsilon", num(where, "amax_epsilon"))
    end)
end

--- MXFP8BlockScaling: 1x32 blocks with E8M0 scales. FP8 shapes: multiples of 32.
--
-- @tparam[opt] table opts {fp8_format = "e4m3" (or "hybrid")}
function M.mxfp8(opts)
  local where = "lutra.recipe.mxfp8"
  return make(C.lutra_recipe_mxfp8, "lutra_mxfp8_desc", C.lutra_mxfp8_defaults, opts,
    { fp8_format = true, margin = true }, where, function(d, o)
      if o.fp8_format ~= nil then d.fp8_format = core.code(formats, o.fp8_format, "fp8_format", where) end
      if o.margin ~= nil then d.margin = int32(where, "margin")(o.margin) end
    end)
end

--- Float8BlockScaling: 1x128 blocks (inputs, gradients) and 128x128 tiles (weights), f32
-- scales. FP8 shapes: multiples of 16 are accepted (partial blocks are padded); multiples of 128
-- fill every block.
--
-- @tparam[opt] table opts {fp8_format = "e4m3", power_2_scale = true, amax_epsilon = 0,
-- block_dim = {input = 1, weight = 2, grad_output = 1}} (1: 1x128, 2: 128x128)
function M.block(opts)
  local where = "lutra.recipe.block"
  return make(C.lutra_recipe_block, "lutra_block_desc", C.lutra_block_defaults, opts,
    { fp8_format = true, power_2_scale = true, amax_epsilon = true, block_dim = true }, where,
    function(d, o)
      if o.fp8_format ~= nil then d.fp8_format = core.code(formats, o.fp8_format, "fp8_format", where) end
      per_role(d.power_2_scale, o.power_2_scale, where, "power_2_scale", bool(where, "power_2_scale"))
      per_role(d.amax_epsilon, o.amax_epsilon, where, "amax_epsilon", num(where, "amax_epsilon"))
      per_role(d.block_dim, o.block_dim, where, "block_dim", int32(where, "block_dim"))
    end)
end

-- lutra.recipe.custom{factory = function(role, module_kind, name) ... end, margin=, ...}: the
-- quantizers chosen per module (lutra/factory.lua)
local function custom_factory(opts, where)
  if type(opts.factory) ~= "function" then
    error(string.format("%s: factory must be a function (got %s)", where, chk.got(opts.factory)), 3)
  end
  return make(C.lutra_recipe_factory, "lutra_factory_desc", C.lutra_factory_defaults, opts,
    { factory = true, margin = true, amax_history_len = true, amax_compute_algo = true,
      scaling_factor_compute_algo = true, reduce_amax = true, rht_signs = true,
      nvfp4_seed = true }, where, function(d, o)
      d.factory = factory.register(o.factory, where)
      fill_delayed(d, o, where)
      nvfp4.fill_recipe(d, o, where)
    end)
end

--- A quantizer kind and format per role; refused when a GEMM would be E5M2 x E5M2.
--
-- @tparam table opts {input = {kind =, format =, columnwise_format =}, weight = {...},
-- grad_output = {...}, plus delayed's fields}; kinds "none", "delayed", "current", "mxfp8",
-- "block_1d", "block_2d", "rowwise", "nvfp4"; formats "e4m3", "e5m2" ("e2m1" for nvfp4, its
-- default; a columnwise_format other than format makes the role hybrid). An nvfp4 role takes
-- fp4_2d_quantization, stochastic_rounding and random_hadamard_transform, the recipe rht_signs
-- and nvfp4_seed (lutra/nvfp4.lua). Or {factory = function(role, module_kind, name), margin =, ...}:
-- the quantizers chosen per module at its first forward (lutra/factory.lua).
function M.custom(opts)
  local where = "lutra.recipe.custom"
  if type(opts) == "table" and opts.factory ~= nil then return custom_factory(opts, where) end
  return make(C.lutra_recipe_custom, "lutra_custom_desc", C.lutra_custom_defaults, opts,
    { input = true, weight = true, grad_output = true, margin = true, amax_history_len = true,
      amax_compute_algo = true, scaling_factor_compute_algo = true, reduce_amax = true,
      rht_signs = true, nvfp4_seed = true }, where,
    function(d, o)
      for i, role in ipairs(core.role_list) do
        local r = o[role]
        if r ~= nil then
          if type(r) ~= "table" then
            error(string.format("%s: %s must be a table (got %s)", where, role, chk.got(r)), 5)
          end
          core.check_options(r, { kind = true, format = true, power_2_scale = true,
                                  amax_epsilon = true, columnwise_format = true,
                                  fp4_2d_quantization = true, stochastic_rounding = true,
                                  random_hadamard_transform = true },
                             where .. " " .. role)
          if nvfp4.stray_options(r) then
            error(string.format("%s: %s has NVFP4 options but kind %s (not \"nvfp4\")", where,
                                role, chk.got(r.kind)), 5)
          end
          if r.kind == "nvfp4" then
            d.format[i - 1] = C.LUTRA_E2M1
            d.nvfp4[i - 1] = nvfp4.options(r, where .. " " .. role)
          end
          if r.columnwise_format ~= nil then
            d.columnwise_format[i - 1] = core.code(fp8_dtypes, r.columnwise_format,
                                                   "columnwise_format", where)
          end
          if r.kind ~= nil then d.kind[i - 1] = core.code(quant_kinds, r.kind, "kind", where) end
          if r.format ~= nil then d.format[i - 1] = core.code(fp8_dtypes, r.format, "format", where) end
          if r.power_2_scale ~= nil then
            d.power_2_scale[i - 1] = bool(where, role .. ".power_2_scale")(r.power_2_scale)
          end
          if r.amax_epsilon ~= nil then
            d.amax_epsilon[i - 1] = num(where, role .. ".amax_epsilon")(r.amax_epsilon)
          end
        end
      end
      fill_delayed(d, o, where)
      nvfp4.fill_recipe(d, o, where)
    end)
end

--- TransformerEngine's NVFP4BlockScaling (lutra/nvfp4.lua): input 1x16 blocks with the random
-- Hadamard transform on its columnwise (wgrad) copy, weight 16x16 tiles, grad_output 1x16
-- with stochastic rounding and the RHT. E2M1 codes, E4M3 scales per 16, an f32 scale per copy;
-- shapes: multiples of 16. The CPU emulates it bit-exactly; Hopper runs the GEMMs on operands
-- dequantized to BF16.
--
-- @tparam[opt] table opts {disable_rht = false, disable_stochastic_rounding = false,
-- disable_2d_quantization = false, seed = 0, rht_signs = TE's sign vector, gemm =,
-- backward_override =}
function M.nvfp4(opts)
  return nvfp4.recipe(opts, M.custom)
end

--- Torchao's ROWWISE (lutra/formats.h): one f32 scale per row of each copy, for every role.
-- The CPU backend emulates it; on CUDA the GEMMs run on operands dequantized to BF16.
--
-- @tparam[opt] table opts {fp8_format = "e4m3" (or "hybrid": E5M2 for grad_output),
-- power_2_scale = true, amax_epsilon = 0, gemm =, backward_override =}
function M.rowwise(opts)
  local where = "lutra.recipe.rowwise"
  opts = core.check_options(opts, { fp8_format = true, power_2_scale = true, amax_epsilon = true,
                                    gemm = true, backward_override = true }, where)
  local f = opts.fp8_format or "e4m3"
  if f ~= "e4m3" and f ~= "hybrid" then
    error(string.format("%s: fp8_format must be \"e4m3\" or \"hybrid\" (got %s)", where,
                        tostring(f)), 2)
  end
  local p2 = opts.power_2_scale == nil and true or opts.power_2_scale
  local roles = {}
  for _, role in ipairs(core.role_list) do
    roles[role] = { kind = "rowwise", power_2_scale = p2, amax_epsilon = opts.amax_epsilon,
                    format = (f == "hybrid" and role == "grad_output") and "e5m2" or "e4m3" }
  end
  roles.gemm, roles.backward_override = opts.gemm, opts.backward_override
  return M.custom(roles)
end

--- A recipe by name, for command-line flags.
-- @tparam string name "delayed", "current", "mxfp8", "block", "custom", "nvfp4", "rowwise";
-- "none" (or nil) gives nil
-- @tparam[opt] table opts the named constructor's options
-- @return the recipe, or nil
function M.named(name, opts)
  if name == nil or name == "none" then return nil end
  local ctor = M[name]
  if type(ctor) ~= "function" or name == "named" then
    error("lutra.recipe.named: unknown recipe '" .. tostring(name) ..
          "' (expected none, delayed, current, mxfp8, block or custom)", 2)
  end
  return ctor(opts)
end

--- A recipe (lutra.recipe.*): immutable, shared by the scopes and quantizers that use it.
-- @type Recipe

--- "delayed", "current", "mxfp8", "block" or "custom".
function Recipe:kind()
  check(C.lutra_recipe_kind(self, core.int_box))
  return kind_names[core.int_box[0]]
end

local key_box = ffi.new("uint64_t[1]")
--- A 64-bit key that equal recipes share (uint64 cdata).
function Recipe:key()
  check(C.lutra_recipe_key(self, key_box))
  return key_box[0]
end

-- (ipairs over a list: a pairs loop at load time can start a trace that aborts, NYI)
local quant_kind_names = {}
for _, k in ipairs { "none", "delayed", "current", "mxfp8", "block_1d", "block_2d", "rowwise",
                     "nvfp4" } do
  quant_kind_names[tonumber(quant_kinds[k])] = k
end

--- What the recipe does with a role: quantizer kind name and FP8 dtype name.
function Recipe:role(role)
  local r = core.code(core.roles, role, "role", "recipe:role")
  check(C.lutra_recipe_role(self, r, core.int_box, core.int_box + 1))
  local dtype_names = require("lutra.tensor").dtype_names
  return quant_kind_names[core.int_box[0]], dtype_names[core.int_box[1]]
end

local options_box = ffi.new("lutra_recipe_options")
local override_names = { [0] = "fp8", "high_precision", "dequantized" }
--- The recipe's per-GEMM settings and backward override.
--
-- @treturn table {gemm = {fprop = {use_split_accumulator =}, dgrad = ..., wgrad = ...},
-- backward_override = "fp8" | "high_precision" | "dequantized"}
function Recipe:options()
  check(C.lutra_recipe_options_of(self, options_box))
  local g = {}
  for name, i in pairs(gemm_names) do
    g[name] = { use_split_accumulator = options_box.use_split_accumulator[i] ~= 0 }
  end
  return { gemm = g, backward_override = override_names[options_box.backward_override] }
end

--- Frees the recipe now; later calls on it are errors.
function Recipe:destroy() check(C.lutra_recipe_destroy(self)) end

ffi.metatype("struct lutra_recipe", { __index = Recipe,
  __tostring = function(r) return "lutra.recipe(" .. r:kind() .. ")" end })

return M
