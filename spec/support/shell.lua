-- Runs a shell command for the specs that build or launch programs: true when it exits 0, its
-- output (stdout and stderr together) and its exit code. LuaJIT's popen close does not give the
-- exit status, so the shell prints it after the output.
local M = {}

function M.sh(cmd)
  local p = io.popen("{ " .. cmd .. "\n} 2>&1; echo \"lutra-exit=$?\"")
  local out = p:read("*a")
  p:close()
  local code = tonumber(out:match("lutra%-exit=(%d+)\n?$"))
  out = out:gsub("lutra%-exit=%d+\n?$", "")
  return code == 0, out, code
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

return M
