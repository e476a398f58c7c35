-- A training step from Lua must compile to a LuaJIT trace: an abort (an NYI in the front, a
-- closure or table built per call, a C call LuaJIT cannot compile) would put the interpreter
-- back on the hot path. Each loop runs in its own LuaJIT process with the trace output on
-- (-jv), which is then read (spec/support/jit_trace.lua): the loop must form a loop trace and no
-- trace may abort with NYI.
local J = require("spec.support.jit_trace")
local LOOP = "spec/support/jit_loop.lua"

describe("LuaJIT traces of a training loop", function()
  for _, recipe in ipairs { "none", "delayed", "current", "mxfp8", "block", "lua_rule" } do
    it("form a loop trace without NYI aborts with recipe " .. recipe, function()
      J.assert_compiles(LOOP, recipe)
    end)
  end

  it("notice an NYI abort when the loop creates a closure per step", function()
    -- guards the guard: the same parsing must see the abort and no loop trace
    local loops, aborts = J.run(LOOP, "none", "closure")
    assert.is_true(#aborts > 0)
    assert.are.equal(0, loops)
  end)

  it("form a loop trace when the loop reads its output into a host buffer (tensor:read)", function()
    J.assert_compiles("spec/support/jit_read_loop.lua")
  end)

  it("leave out an NYI abort of the set-up, before the training loop", function()
    -- the set-up's abort is in the whole process's log, and only the loop's log is checked
    local loops, aborts = J.run(LOOP, "none", "setup_closure")
    assert.are.same({}, aborts)
    assert.is_true(loops >= 1)
  end)
end)
