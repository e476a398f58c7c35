-- NVFP4's CUDA kernels (kernels/quantize/quantize_nvfp4.cu) emulated on the CPU: their per-thread
-- work (kernels/quantize/nvfp4_math.cuh) run in the launches' order by spec/native/sim_nvfp4.cu
-- (`make sim-nvfp4`), against the CPU backend byte for byte: codes, block scales, the decode scale
-- and amax words, and the dequantized values, over shapes, input dtypes, every option set and
-- one-sided copies. Needs nvcc (host code only, no GPU); pending without it.
local shell = require("spec.support.shell")

local has_nvcc = shell.has_nvcc()

describe("the NVFP4 kernels, emulated", function()
  if not has_nvcc then
    pending("nvcc not found: spec/native/sim_nvfp4.cu needs it (make sim-nvfp4)")
    return
  end

  it("equal the CPU reference byte for byte", function()
    local ok, out = shell.build_and_run("build/sim_nvfp4", "spec/native/sim_nvfp4.cu", nil,
                                        "CUDA=0")
    assert.is_true(ok, out)
    assert.is_truthy(out:find("sim%-nvfp4: %d+ cases, 0 mismatches, ok"), out)
  end)
end)
