-- src/core/fp4.h (NVFP4's E2M1 encoder and decoder, the fp4x2 packing, the E4M3 block scale
-- step) against cuda_fp4.h / cuda_fp8.h's host conversions (spec/native/check_fp4.cpp, built with
-- nvcc as host code; no GPU needed): every 4099th f32 pattern, every bf16 pattern and every code
-- here, all 2^32 f32 patterns in `make check-fp4`. Pending without nvcc or cuda_fp4.h.

local shell = require("spec.support.shell")

local has_nvcc = shell.has_nvcc()
local has_fp4 = shell.has_cuda_header("cuda_fp4.h")

describe("NVFP4 conversions against cuda_fp4.h", function()
  if not has_nvcc or not has_fp4 then
    pending((has_nvcc and "cuda_fp4.h not found (CUDA 12.8+ has it)" or "nvcc not found") ..
            ": spec/native/check_fp4.cpp needs the CUDA toolkit (make check-fp4)")
    return
  end

  it("agree on every code, every bf16 and every 4099th f32 pattern", function()
    shell.check_against_cuda("fp4", "spec/native/check_fp4.cpp", 4099)
  end)
end)
