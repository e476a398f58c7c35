-- Builds spec/native/threads_check.c against ./liblutra.so with the system C compiler (cc, or $CC)
-- and runs it; shared by spec/threads_spec.lua (cpu) and spec/gpu/threads_gpu.lua (cuda). Not a
-- spec itself. Built here rather than through make: make would reconfigure the library (its
-- CUDA switch is detected), and the specs must test the library as it was built.
local M = {}

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("*a")
  local ok, _, code = p:close()
  if type(ok) == "number" then code = ok; ok = code == 0 end -- LuaJIT without 5.2 compat
  return ok == true or ok == 0, out, code
end

-- the path of the built driver, or nil and why not (no compiler, or a build failure)
function M.build()
  local cc = os.getenv("CC")
  if not cc or cc == "" then cc = "cc" end
  if not sh("command -v " .. cc) then return nil, "no C compiler (" .. cc .. ") found" end
  local exe = "build/threads_check_spec"
  local ok, out = sh(string.format(
    "mkdir -p build && %s -std=c11 -O1 -g -Wall -Wextra -Werror -D_GNU_SOURCE -Isrc -o %s " ..
    "spec/native/threads_check.c -L. -llutra -Wl,-rpath,\"$PWD\" -lpthread", cc, exe))
  if not ok then error("building spec/native/threads_check.c failed:\n" .. out, 0) end
  return exe
end

-- runs the driver; returns its output and whether it exited 0
function M.run(exe, device, steps, env)
  local ok, out = sh(string.format("%s OPENBLAS_NUM_THREADS=1 %s %s %d", env or "", exe, device,
                                   steps))
  return out, ok
end

-- every check line is "ok ..."; the summary says 0 failures; at least `min` checks ran
function M.assert_passed(out, ok, min, what)
  local checks, failures = out:match("threads_check: (%d+) checks, (%d+) failures")
  if not ok or not checks or tonumber(failures) ~= 0 or tonumber(checks) < min then
    error(string.format("%s: threads_check did not pass:\n%s", what, out), 0)
  end
  for line in out:gmatch("[^\n]+") do
    if line:match("^FAIL") then error(what .. ": " .. line .. "\n" .. out, 0) end
  end
  assert(out:find("ok thread exit", 1, true), what .. ": no thread-exit check in\n" .. out)
  assert(out:find("ok recipe=block threads=4 thread=3", 1, true), what .. ": block x4 missing")
  return tonumber(checks)
end

return M
