-- The tensor-parallel modules in a training loop compile to a LuaJIT trace (as spec/jit_spec.lua
-- checks for Linear): the loop of spec/support/jit_tp_loop.lua (LayerNormMLP over a TP group,
-- column-parallel LayerNormLinear, row-parallel GroupedLinear; one MPI rank) runs in its own
-- process with -jv, with and without sequence parallelism, and must form a loop trace
-- with no NYI abort, per recipe. Skipped without MPI.
local J = require("spec.support.jit_trace")
local LOOP = "spec/support/jit_tp_loop.lua"

describe("LuaJIT traces of a tensor-parallel training loop", function()
  if not require("lutra").dist.available() then
    pending("skipped: liblutra was built without MPI")
    return
  end
  for _, recipe in ipairs { "none", "delayed", "mxfp8" } do
    for _, sp in ipairs { "nosp", "sp" } do
      it("form a loop trace without NYI aborts with recipe " .. recipe .. ", " .. sp, function()
        J.assert_compiles(LOOP, recipe, sp)
      end)
    end
  end
end)
