-- GroupedLinear's split-quantization kernels (kernels/grouped/grouped_quantize.cu) emulated on the
-- CPU, a thread per CUDA thread (spec/native/sim_grouped_quantize.cpp, `make sim-grouped`), against
-- the CPU backend's reference byte for byte: codes, scale inverses, scales, amaxes and bias
-- gradients, with empty and unaligned experts, the weights' pointer mode, and bad splits. Needs the
-- CUDA headers (no GPU); pending without them.
local shell = require("spec.support.shell")

local has_headers = shell.has_cuda_header("cuda_fp16.h")

describe("the grouped quantization kernels, emulated", function()
  if not has_headers then
    pending("no CUDA headers: spec/native/sim_grouped_quantize.cpp needs them (make sim-grouped)")
    return
  end

  it("equal the CPU reference byte for byte", function()
    local ok, out = shell.build_and_run("build/sim_grouped_quantize",
                                        "spec/native/sim_grouped_quantize.cpp", nil, "CUDA=0")
    assert.is_true(ok, out)
    assert.is_truthy(out:find("ok   bad splits"), out)
    assert.is_truthy(out:find("\n0 failures"), out)
  end)
end)
