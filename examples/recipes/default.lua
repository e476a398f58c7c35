-- Recipes for examples/recipe_lab.lua: a list of {name = ..., recipe = function(lutra) ... end}
-- (recipe nil: no FP8, the f32 reference the others are compared with; the first entry without
-- a recipe is that reference; fp8_head = true: --model gpt runs its LM head in FP8 too). Copy
-- this file, change or add entries, and run
--   luajit examples/recipe_lab.lua --recipes my_recipes.lua
return {
  { name = "f32" },
  { name = "delayed", recipe = function(lutra) return lutra.recipe.delayed { amax_history_len = 16 } end },
  { name = "current", recipe = function(lutra) return lutra.recipe.current() end },
  { name = "mxfp8", recipe = function(lutra) return lutra.recipe.mxfp8() end },
  { name = "block", recipe = function(lutra) return lutra.recipe.block() end },
  -- a rule written here: the amax an exponential moving average carried by the old scale (no
  -- history loop, so it compiles into the training loop's trace), with one bit of headroom
  { name = "ema_rule", recipe = function(lutra)
    return lutra.recipe.delayed {
      amax_history_len = 2,
      amax_compute_algo = function(h) return h[0] end,
      scaling_factor_compute_algo = function(amax, old_scale, fp8_max, margin)
        local top = fp8_max / 2 ^ (margin + 1)
        local ema = old_scale == 1 and amax or 0.8 * (top / old_scale) + 0.2 * amax
        return top / ema
      end,
    }
  end },
  -- per module: the last Linear ("head") in high precision, the others current scaling
  { name = "head_hp", recipe = function(lutra)
    return lutra.recipe.custom { factory = function(role, _, name)
      if name == "head" then return { kind = "none" } end
      return { kind = "current", format = role == "grad_output" and "e5m2" or "e4m3" }
    end }
  end },
  { name = "delayed_bwd_hp", recipe = function(lutra)
    return lutra.recipe.delayed { amax_history_len = 16, backward_override = "high_precision" }
  end },
  -- TE's NVFP4BlockScaling: E2M1 with E4M3 scales per 16, 16x16 weight tiles, stochastic
  -- rounding for gradients, the RHT on the wgrad inputs (on Hopper the GEMMs run in BF16)
  { name = "nvfp4", recipe = function(lutra) return lutra.recipe.nvfp4 { seed = 1 } end },
}
