-- A CUDA build's kernels are compiled for sm_89 (Ada), sm_90 (Hopper) and, where the toolkit
-- knows it, sm_100, with PTX of the newest for later GPUs: every .cu file under kernels/
-- contributes a cubin per architecture and one PTX (cuobjdump over liblutra.so), except the
-- Hopper-only files (kernels/**/*_sm90.cu: CUTLASS's warp-specialized grouped GEMM, wgmma and TMA),
-- built for sm_90a alone. Needs no GPU; skipped for a CPU-only build or without cuobjdump.
local I = require("spec.support.install_tree")

describe("CUDA architectures", function()
  if I.cuda_setting() ~= "CUDA=1" then
    pending("skipped: liblutra.so is a CPU-only build")
    return
  end
  local cuobjdump = (os.getenv("CUDA_HOME") or "/usr/local/cuda") .. "/bin/cuobjdump"
  if not I.sh("test -x " .. cuobjdump) then
    local ok, path = I.sh("command -v cuobjdump")
    if not ok then pending("skipped: no cuobjdump"); return end
    cuobjdump = path:gsub("%s+$", "")
  end

  it("has sm_89, sm_90 (and sm_100) cubins and PTX for every kernel file", function()
    local _, list = I.sh("find kernels -name '*.cu' | wc -l")
    local _, hopper_list = I.sh("find kernels -name '*_sm90.cu' | wc -l")
    local hopper_only = tonumber(hopper_list:match("%d+")) or 0
    local kernels = tonumber(list:match("%d+")) - hopper_only
    assert.is_true(kernels and kernels > 0, list)
    local ok, elf = I.sh(cuobjdump .. " --list-elf liblutra.so")
    assert(ok, elf)
    local count = {}
    for arch in elf:gmatch("%.(sm_%d+a?)%.cubin") do count[arch] = (count[arch] or 0) + 1 end
    assert.are.equal(hopper_only, count.sm_90a or 0, "sm_90a cubins:\n" .. elf)
    assert.are.equal(kernels, count.sm_89, "sm_89 cubins:\n" .. elf)
    assert.are.equal(kernels, count.sm_90, "sm_90 cubins:\n" .. elf)
    local _, archs = I.sh((os.getenv("CUDA_HOME") or "/usr/local/cuda") .. "/bin/nvcc --list-gpu-arch")
    local sm100 = archs:find("compute_100", 1, true) ~= nil
    if sm100 then assert.are.equal(kernels, count.sm_100, "sm_100 cubins:\n" .. elf) end
    local ptx_ok, ptx = I.sh(cuobjdump .. " --list-ptx liblutra.so")
    assert(ptx_ok, ptx)
    local newest = sm100 and "sm_100" or "sm_90"
    local n = 0
    for _ in ptx:gmatch("%." .. newest .. "%.ptx") do n = n + 1 end
    assert.are.equal(kernels, n, "PTX for " .. newest .. ":\n" .. ptx)
  end)
end)
