-- A training step from Lua must compile to a LuaJIT trace: an abort (an NYI in the front, a
-- closure or table built per call, a C call LuaJIT cannot compile) would put the interpreter
-- back on the hot path. Each loop runs in its own LuaJIT process with the trace output on
-- (-jv), which is then read: the loop must form a loop trace and no trace may abort with NYI.
-- (A separate process keeps busted's own code out of the traces, and jit.attach handlers are
-- not reliable inside busted with this LuaJIT.)
local LUAJIT = os.getenv("LUAJIT") or "luajit"
local LOOP = "spec/support/jit_loop.lua"

local function loop_line()
  local n = 0
  for line in io.lines(LOOP) do
    n = n + 1
    if line:find("TRAINING LOOP", 1, true) then return n end
  end
  error("no TRAINING LOOP marker in " .. LOOP)
end

local function run(recipe, variant)
  local log = os.tmpname()
  local cmd = string.format("%s -jv=%s %s %s %s 2>&1", LUAJIT, log, LOOP, recipe, variant or "")
  local p = assert(io.popen(cmd))
  local out = p:read("*a")
  p:close()
  local f = assert(io.open(log))
  local trace = f:read("*a")
  f:close()
  os.remove(log)
  assert(out:find("total loss"), "the loop did not run:\n" .. out)
  local where = LOOP:match("[^/]+$") .. ":"
  local loops, aborts = 0, {}
  for line in trace:gmatch("[^\n]+") do
    if line:find("^%[TRACE%s+%d+ .*" .. where:gsub("%p", "%%%0") .. loop_line() .. " loop%]") then
      loops = loops + 1
    end
    if line:find("^%[TRACE %-%-%-") and line:find("NYI", 1, true) then
      aborts[#aborts + 1] = line
    end
  end
  return loops, aborts, trace
end

describe("LuaJIT traces of a training loop", function()
  for _, recipe in ipairs { "none", "delayed", "current", "mxfp8", "block", "lua_rule" } do
    it("form a loop trace without NYI aborts with recipe " .. recipe, function()
      local loops, aborts, trace = run(recipe)
      assert.are.same({}, aborts)
      assert.is_true(loops >= 1, "no loop trace formed at the training loop:\n" .. trace)
    end)
  end

  it("notice an NYI abort when the loop creates a closure per step", function()
    -- guards the guard: the same parsing must see the abort and no loop trace
    local loops, aborts = run("none", "closure")
    assert.is_true(#aborts > 0)
    assert.are.equal(0, loops)
  end)
end)
