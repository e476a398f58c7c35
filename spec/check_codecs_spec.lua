-- src/core/codec.h against CUDA's host conversion functions (spec/native/check_codecs.cu, built
-- with nvcc as host code; no GPU needed): a strided subset of the f32 bit patterns plus every
-- 16-bit and 8-bit code here, all 2^32 patterns in `make check-codecs`. Pending without nvcc.

local shell = require("spec.support.shell")

local has_nvcc = shell.has_nvcc()

describe("codecs against CUDA's conversions", function()
  if not has_nvcc then
    pending("nvcc not found: spec/native/check_codecs.cu needs the CUDA toolkit " ..
            "(make check-codecs)")
    return
  end

  it("agree on every code and on every 65521st f32 pattern", function()
    shell.check_against_cuda("codecs", "spec/native/check_codecs.cu", 65521)
  end)
end)
