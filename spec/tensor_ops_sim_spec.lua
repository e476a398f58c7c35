-- The tensor operations' kernels (kernels/tensor/tensor_ops.cu) emulated on the CPU, a thread per
-- CUDA thread (spec/native/sim_tensor_ops.cpp), against the CPU backend: axpby and argmax byte for
-- byte, softmax within 2e-6, the sampler on all but at most one row of 32 with the same seed (and
-- top_k 1 the argmax exactly). Needs the CUDA headers (no GPU); pending without them.
local shell = require("spec.support.shell")

describe("the tensor operations' kernels, emulated", function()
  if not shell.has_cuda_header("cuda_fp16.h") then
    pending("no CUDA headers: spec/native/sim_tensor_ops.cpp needs them")
    return
  end

  it("agree with the CPU reference", function()
    local ok, out = shell.build_and_run("build/sim_tensor_ops", "spec/native/sim_tensor_ops.cpp",
                                        nil, "CUDA=0")
    assert.is_true(ok, out)
    assert.is_truthy(out:find("sample dt=0 T=1.3 top_k=1: 32 of 32 rows", 1, true), out)
    assert.is_truthy(out:find(" 0 failures"), out)
  end)
end)
