-- The trace check the JIT specs share (spec/*jit*_spec.lua): a loop script runs in its own LuaJIT
-- process with the trace output on (-jv), which is then read. A separate process keeps busted's
-- own code out of the traces, and jit.attach handlers are not reliable inside busted with this
-- LuaJIT. The script marks its training loop with a "TRAINING LOOP" comment, switches the trace
-- log to the file LUTRA_JIT_LOOP_LOG names just before the loop (jit.v's on), and prints "total
-- loss" when it ran. Only what is traced from the switch on is checked: a load-time loop of the
-- library (run once, before training) may start a trace through LuaJIT's shared hot counters and
-- abort, which says nothing about the training loop. Not a spec itself (no _spec in its name).
local assert = require("luassert")

local M = {}

local LUAJIT = os.getenv("LUAJIT") or "luajit"

-- the line of the TRAINING LOOP marker in the script
local function marker_line(script)
  local n = 0
  for line in io.lines(script) do
    n = n + 1
    if line:find("TRAINING LOOP", 1, true) then return n end
  end
  error("no TRAINING LOOP marker in " .. script)
end

-- Runs script with the words args under -jv. Returns the count of loop traces that start at the
-- marked loop, the NYI aborts (their lines) and the trace log, all from the loop's start on.
function M.run(script, ...)
  local log, loop_log = os.tmpname(), os.tmpname()
  os.remove(loop_log) -- the script creates it at its loop
  -- the child finds lutra as this process does: busted's --lpath sets package.path here, not the
  -- LUA_PATH a child inherits (make test sets both; a bare `busted --lpath` only the first)
  local lua_path = "'" .. package.path:gsub("'", "'\\''") .. "'"
  local cmd = string.format("LUA_PATH=%s LUTRA_JIT_LOOP_LOG=%s %s -jv=%s %s %s 2>&1", lua_path,
                            loop_log, LUAJIT, log, script, table.concat({ ... }, " "))
  local p = assert(io.popen(cmd))
  local out = p:read("*a")
  p:close()
  os.remove(log)
  local f = io.open(loop_log)
  assert(f, script .. " did not switch the trace log at its loop (LUTRA_JIT_LOOP_LOG):\n" .. out)
  local trace = f:read("*a")
  f:close()
  os.remove(loop_log)
  assert(out:find("total loss"), "the loop did not run:\n" .. out)
  local where = (script:match("[^/]+$") .. ":"):gsub("%p", "%%%0")
  local at_loop = "^%[TRACE%s+%d+ .*" .. where .. marker_line(script) .. " loop%]"
  local loops, aborts = 0, {}
  for line in trace:gmatch("[^\n]+") do
    if line:find(at_loop) then loops = loops + 1 end
    if line:find("^%[TRACE %-%-%-") and line:find("NYI", 1, true) then aborts[#aborts + 1] = line end
  end
  return loops, aborts, trace
end

-- the script's training loop forms a loop trace and no trace aborts with NYI
function M.assert_compiles(script, ...)
  local loops, aborts, trace = M.run(script, ...)
  assert.are.same({}, aborts)
  assert.is_true(loops >= 1, "no loop trace formed at the training loop:\n" .. trace)
end

return M
