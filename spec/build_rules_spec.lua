-- How the build decides, wherever it is started (issue 40): the Makefile's CUDA auto-detection
-- (nvcc and cuBLASLt's header found AND nvidia-smi listing a GPU; CUDA=0/1 overrides), which
-- make, make install, luarocks make and tools/bootstrap.sh all follow; and bootstrap.sh's pip
-- step for the test targets, which goes straight to the command a PEP 668 ("externally
-- managed") Python accepts. Both run against fakes on PATH (a CUDA toolkit without a GPU,
-- nvidia-smi, python3, dpkg-query, make): nothing is built, installed or downloaded.
local sh = require("spec.support.shell").sh
-- what the test targets install from PyPI: the checkpoint interop and ONNX export specs' side
local PACKAGES = "safetensors numpy onnx onnxruntime"

local function write(path, text, mode)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  if mode then assert(sh("chmod " .. mode .. " '" .. path .. "'")) end
end

local function tmpdir()
  local ok, dir = sh("mktemp -d /tmp/lutra-build-rules-XXXXXX")
  assert(ok, dir)
  return (dir:gsub("%s+$", ""))
end

describe("the Makefile's CUDA auto-detection", function()
  local root, repo
  setup(function()
    root = tmpdir()
    local _, pwd = sh("pwd")
    repo = pwd:gsub("%s+$", "")
    -- a toolkit with nvcc and cuBLASLt's header, and two nvidia-smis: one listing a GPU, one
    -- failing as it does on a machine without a driver or device
    assert(sh(string.format("mkdir -p %s/cuda/include %s/cuda/bin %s/gpu %s/nogpu %s/work",
                            root, root, root, root, root)))
    write(root .. "/cuda/include/cublasLt.h", "")
    write(root .. "/cuda/bin/nvcc", "#!/bin/sh\nexit 0\n", "755")
    write(root .. "/gpu/nvidia-smi", "#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n",
          "755")
    write(root .. "/nogpu/nvidia-smi",
          "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\nexit 9\n",
          "755")
    write(root .. "/print.mk", "print-cuda:\n\t@echo CUDA=$(CUDA)\n")
  end)
  teardown(function() os.execute("rm -rf '" .. root .. "'") end)

  -- the CUDA setting make arrives at (in a scratch folder: make writes build/config where it runs)
  local function cuda(smi, args)
    local ok, out = sh(string.format(
      "cd %s/work && env -u CUDA -u MAKEFLAGS -u MFLAGS -u MAKELEVEL PATH=%s/%s:$PATH " ..
      "make --no-print-directory -f %s/Makefile -f %s/print.mk CUDA_HOME=%s/cuda " ..
      "NVCC=%s/cuda/bin/nvcc MPI=0 %s print-cuda 2>/dev/null",
      root, root, smi, repo, root, root, root, args or ""))
    assert(ok, out)
    return out:match("CUDA=(%d)")
  end

  it("builds the CPU backend alone when nvidia-smi lists no GPU, though nvcc is there", function()
    assert.are.equal("0", cuda("nogpu"))
  end)

  it("builds the CUDA backend when nvidia-smi lists a GPU", function()
    assert.are.equal("1", cuda("gpu"))
  end)

  it("follows CUDA=1 and CUDA=0 on the command line whatever nvidia-smi says", function()
    assert.are.equal("1", cuda("nogpu", "CUDA=1"))
    assert.are.equal("0", cuda("gpu", "CUDA=0"))
  end)
end)

describe("tools/bootstrap.sh test", function()
  local root
  setup(function()
    root = tmpdir()
    assert(sh("mkdir -p " .. root .. "/bin " .. root .. "/managed " .. root .. "/plain"))
    write(root .. "/managed/EXTERNALLY-MANAGED", "[externally-managed]\n")
    -- every package installed; make and pip only say how they were called
    write(root .. "/bin/dpkg-query", "#!/bin/sh\necho 'install ok installed'\n", "755")
    write(root .. "/bin/make", "#!/bin/sh\necho \"make $*\" >> \"$LOG\"\n", "755")
    write(root .. "/bin/python3", [[#!/bin/sh
case "$*" in
  *"import safetensors"*) exit 1 ;;
  *sysconfig*) echo "$FAKE_STDLIB" ;;
  "-m pip "*) echo "pip $* break=${PIP_BREAK_SYSTEM_PACKAGES:-unset}" >> "$LOG" ;;
  *) echo "unexpected python3 $*" >> "$LOG"; exit 3 ;;
esac
]], "755")
  end)
  teardown(function() os.execute("rm -rf '" .. root .. "'") end)

  -- the lines the fakes logged, and bootstrap's own output
  local function bootstrap(stdlib)
    local log = root .. "/log"
    os.remove(log)
    local ok, out = sh(string.format("env LOG=%s FAKE_STDLIB='%s' PATH=%s/bin:$PATH sh tools/bootstrap.sh test",
                                     log, stdlib, root))
    assert(ok, out)
    local f = io.open(log, "r")
    local lines = {}
    if f then
      for line in f:lines() do lines[#lines + 1] = line end
      f:close()
    end
    return lines, out
  end

  it("installs with pip --user once, told it is meant, on an externally managed Python", function()
    local lines, out = bootstrap(root .. "/managed")
    assert.are.equal(2, #lines, table.concat(lines, "\n"))
    assert.matches("^pip %-m pip install %-%-quiet %-%-user " .. PACKAGES .. " break=1$", lines[1])
    assert.is_nil(out:find("externally", 1, true), out)
  end)

  it("installs with plain pip --user where that is allowed, and into a virtual environment", function()
    local lines = bootstrap(root .. "/plain")
    assert.are.equal(2, #lines, table.concat(lines, "\n"))
    assert.matches("^pip %-m pip install %-%-quiet %-%-user " .. PACKAGES .. " break=unset$", lines[1])
    lines = bootstrap("")
    assert.are.equal(2, #lines, table.concat(lines, "\n"))
    assert.matches("^pip %-m pip install %-%-quiet " .. PACKAGES .. " break=unset$", lines[1])
  end)

  it("then runs make with the target as given, leaving CUDA to the Makefile", function()
    local lines = bootstrap(root .. "/plain")
    assert.matches("^make %-j%d+ test$", lines[#lines])
  end)
end)
