-- The norm-fused modules in a training loop compile to a LuaJIT trace (as spec/jit_spec.lua checks
-- for Linear): the loop of spec/support/jit_prenorm_loop.lua (Residual, LayerNormMLP,
-- LayerNormLinear, RMSNorm, Linear) runs in its own process with -jv, and must form a loop trace
-- with no NYI abort, per recipe.
local J = require("spec.support.jit_trace")
local LOOP = "spec/support/jit_prenorm_loop.lua"

describe("LuaJIT traces of a pre-norm training loop", function()
  for _, recipe in ipairs { "none", "delayed", "mxfp8" } do
    it("form a loop trace without NYI aborts with recipe " .. recipe, function()
      J.assert_compiles(LOOP, recipe)
    end)
  end
end)
