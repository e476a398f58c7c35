-- The activations' element formulas of the CUDA kernels (kernels/activation/activation_math.cuh)
-- compiled for the host against the CPU backend's (src/backend/cpu/activation_cpu.c), bit for
-- bit over random and edge inputs of every kind (the CPU's Tanh forward within 4 ulp of libm's
-- tanhf: glibc's four-lane libmvec version) (spec/native/check_activation_math.cu, built with
-- nvcc as host code; no GPU needed; `make check-activations`). Pending without nvcc.
local shell = require("spec.support.shell")

local has_nvcc = shell.has_nvcc()

describe("the kernels' activation formulas against the CPU backend", function()
  if not has_nvcc then
    pending("nvcc not found: spec/native/check_activation_math.cu needs the CUDA toolkit " ..
            "(make check-activations)")
    return
  end

  it("agree bit for bit on every kind (Tanh's forward within 4 ulp: libmvec's tanhf)", function()
    local ok, out = shell.build_and_run("build/check_activation_math",
                                        "spec/native/check_activation_math.cu", nil, "CUDA=0")
    assert.is_true(ok, out)
    local kinds = 0
    for _ in out:gmatch("kind %d+: bit%-identical") do kinds = kinds + 1 end
    -- Tanh's forward is libmvec's tanhf on the CPU where glibc has it (activation_cpu.c)
    for _ in out:gmatch("kind 10: backward bit%-identical, forward within 4 ulp") do
      kinds = kinds + 1
    end
    assert.are.equal(10, kinds, out)
    assert.is_falsy(out:find("DIFFERS"), out)
  end)
end)
