-- A minimal runner for spec files that use only describe/it and luassert, for tools that
-- cannot host busted itself (busted dies silently under compute-sanitizer on the GPU machine):
--   compute-sanitizer --tool memcheck luajit tools/run_specs.lua spec/gpu/*_gpu.lua
-- Prints each failure and "N passed, N failed"; exits non-zero when a test fails.
local assert = require("luassert")
io.stdout:setvbuf("line") -- a crash must not swallow what ran before it
local verbose = os.getenv("RUN_SPECS_VERBOSE") == "1"
local passed, failed, path = 0, 0, {}

local env = setmetatable({ assert = assert }, { __index = _G })
function env.describe(name, body)
  path[#path + 1] = name
  body()
  path[#path] = nil
end
function env.it(name, body)
  if verbose then io.write("RUN  ", table.concat(path, " "), " ", name, "\n") end
  local ok, err = xpcall(body, debug.traceback)
  if ok then
    passed = passed + 1
  else
    failed = failed + 1
    io.write("FAIL ", table.concat(path, " "), " ", name, "\n", tostring(err), "\n")
  end
end

for i = 1, #arg do
  local chunk = assert(loadfile(arg[i]))
  setfenv(chunk, env)
  chunk()
end
io.write(string.format("%d passed, %d failed\n", passed, failed))
io.stdout:flush()
os.exit(failed == 0 and 0 or 1)
