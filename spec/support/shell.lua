-- Runs a shell command for the specs that build or launch programs: true when it exits 0, its
-- output (stdout and stderr together) and its exit code. LuaJIT's popen close does not give the
-- exit status, so the shell prints it after the output. Also: a make target built and run, for
-- the specs over the checkers and emulators of tools/ (host code; no GPU).
local assert = require("luassert")

local M = {}

function M.sh(cmd)
  local p = io.popen("{ " .. cmd .. "\n} 2>&1; echo \"lutra-exit=$?\"")
  local out = p:read("*a")
  p:close()
  local code = tonumber(out:match("lutra%-exit=(%d+)\n?$"))
  out = out:gsub("lutra%-exit=%d+\n?$", "")
  return code == 0, out, code
end

-- Runs a chunk of Lua source in its own LuaJIT process with the tree's lua/ on LUA_PATH (env:
-- more variables, e.g. "OPENBLAS_NUM_THREADS=1"): as M.sh.
function M.luajit_chunk(code, env)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(code)
  f:close()
  local ok, out, status = M.sh("LUA_PATH='lua/?.lua;lua/?/init.lua;;' " .. (env or "") .. " luajit "
                               .. path)
  os.remove(path)
  return ok, out, status
end

-- where the Makefile looks for the CUDA toolkit
M.cuda_home = "${CUDA_HOME:-/usr/local/cuda}"

-- nvcc on PATH or in the toolkit (host-code checks and emulators need it, not a GPU)
function M.has_nvcc()
  return (M.sh("command -v nvcc || test -x " .. M.cuda_home .. "/bin/nvcc"))
end

-- a header of the toolkit's include folder (e.g. "cuda_fp4.h")
function M.has_cuda_header(name)
  return (M.sh("test -f " .. M.cuda_home .. "/include/" .. name))
end


-- `make -s [flags] target` (a program under build/), then `./target args`: a failed build fails
-- the test, naming the source it builds; the run's ok and output come back (as sh's)
function M.build_and_run(target, source, args, flags)
  local built, log = M.sh("make -s " .. (flags and flags .. " " or "") .. target)
  assert.is_true(built, "building " .. source .. " failed:\n" .. log)
  return M.sh("./" .. target .. (args and " " .. args or ""))
end

-- tools/check_NAME (a codec checker against CUDA's host conversions) over every stride-th f32
-- pattern: it prints its banner (check-NAME: N f32 patterns ...), exits 0, and finds no mismatch
function M.check_against_cuda(name, source, stride)
  local ok, out = M.build_and_run("build/check_" .. name, source, tostring(stride))
  assert.is_truthy(out:find("check%-" .. name .. ": %d+ f32 patterns"), out)
  assert.is_true(ok, out)
  assert.is_truthy(out:find(" 0 mismatches,"), out)
end

return M
