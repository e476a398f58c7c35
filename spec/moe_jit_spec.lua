-- An MoE step from Lua (lutra.moe router, permute, unpermute and backwards) compiles to a LuaJIT
-- loop trace without NYI aborts, as spec/jit_spec.lua checks for the MLP step: the loop runs in
-- its own process with -jv and the trace log is read.
local J = require("spec.support.jit_trace")

describe("LuaJIT traces of an MoE training loop", function()
  it("form a loop trace without NYI aborts", function()
    J.assert_compiles("spec/support/moe_jit_loop.lua")
  end)

  it("of nn.MoEMLP (forward, backward, a step, its routing read) form a loop trace too", function()
    J.assert_compiles("spec/support/moe_mlp_jit_loop.lua")
  end)
end)
