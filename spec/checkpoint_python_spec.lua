-- Interop with Python's safetensors (PyPI safetensors + numpy; tools/bootstrap.sh installs them):
-- Python reads lutra's files (every tensor's dtype and shape, the F32 values byte for byte, the
-- metadata), and lutra loads a torch-style state dict Python wrote (names mapped by a table, an
-- _extra_state skipped, F32 and F16 converted to the parameters' f32 or bf16: widening exact,
-- narrowing to bf16 checked against numpy's round-to-nearest-even of the same values).
local lutra = require("lutra")
local nn = lutra.nn
local ffi = require("ffi")

local function sh(cmd)
  local p = assert(io.popen("{ " .. cmd .. "; } 2>&1; echo \"exit=$?\""))
  local out = p:read("*a")
  p:close()
  local code = tonumber(out:match("exit=(%d+)%s*$"))
  return code == 0, out
end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local PY = "python3 spec/support/interop.py"

describe("checkpoints and Python's safetensors", function()
  local dir = os.tmpname()
  os.remove(dir)
  os.execute("mkdir -p " .. dir)
  teardown(function() os.execute("rm -rf " .. dir) end)

  it("has python3 with safetensors and numpy (tools/bootstrap.sh installs them)", function()
    local ok, out = sh("python3 -c 'import safetensors, numpy'")
    assert.is_true(ok, "python3 -m pip install safetensors numpy: " .. out)
  end)

  it("Python reads lutra's file: names, dtypes, shapes, metadata and the values", function()
    lutra.manual_seed(11)
    local net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16, { dtype = "bf16" }))
    -- the bf16 layer takes bf16 inputs; it is saved, not run
    local opt = lutra.optim.SGD(net, { momentum = 0.9 })
    opt:step()
    local file = dir .. "/lutra.st"
    lutra.save(file, { model = net, optim = opt, rng = true })
    local ok, out = sh(string.format("%s read %s %s", PY, file, dir))
    assert.is_true(ok, out)
    assert.matches("meta format=lutra.checkpoint version=1", out, 1, true)
    for _, line in ipairs { "tensor 0.weight F32 64,32", "tensor 0.bias F32 64",
                            "tensor 2.weight BF16 16,64", "tensor 2.bias BF16 16",
                            "tensor optim.0.weight.momentum_buffer F32 64,32",
                            "tensor optim.2.weight.master F32 16,64", "tensor optim.step I64 1",
                            "tensor rng.state U64 1" } do
      assert.matches(line, out, 1, true)
    end
    local p = net:parameters()
    assert.is_true(read(dir .. "/0.weight.bin") == p[1].value:bytes())
    assert.is_true(read(dir .. "/0.bias.bin") == p[2].value:bytes())
    local step = ffi.new("int64_t[1]")
    ffi.copy(step, read(dir .. "/optim.step.bin"), 8)
    assert.are.equal(1, tonumber(step[0]))
  end)

  local function floats(path, ct)
    local s = read(path)
    local n = #s / ffi.sizeof(ct)
    local a = ffi.new(ct .. "[?]", n)
    ffi.copy(a, s, #s)
    return a, n
  end

  local map = { ["fc1.weight"] = "0.weight", ["fc1.bias"] = "0.bias", ["fc2.weight"] = "2.weight",
                ["fc2.bias"] = "2.bias", ["fc1._extra_state"] = false }

  it("lutra loads a torch-style state dict Python wrote, mapped and converted", function()
    local file = dir .. "/torch.st"
    local ok, out = sh(string.format("%s write %s %s %d", PY, file, dir, math.random(1, 2 ^ 30)))
    assert.is_true(ok, out)
    for _, dtype in ipairs { "f32", "bf16" } do
      local net = nn.Sequential(nn.Linear(32, 64, { dtype = dtype }), nn.GELU(),
                                nn.Linear(64, 16, { dtype = dtype }))
      -- without convert, the F16 tensors (and, for bf16, the F32 ones) are refused
      local refused, err = pcall(lutra.load, file, { model = net }, { map = map })
      assert.is_false(refused)
      assert.matches("(convert = true converts)", err, 1, true)
      lutra.load(file, { model = net }, { map = map, convert = true })
      local p = net:parameters()
      for i, name in ipairs { "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias" } do
        if dtype == "f32" then
          local want, n = floats(dir .. "/" .. name .. ".f32", "float")
          local got = p[i].value:to_table()
          assert.are.equal(n, #got)
          for k = 0, n - 1 do assert.are.equal(want[k], got[k + 1]) end
        else
          assert.is_true(read(dir .. "/" .. name .. ".bf16") == p[i].value:bytes(), name)
        end
      end
    end
  end)

  it("refuses a state dict whose names are not all mapped or skipped", function()
    local file = dir .. "/torch.st"
    local net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16))
    local partial = { ["fc1.weight"] = "0.weight", ["fc1.bias"] = "0.bias",
                      ["fc2.weight"] = "2.weight", ["fc2.bias"] = "2.bias" }
    local ok, err = pcall(lutra.load, file, { model = net }, { map = partial, convert = true })
    assert.is_false(ok)
    assert.matches("holds tensor 'fc1._extra_state', which the objects do not have", err, 1, true)
  end)
end)
