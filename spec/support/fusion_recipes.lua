-- The recipes the activation-fusion specs run (spec/act_fusion_spec.lua, spec/grouped_mlp_spec.lua):
-- fuses: the per-tensor recipes, whose casts take an activation both ways; fuses_forward_only:
-- no grad_output quantizer, so only the forward's input cast takes it. Not a spec itself.
local R = require("lutra").recipe

return {
  { name = "delayed", make = function() return R.delayed {} end, fuses = true },
  { name = "current", make = function() return R.current {} end, fuses = true },
  { name = "mxfp8", make = function() return R.mxfp8 {} end },
  { name = "block", make = function() return R.block {} end },
  -- no grad_output quantizer: the backward reads the activation's output in high precision, so
  -- the fused cast writes it too (act_out)
  { name = "custom (grad_output none)", fuses_forward_only = true, make = function()
    return R.custom { input = { kind = "delayed" }, weight = { kind = "delayed" },
                      grad_output = { kind = "none" } }
  end },
}
