-- src/core/fp4.h (NVFP4's E2M1 encoder and decoder, the fp4x2 packing, the E4M3 block scale
-- step) against cuda_fp4.h / cuda_fp8.h's host conversions (tools/check_fp4.cpp, built with
-- nvcc as host code; no GPU needed): every 4099th f32 pattern, every bf16 pattern and every code
-- here, all 2^32 f32 patterns in `make check-fp4`. Pending without nvcc or cuda_fp4.h.

-- runs cmd in a shell; true when it exits 0, and its output (LuaJIT's popen close does not
-- give the exit status, so the shell prints it)
local function sh(cmd)
  local p = io.popen("{ " .. cmd .. "; } 2>&1; echo \"exit=$?\"")
  local out = p:read("*a")
  p:close()
  local code = tonumber(out:match("exit=(%d+)%s*$"))
  return code == 0, (out:gsub("exit=%d+%s*$", ""))
end

-- where the Makefile looks for them
local cuda = "${CUDA_HOME:-/usr/local/cuda}"
local has_nvcc = sh("command -v nvcc || test -x " .. cuda .. "/bin/nvcc")
local has_fp4 = sh("test -f " .. cuda .. "/include/cuda_fp4.h")

describe("NVFP4 conversions against cuda_fp4.h", function()
  if not has_nvcc or not has_fp4 then
    pending((has_nvcc and "cuda_fp4.h not found (CUDA 12.8+ has it)" or "nvcc not found") ..
            ": tools/check_fp4.cpp needs the CUDA toolkit (make check-fp4)")
    return
  end

  it("agree on every code, every bf16 and every 4099th f32 pattern", function()
    local built, log = sh("make -s build/check_fp4")
    assert.is_true(built, "building tools/check_fp4.cpp failed:\n" .. log)
    local ok, out = sh("./build/check_fp4 4099")
    assert.is_truthy(out:find("check%-fp4: %d+ f32 patterns"), out)
    assert.is_true(ok, out)
    assert.is_truthy(out:find(" 0 mismatches,"), out)
  end)
end)
