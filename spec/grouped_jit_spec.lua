-- A GroupedLinear training step from Lua, with m_splits changing every step, must compile to a
-- LuaJIT trace (the method of spec/jit_spec.lua: a separate process with -jv, whose log must
-- show a loop trace at the training loop and no NYI abort).
local LUAJIT = os.getenv("LUAJIT") or "luajit"
local LOOP = "spec/support/jit_grouped_loop.lua"

local function loop_line()
  local n = 0
  for line in io.lines(LOOP) do
    n = n + 1
    if line:find("TRAINING LOOP", 1, true) then return n end
  end
  error("no TRAINING LOOP marker in " .. LOOP)
end

local function run(recipe, kind)
  local log = os.tmpname()
  local p = assert(io.popen(string.format("%s -jv=%s %s %s %s 2>&1", LUAJIT, log, LOOP, recipe,
                                          kind)))
  local out = p:read("*a")
  p:close()
  local f = assert(io.open(log))
  local trace = f:read("*a")
  f:close()
  os.remove(log)
  assert(out:find("total loss"), "the loop did not run:\n" .. out)
  local loops, aborts, linked = 0, {}, 0
  local where = ("jit_grouped_loop.lua:"):gsub("%p", "%%%0")
  local inner = {}
  for line in trace:gmatch("[^\n]+") do
    if line:find("^%[TRACE%s+%d+ .*" .. where .. loop_line() .. " loop%]") then loops = loops + 1 end
    local n = line:match("^%[TRACE%s+(%d+) grouped%.lua:%d+ loop%]")
    if n then inner[n] = true end
    local back = line:match("^%[TRACE%s+%d+ %(%d+/%d+%) .* %-> (%d+)%]")
    if back and inner[back] then linked = linked + 1 end
    -- or the step's root trace at the loop file, entering the splits loop's trace (the trace
    -- order depends on which loop gets hot first, which varies from run to run)
    local root_back = line:match("^%[TRACE%s+%d+ " .. where .. "%d+ %-> (%d+)%]")
    if root_back and inner[root_back] then linked = linked + 1 end
    if line:find("^%[TRACE %-%-%-") and line:find("NYI", 1, true) then aborts[#aborts + 1] = line end
  end
  return loops, aborts, trace, linked
end

describe("LuaJIT traces of a GroupedLinear training loop", function()
  for _, case in ipairs { { "none", "tensor" }, { "delayed", "tensor" }, { "current", "tensor" } } do
    it("form a loop trace without NYI aborts (" .. case[1] .. ", splits as an i32 tensor)", function()
      local loops, aborts, trace = run(case[1], case[2])
      assert.are.same({}, aborts)
      assert.is_true(loops >= 1, "no loop trace formed at the training loop:\n" .. trace)
    end)
  end
  -- a Lua table is copied into the module's host buffer by a loop: LuaJIT compiles that inner
  -- loop as the root trace and the rest of the step as a side trace linked back into it (or as
  -- a root trace at the loop that enters it), so the whole step still runs compiled (no NYI
  -- abort, the interpreter is not on the hot path)
  for _, recipe in ipairs { "none", "current" } do
    it("compile the step without NYI aborts with splits as a Lua table (" .. recipe .. ")", function()
      local loops, aborts, trace, linked = run(recipe, "table")
      assert.are.same({}, aborts)
      assert.is_true(loops >= 1 or linked >= 1,
                     "neither a loop trace nor a side trace linked into the splits loop:\n" .. trace)
    end)
  end
end)
