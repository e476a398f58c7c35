-- ONNX export (src/lutra/onnx.h, lutra.export_onnx): small trees of every supported kind with
-- fresh random parameters are exported, checked by onnx's checker (full_check: shapes and types
-- inferred through every node) and run in ONNX Runtime on fresh random inputs, whose output must
-- match lutra's inference forward. Bound: both sides compute in f32, differing only in summation
-- order (OpenBLAS against MLAS) and in their tanh/erf/exp (libm against MLAS's approximations),
-- so |ort - lutra| <= 1e-5 + 1e-4 |lutra| element-wise; a transposed weight, a swapped gate half or
-- a wrong constant is off by O(1) (the negative control shows the comparison sees one changed
-- weight). Needs python3 with onnx, onnxruntime and numpy (tools/bootstrap.sh installs them).
local lutra = require("lutra")
local nn = lutra.nn
local ffi = require("ffi")
local shell = require("spec.support.shell")
local fresh = require("spec.support.fresh_random")

local ATOL, RTOL = 1e-5, 1e-4
local rng = fresh.new()

local function read_floats(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  local n = #s / 4
  local a = ffi.new("float[?]", n)
  ffi.copy(a, s, #s)
  return a, n
end

local function write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

-- every parameter of net drawn afresh (norm gammas and betas too, whose defaults 1 and 0 would
-- hide a swapped or missing one)
local function randomize(net)
  for _, p in ipairs(net:parameters()) do p.value:randn(rng.int(1, 2 ^ 30), 0, 0.5) end
end

if not lutra.onnx_available() then
  -- a library built without ONNX export (Makefile: ONNX=0, or no protoc-c / protobuf-c header)
  describe("lutra.export_onnx in a build without ONNX export", function()
    it("refuses, saying how the library was built, and writes nothing", function()
      local path = os.tmpname()
      os.remove(path)
      local ok, err = pcall(lutra.export_onnx, nn.Linear(4, 2), path, { input_shape = { 0, 4 } })
      assert.is_false(ok)
      assert.matches("lutra_export_onnx: this lutra was built without ONNX export", err, 1, true)
      assert.is_nil(io.open(path))
    end)
  end)
  return
end

describe("lutra.export_onnx", function()
  local dir = os.tmpname()
  os.remove(dir)
  os.execute("mkdir -p " .. dir)
  teardown(function() os.execute("rm -rf " .. dir) end)

  -- exports net for input dims (the first dynamic), runs ONNX Runtime on x; the largest
  -- violation of the bound (err / (ATOL + RTOL |lutra|), 1 at the bound) and the script's output
  local function run(net, x, opts)
    opts = opts or {}
    local dims = x:dims()
    local shape = { 0 }
    for i = 2, #dims do shape[i] = dims[i] end
    local model = dir .. "/model.onnx"
    lutra.export_onnx(net, model, { input_shape = opts.input_shape or shape, opset = opts.opset })
    local y = net:forward(x, { grad = false }):to_table()
    if opts.before_run then opts.before_run() end
    write(dir .. "/x.bin", x:bytes())
    local ok, out = shell.sh(string.format("python3 spec/support/onnx_run.py %s %s/x.bin %s/y.bin %s",
                                           model, dir, dir, table.concat(dims, " ")))
    assert.is_true(ok, out)
    local got, n = read_floats(dir .. "/y.bin")
    assert.are.equal(#y, n)
    local worst = 0
    for i = 1, n do
      local ratio = math.abs(got[i - 1] - y[i]) / (ATOL + RTOL * math.abs(y[i]))
      if not (ratio <= worst) then worst = ratio end -- a NaN is the worst
    end
    return worst, out
  end

  local function matches(net, x, opts)
    local worst, out = run(net, x, opts)
    assert.is_true(worst <= 1, string.format("seed %d: off by %.3g times the bound\n%s", rng.seed,
                                             worst, out))
    return out
  end

  local function input(rows, features)
    return lutra.tensor({ rows, features }):randn(rng.int(1, 2 ^ 30))
  end

  it("has python3 with onnx, onnxruntime and numpy (tools/bootstrap.sh installs them)", function()
    local ok, out = shell.sh("python3 -c 'import onnx, onnxruntime, numpy'")
    assert.is_true(ok, "python3 -m pip install onnx onnxruntime numpy: " .. out)
  end)

  it("a Linear-GELU-Linear policy: the same outputs, a dynamic batch, MatMul and Add", function()
    local net = nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.Linear(24, 5))
    randomize(net)
    local out = matches(net, input(7, 12))
    assert.matches("ops Add,Identity,MatMul,Mul,Tanh", out, 1, true)
    assert.matches("shape 7,5", out, 1, true)
    assert.matches("meta lutra.module=sequential", out, 1, true)
    assert.matches("meta lutra.weights=f32 ", out, 1, true)
    -- the batch is dynamic: another batch size runs the same file
    matches(net, input(1, 12))
  end)

  it("sees a changed parameter (the negative control of the bound)", function()
    local net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    randomize(net)
    local x = input(6, 8)
    assert.is_true(run(net, x) <= 1)
    -- the file (and ONNX Runtime's output, y.bin) hold the old parameters; one changed by 0.5:
    -- an entry of the last Linear's bias, which reaches every row (an entry of its weight went
    -- unseen under some seeds: its hidden unit's ReLU was 0 on all six rows)
    local w = net:parameters()[4].value
    local vals = w:to_table()
    local i = rng.int(1, #vals)
    vals[i] = vals[i] + 0.5
    w:set(vals)
    local y = net:forward(x, { grad = false }):to_table()
    local got = read_floats(dir .. "/y.bin")
    local off = 0
    for k = 1, #y do
      off = math.max(off, math.abs(got[k - 1] - y[k]) / (ATOL + RTOL * math.abs(y[k])))
    end
    assert.is_true(off > 1,
                   string.format("seed %d: one bias changed by 0.5 went unseen", rng.seed))
  end)

  it("norms, every activation and gated halves", function()
    local acts = { nn.ReLU(), nn.SiLU(), nn.QuickGELU(), nn.SquaredReLU(), nn.GELU { approximate = "none" },
                   nn.GELU(), nn.SwiGLU(), nn.GeGLU(), nn.ReGLU(), nn.Tanh() }
    for _, act in ipairs(acts) do
      local gated = act:kind():find("glu") ~= nil
      local net = nn.Sequential(nn.LayerNorm(10, { eps = 1e-3 }), nn.Linear(10, 16), act,
                                nn.RMSNorm(gated and 8 or 16, { zero_centered_gamma = true }),
                                nn.Linear(gated and 8 or 16, 3))
      randomize(net)
      local out = matches(net, input(5, 10))
      assert.matches("LayerNormalization", out, 1, true)
      assert.matches("ReduceMean", out, 1, true)
      if gated then assert.matches("Slice", out, 1, true) end
      if act:kind() == "tanh" then assert.matches("Tanh", out, 1, true) end
    end
  end)

  it("Residual, LayerNormLinear and LayerNormMLP (LayerNorm and RMSNorm, plain and gated)", function()
    local block = nn.Residual(nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 32), nn.GELU(),
                                            nn.Linear(32, 16)))
    local net = nn.Sequential(block, nn.LayerNormMLP(16, 24),
                              nn.Residual(nn.LayerNormMLP(16, 20, { normalization = "RMSNorm",
                                                                    activation = "swiglu",
                                                                    zero_centered_gamma = true })),
                              nn.LayerNormLinear(16, 6, { normalization = "RMSNorm" }))
    randomize(net)
    matches(net, input(9, 16))
  end)

  it("a 3-D input and opsets 18 and 21 (ReduceMean's axes an input from 18)", function()
    local net = nn.Sequential(nn.RMSNorm(8), nn.Linear(8, 4), nn.SiLU())
    randomize(net)
    local x = lutra.tensor({ 2, 3, 8 }):randn(rng.int(1, 2 ^ 30))
    for _, opset in ipairs { 17, 18, 21 } do
      local out = matches(net, x, { opset = opset, input_shape = { 0, 3, 8 } })
      assert.matches("shape 2,3,4", out, 1, true)
    end
  end)

  it("an FP8 Linear: its dequantized FP8 weight, said in the metadata", function()
    local net = nn.Sequential(nn.Linear(32, 16), nn.ReLU())
    randomize(net)
    local lin, x = net[1], input(16, 32)
    local scope = lutra.autocast { recipe = lutra.recipe.delayed() }
    scope:enter()
    net:forward(x)
    local wd = lutra.tensor({ 16, 32 })
    lutra.dequantize(lin:quantizer("weight"):quantize(lin:parameters()[1].value), wd)
    scope:exit()
    -- the reference: an f32 net holding the dequantized weight; ONNX Runtime runs net's export
    local ref = nn.Sequential(nn.Linear(32, 16), nn.ReLU())
    ref:parameters()[1].value:copy(wd)
    ref:parameters()[2].value:copy(lin:parameters()[2].value)
    lutra.export_onnx(net, dir .. "/fp8.onnx", { input_shape = { 0, 32 } })
    local out = matches(ref, x, { before_run = function()
      assert(os.rename(dir .. "/fp8.onnx", dir .. "/model.onnx"))
    end })
    assert.matches("meta lutra.fp8.0=dequantized e4m3, per-tensor scaling", out, 1, true)
    assert.matches("FP8 weight", out, 1, true)
  end)

  describe("refuses, naming the call and the reason, and writes nothing", function()
    -- a file already at the path stays as it was
    local function refused(pattern, net, opts, path)
      path = path or dir .. "/kept.onnx"
      if path == dir .. "/kept.onnx" then write(path, "old") end
      local ok, err = pcall(lutra.export_onnx, net, path, opts)
      assert.is_false(ok)
      assert.matches(pattern, tostring(err), 1, true)
      if path == dir .. "/kept.onnx" then
        local f = assert(io.open(path, "rb"))
        assert.are.equal("old", f:read("*a"))
        f:close()
      end
      local ok_ls, listing = shell.sh("ls -A " .. dir)
      assert.is_true(ok_ls, listing)
      assert.is_nil(listing:find(".tmp.", 1, true), "a temporary was left: " .. listing)
    end

    it("an unsupported module kind, by its kind and its place in the tree", function()
      local net = nn.Sequential(nn.Linear(8, 8),
                                nn.Residual(nn.Sequential(nn.ReLU(), nn.Embedding(10, 8))))
      refused("lutra_export_onnx: 1.1 is of kind embedding, which ONNX export does not support",
              net, { input_shape = { 0, 8 } })
      refused("lutra_export_onnx: the module is of kind embedding", nn.Embedding(10, 8),
              { input_shape = { 0, 8 } })
      refused("lutra.export_onnx: module must be a lutra module", {}, { input_shape = { 0, 8 } })
    end)

    it("a bad path, opset, shape or name", function()
      local net = nn.Sequential(nn.Linear(8, 6), nn.SwiGLU())
      local opts = { input_shape = { 0, 8 } }
      refused("lutra_export_onnx: cannot create", net, opts, dir .. "/no/such/dir/m.onnx")
      assert.is_false((shell.sh("test -e " .. dir .. "/no")))
      refused("lutra.export_onnx: path must be a non-empty string", net, opts, "")
      refused("path holds a NUL byte", net, opts, dir .. "/m\0.onnx")
      refused("lutra_export_onnx: opset 16 is not one of 17..21", net,
              { input_shape = { 0, 8 }, opset = 16 })
      refused("lutra_export_onnx: opset 22 is not one of 17..21", net,
              { input_shape = { 0, 8 }, opset = 22 })
      refused("lutra_export_onnx: 0 takes 8 features, its input has 9", net,
              { input_shape = { 0, 9 } })
      refused("the input shape's last dim (the features) must be given", net,
              { input_shape = { 4, 0 } })
      refused("input_shape must be a table of 1 to 4 dims", net, {})
      refused("input_shape must be a table of 1 to 4 dims", net, { input_shape = { 1, 1, 1, 1, 8 } })
      refused("lutra.export_onnx: unknown option 'shape'", net, { shape = { 0, 8 } })
      refused("input_name and output_name must be two different", net,
              { input_shape = { 0, 8 }, input_name = "x", output_name = "x" })
      -- a gated activation on an odd width
      refused("lutra_export_onnx: 1 is gated and takes an even number of features, not 5",
              nn.Sequential(nn.Linear(8, 5), nn.SwiGLU()), opts)
    end)
  end)
end)
