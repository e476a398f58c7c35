-- A GroupedLinear training step from Lua, with m_splits changing every step, must compile to a
-- LuaJIT trace (the method of spec/jit_spec.lua: a separate process with -jv, whose log must
-- show a loop trace at the training loop and no NYI abort).
local J = require("spec.support.jit_trace")
local LOOP = "spec/support/jit_grouped_loop.lua"

-- side traces of the step linked back into a root trace of grouped.lua's splits loop
local function linked_to_splits_loop(trace)
  local inner, linked = {}, 0
  for line in trace:gmatch("[^\n]+") do
    local n = line:match("^%[TRACE%s+(%d+) grouped%.lua:%d+ loop%]")
    if n then inner[n] = true end
    local back = line:match("^%[TRACE%s+%d+ %(%d+/%d+%) .* %-> (%d+)%]")
    if back and inner[back] then linked = linked + 1 end
    -- or the step's root trace at the loop file, entering the splits loop's trace (the trace
    -- order depends on which loop gets hot first, which varies from run to run)
    local root_back = line:match("^%[TRACE%s+%d+ [%w_]+%.lua:%d+ %-> (%d+)%]")
    if root_back and inner[root_back] then linked = linked + 1 end
  end
  return linked
end

describe("LuaJIT traces of a GroupedLinear training loop", function()
  for _, case in ipairs { { "none", "tensor" }, { "delayed", "tensor" }, { "current", "tensor" } } do
    it("form a loop trace without NYI aborts (" .. case[1] .. ", splits as an i32 tensor)", function()
      J.assert_compiles(LOOP, case[1], case[2])
    end)
  end
  -- a Lua table is copied into the module's host buffer by a loop: LuaJIT compiles that inner
  -- loop as the root trace and the rest of the step as a side trace linked back into it (or as
  -- a root trace at the loop that enters it), so the whole step still runs compiled (no NYI
  -- abort, the interpreter is not on the hot path)
  for _, recipe in ipairs { "none", "current" } do
    it("compile the step without NYI aborts with splits as a Lua table (" .. recipe .. ")", function()
      local loops, aborts, trace = J.run(LOOP, recipe, "table")
      local linked = linked_to_splits_loop(trace)
      assert.are.same({}, aborts)
      assert.is_true(loops >= 1 or linked >= 1,
                     "neither a loop trace nor a side trace linked into the splits loop:\n" .. trace)
    end)
  end
end)
