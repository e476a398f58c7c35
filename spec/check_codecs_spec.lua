-- src/core/codec.h against CUDA's host conversion functions (tools/check_codecs.cu, built with
-- nvcc as host code; no GPU needed): a strided subset of the f32 bit patterns plus every
-- 16-bit and 8-bit code here, all 2^32 patterns in `make check-codecs`. Pending without nvcc.

local shell = require("spec.support.shell")
local sh = shell.sh

local has_nvcc = shell.has_nvcc()

describe("codecs against CUDA's conversions", function()
  if not has_nvcc then
    pending("nvcc not found: tools/check_codecs.cu needs the CUDA toolkit (make check-codecs)")
    return
  end

  it("agree on every code and on every 65521st f32 pattern", function()
    local built, log = sh("make -s build/check_codecs")
    assert.is_true(built, "building tools/check_codecs.cu failed:\n" .. log)
    local ok, out = sh("./build/check_codecs 65521")
    assert.is_truthy(out:find("check%-codecs: %d+ f32 patterns"), out)
    assert.is_true(ok, out)
    assert.is_truthy(out:find(" 0 mismatches,"), out)
  end)
end)
