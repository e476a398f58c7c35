--- NVFP4 (TransformerEngine's NVFP4BlockScaling; lutra/nvfp4.h): E2M1 codes, E4M3 scales per
-- 16 elements and an f32 scale per copy, 16x16 tiles for weights, stochastic rounding for
-- gradients, the random Hadamard transform on the wgrad GEMM's inputs. Emulated bit-exactly on
-- the CPU; on Hopper the GEMMs dequantize both operands to BF16 (no FP4 tensor cores).
--
-- In a custom recipe (or a factory's choice) a role takes kind = "nvfp4" (format "e2m1", the
-- default for that kind) with TE's QParams names: fp4_2d_quantization, stochastic_rounding,
-- random_hadamard_transform (booleans, default false); the recipe takes rht_signs (a 16-bit
-- mask, bit i set: sign i is -1; default TE's wgrad sign vector) and nvfp4_seed (the stochastic
-- rounding's seed, default 0).
-- @module lutra.nvfp4
local core = require("lutra.core")
local chk = require("lutra.check")
local C = core.C

local M = {}

--- The role fields this module adds to a custom recipe's role table.
M.role_fields = { fp4_2d_quantization = true, stochastic_rounding = true,
                  random_hadamard_transform = true }

--- The recipe fields this module adds to lutra.recipe.custom.
M.recipe_fields = { rht_signs = true, nvfp4_seed = true }

--- The LUTRA_NVFP4_* options of a role table r (errors name where).
-- @tparam table r the role's table
-- @tparam string where the calling function's name, for errors
-- @treturn number the options
function M.options(r, where)
  local o = 0
  if chk.flag(r.fp4_2d_quantization, "fp4_2d_quantization", where, 0, 5) == 1 then
    o = o + C.LUTRA_NVFP4_2D
  end
  if chk.flag(r.stochastic_rounding, "stochastic_rounding", where, 0, 5) == 1 then
    o = o + C.LUTRA_NVFP4_SR
  end
  if chk.flag(r.random_hadamard_transform, "random_hadamard_transform", where, 0, 5) == 1 then
    o = o + C.LUTRA_NVFP4_RHT
  end
  return o
end

--- Whether a role table names NVFP4 options without kind = "nvfp4" (a mistake worth an error).
-- @tparam table r the role's table
-- @treturn boolean
function M.stray_options(r)
  return r.kind ~= "nvfp4" and (r.fp4_2d_quantization ~= nil or r.stochastic_rounding ~= nil or
                                r.random_hadamard_transform ~= nil)
end

--- Fills a lutra_custom_desc's NVFP4 fields from the recipe's option table o.
-- @param d the lutra_custom_desc cdata
-- @tparam table o the options
-- @tparam string where the calling function's name, for errors
function M.fill_recipe(d, o, where)
  if o.rht_signs ~= nil then d.rht_signs = chk.integer(o.rht_signs, "rht_signs", where, 0, 0xFFFF, 5) end
  if o.nvfp4_seed ~= nil then d.nvfp4_seed = chk.seed(o.nvfp4_seed, "nvfp4_seed", where, 5) end
end

--- TransformerEngine's NVFP4BlockScaling as a custom recipe: input 1x16 with the RHT on its
-- columnwise copy, weight in 16x16 tiles, grad_output 1x16 with stochastic rounding and the RHT.
-- @tparam[opt] table opts {disable_rht = false, disable_stochastic_rounding = false,
-- disable_2d_quantization = false, seed = 0, rht_signs = TE's, gemm =, backward_override =}
-- @tparam function custom lutra.recipe.custom
-- @return the recipe
function M.recipe(opts, custom)
  local where = "lutra.recipe.nvfp4"
  opts = core.check_options(opts, { disable_rht = true, disable_stochastic_rounding = true,
                                    disable_2d_quantization = true, seed = true, rht_signs = true,
                                    gemm = true, backward_override = true }, where)
  local rht = chk.flag(opts.disable_rht, "disable_rht", where, 0) == 0
  local sr = chk.flag(opts.disable_stochastic_rounding, "disable_stochastic_rounding", where, 0) == 0
  local tiles = chk.flag(opts.disable_2d_quantization, "disable_2d_quantization", where, 0) == 0
  return custom({
    input = { kind = "nvfp4", random_hadamard_transform = rht },
    weight = { kind = "nvfp4", fp4_2d_quantization = tiles },
    grad_output = { kind = "nvfp4", stochastic_rounding = sr, random_hadamard_transform = rht },
    nvfp4_seed = opts.seed, rht_signs = opts.rht_signs,
    gemm = opts.gemm, backward_override = opts.backward_override,
  })
end

--- The RHT of lutra/nvfp4.h on each 16 consecutive values along x's rows (the quantizers'
-- transform), into out (or x itself), or its inverse.
-- @param x an f32 CPU tensor whose last dim is a multiple of 16
-- @param[opt] out an f32 CPU tensor of x's shape (default: a new one)
-- @tparam[opt] boolean inverse the inverse transform
-- @tparam[opt] number signs the 16-bit sign mask (default TE's wgrad signs)
-- @return out
function M.rht(x, out, inverse, signs)
  local where = "lutra.nvfp4.rht"
  out = out or require("lutra.tensor").new(x:dims())
  signs = signs == nil and C.LUTRA_NVFP4_TE_SIGNS or chk.integer(signs, "signs", where, 0, 0xFFFF)
  core.check(C.lutra_nvfp4_rht(x, signs, chk.flag(inverse, "inverse", where, 0), out))
  return out
end

return M
