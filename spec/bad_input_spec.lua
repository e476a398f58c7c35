-- Bad inputs through the Lua API (part 1: tensors, GEMMs, modules; part 2 in
-- bad_input_c_spec.lua: recipes, quantizers, optimizers and the C API through ffi.C). Every
-- case must raise "call: reason" and, where an object was involved, leave it working with
-- bit-identical results (its bytes, or a forward, compared before and after the bad call).
-- Cases already in errors_spec.lua are not repeated.
local lutra = require("lutra")
local ffi = lutra.ffi
local E = require("spec.support.errors")
local expect_error = E.expect_error

local counter = { n = 0 }
local c_check = E.c_check
local function cases(list) E.cases(list, counter, it) end

-- a tensor's values as bytes, for "unchanged" checks
local function snap(t) return t:bytes() end

describe("bad inputs: tensors", function()
  local x = lutra.tensor({ 4, 8 }):randn(11)
  local before = snap(x)
  after_each(function() assert.are.equal(before, snap(x), "x changed") end)

  cases {
    { "2^31 x 2^31 overflows the byte count", function() lutra.tensor({ 2 ^ 31, 2 ^ 31 }) end,
      "lutra_tensor_new", "the byte count overflows" },
    { "2^62 x 4 bf16 overflows", function() lutra.tensor({ 2 ^ 52, 2 ^ 10 }, "bf16") end,
      "lutra_tensor_new", "overflows" },
    { "4-dim product overflows int64", function() lutra.tensor({ 2 ^ 20, 2 ^ 20, 2 ^ 20, 2 ^ 20 }) end,
      "lutra_tensor_new", "shape overflows" },
    { "dim 2^60 is past 2^53", function() lutra.tensor({ 2 ^ 60 }) end, "lutra.tensor",
      "dim 1 must be an integer" },
    { "NaN dim", function() lutra.tensor({ 0 / 0 }) end, "lutra.tensor", "dim 1 must be an integer" },
    { "infinite dim", function() lutra.tensor({ math.huge }) end, "lutra.tensor", "dim 1 must be an integer" },
    { "string dim", function() lutra.tensor({ "4" }) end, "lutra.tensor", "dim 1 must be an integer (got \"4\")" },
    { "zero dim", function() lutra.tensor({ 4, 0 }) end, "lutra_tensor_new", "dim 1 is 0" },
    { "dtype code 1.5", function() lutra.tensor({ 2 }, 1.5) end, "lutra.tensor", "dtype code must be an integer" },
    { "unknown device", function() lutra.tensor({ 2 }, "f32", "tpu") end, "lutra.tensor", "unknown device 'tpu'" },
    { "set: short table", function() x:set({ 1, 2, 3 }) end, "tensor:set", "3 values for a tensor of 32" },
    { "set: string value", function()
        local t = {} for i = 1, 32 do t[i] = i end t[5] = "x"
        x:set(t)
      end, "tensor:set", "value 5 must be a number" },
    { "set: short float array", function() x:set(ffi.new("float[31]")) end, "tensor:set",
      "the array holds 31 values, the tensor 32" },
    { "set: float pointer (no length)", function()
        local buf = ffi.new("float[32]")
        x:set(ffi.cast("float *", buf))
      end, "tensor:set", "must be a table or a float array" },
    { "set: double array", function() x:set(ffi.new("double[32]")) end, "tensor:set",
      "must be a table or a float array" },
    { "set: a number", function() x:set(3) end, "tensor:set", "must be a table or a float array" },
    { "set: int array into f32", function() x:set(ffi.new("int32_t[32]")) end, "tensor:set",
      "float array" },
    { "read: short buffer", function() x:read(ffi.new("float[16]")) end, "tensor:read",
      "buf holds 16 floats, the tensor 32" },
    { "read: pointer buffer", function() x:read(ffi.cast("float *", ffi.new("float[64]"))) end,
      "tensor:read", "buf must be a float array" },
    { "read: a table", function() x:read({}) end, "tensor:read", "buf must be a float array" },
    { "read: int array", function() x:read(ffi.new("int32_t[32]")) end, "tensor:read",
      "buf must be a float array" },
    { "fill: string", function() x:fill("1") end, "tensor:fill", "value must be a number" },
    { "randn: fractional seed", function() x:randn(1.5) end, "tensor:randn", "seed must be an integer" },
    { "randn: negative seed", function() x:randn(-1) end, "tensor:randn", "seed must be an integer" },
    { "randn: string mean", function() x:randn(1, "0") end, "tensor:randn", "mean must be a number" },
    { "randn: infinite std", function() x:randn(1, 0, math.huge) end, "lutra_tensor_randn",
      "parameters must be finite" },
    { "uniform: table lo", function() x:uniform(1, {}) end, "tensor:uniform", "lo must be a number" },
    { "uniform: string seed", function() x:uniform("7") end, "tensor:uniform", "seed must be an integer" },
    { "copy: a table", function() x:copy({}) end, "tensor:copy", "src must be a tensor" },
    { "copy: wrong element count", function() x:copy(lutra.tensor({ 3 })) end, "lutra_tensor_copy",
      "dst has 32 elements, src 3" },
    { "reshape: fractional dim", function() x:reshape({ 2.5, 4 }) end, "tensor:reshape",
      "dim 1 must be an integer" },
    { "reshape: wrong count", function() x:reshape({ 5, 7 }) end, "lutra_tensor_reshape",
      "new shape has 35 elements" },
    { "bytes: numeric columnwise", function() x:bytes(1) end, "tensor:bytes", "columnwise must be a boolean" },
    { "bytes: columnwise of a plain tensor", function() x:bytes(true) end, "lutra_tensor_get_bytes",
      "no columnwise data" },
    { "writing an unknown key", function() x.foo = 1 end, "lutra.tensor", "cannot set 'foo'" },
  }

  it("fields are read-only: x.numel = 512 on a 32-element tensor is refused", function()
    for _, f in ipairs { function() x.numel = 512 end, function() x.data = nil end,
                         function() x.shape[0] = 99 end, function() x.dtype = 6 end } do
      local msg = E.message_of(f)
      assert.is_truthy(msg:find("constant location", 1, true), msg)
      counter.n = counter.n + 1
    end
    assert.are.equal(32, x:size())
    assert.are.same({ 4, 8 }, x:dims())
  end)

  it("i32 tensors are zero-filled and refuse non-integers and out-of-range values", function()
    local t = lutra.tensor({ 64 }, "i32")
    local zero = string.rep("\0", 256)
    assert.are.equal(zero, t:bytes())
    expect_error(function() t:set((function() local v = {} for i = 1, 64 do v[i] = 0 end v[2] = 1.7 return v end)()) end,
                 "tensor:set", "value 2 must be an int32 for an i32 tensor (got 1.7)")
    expect_error(function() t:set((function() local v = {} for i = 1, 64 do v[i] = 0 end v[3] = 2 ^ 31 return v end)()) end,
                 "tensor:set", "value 3 must be an int32")
    expect_error(function() t:set(ffi.new("float[64]")) end, "tensor:set", "int32_t array")
    expect_error(function() t:set(ffi.new("int32_t[63]")) end, "tensor:set", "holds 63 values")
    expect_error(function() lutra.from_table({ 1.7, -2.2 }, nil, "i32") end, "tensor:set",
                 "must be an int32")
    counter.n = counter.n + 5
    assert.are.equal(zero, t:bytes())
    t:set(ffi.new("int32_t[64]", 5))
  end)
end)

describe("bad inputs: gemm", function()
  local A = lutra.tensor({ 8, 16 }):randn(21)
  local B = lutra.tensor({ 4, 16 }):randn(22)
  local D = lutra.tensor({ 4, 8 })
  local bias = lutra.tensor({ 8 }):randn(23)
  local function run() return snap(lutra.gemm(A, true, B, false, D)) end
  local want = run()
  after_each(function() assert.are.equal(want, run(), "D after a refused GEMM") end)

  cases {
    { "transa 0 (true in Lua)", function() lutra.gemm(A, 0, B, 0, D) end, "lutra.gemm",
      "transa must be a boolean or \"N\"/\"T\" (got 0)" },
    { "transb 1", function() lutra.gemm(A, true, B, 1, D) end, "lutra.gemm", "transb must be" },
    { "transa nil", function() lutra.gemm(A, nil, B, false, D) end, "lutra.gemm", "transa must be" },
    { "transa \"t\" (lower case)", function() lutra.gemm(A, "t", B, false, D) end, "lutra.gemm", "transa must be" },
    { "accumulate 1", function() lutra.gemm(A, true, B, false, D, nil, 1) end, "lutra.gemm",
      "accumulate must be a boolean" },
    { "A a table", function() lutra.gemm({}, true, B, false, D) end, "lutra.gemm", "A must be a tensor" },
    { "B a number", function() lutra.gemm(A, true, 3, false, D) end, "lutra.gemm", "B must be a tensor" },
    { "D a string", function() lutra.gemm(A, true, B, false, "D") end, "lutra.gemm", "D must be a tensor" },
    { "bias a table", function() lutra.gemm(A, true, B, false, D, {}) end, "lutra.gemm", "bias must be a tensor" },
    { "D aliases A", function()
        local S = lutra.tensor({ 8, 8 }):randn(24)
        lutra.gemm(S, false, S, false, S)
      end, "lutra_gemm", "D aliases A" },
    { "D aliases B", function()
        local S = lutra.tensor({ 8, 8 }):randn(25)
        lutra.gemm(lutra.tensor({ 8, 8 }):randn(26), false, S, false, S)
      end, "lutra_gemm", "D aliases B" },
    { "D aliases bias", function()
        local S = lutra.tensor({ 1, 8 }):randn(27)
        lutra.gemm(A, true, lutra.tensor({ 1, 16 }), false, S, S)
      end, "lutra_gemm", "D aliases bias" },
    { "gemm_ex: transb 0", function() lutra.gemm_ex(A, true, B, 0, D) end, "lutra.gemm_ex", "transb must be" },
    { "gemm_ex: D aliases A", function() lutra.gemm_ex(D, false, B, false, D) end, "lutra_gemm_ex",
      "D aliases A" },
    { "gemm_ex: accumulate \"yes\"", function() lutra.gemm_ex(A, true, B, false, D, { accumulate = "yes" }) end,
      "lutra.gemm_ex", "accumulate must be a boolean" },
    { "gemm_ex: unknown epilogue", function() lutra.gemm_ex(A, true, B, false, D, { epilogue = "relu" }) end,
      "lutra.gemm_ex", "unknown epilogue 'relu'" },
  }

  it("\"N\"/\"T\" work like false/true", function()
    local a = snap(lutra.gemm(A, "T", B, "N", lutra.tensor({ 4, 8 })))
    assert.are.equal(want, a)
  end)

  it("the C entries refuse trans flags other than 0 and 1", function()
    expect_error(function() c_check(lutra.C.lutra_gemm(A, 2, B, 0, D, nil, 0)) end,
                 "lutra_gemm", "transa must be 0 or 1 (got 2)")
    expect_error(function() c_check(lutra.C.lutra_gemm_ex(A, 1, B, -1, D, nil, 0, nil)) end,
                 "lutra_gemm_ex", "transb must be 0 or 1 (got -1)")
    counter.n = counter.n + 2
  end)
end)

describe("bad inputs: modules and losses", function()
  local nn = lutra.nn
  local x = lutra.tensor({ 4, 16 }):randn(31)
  local dy = lutra.tensor({ 4, 8 }):randn(32)
  local m = nn.Linear(16, 8, { seed = 5 })
  local function run()
    local y = snap(m:forward(x))
    return y .. snap(m:backward(dy))
  end
  local want = run()
  after_each(function() assert.are.equal(want, run(), "the Linear after a refused call") end)

  cases {
    { "Linear(1.5, 4)", function() nn.Linear(1.5, 4) end, "lutra.nn.Linear",
      "in_features must be a positive integer (got 1.5)" },
    { "Linear(4, -1)", function() nn.Linear(4, -1) end, "lutra.nn.Linear", "out_features must be a positive integer" },
    { "Linear(\"4\", 4)", function() nn.Linear("4", 4) end, "lutra.nn.Linear", "in_features must be a positive integer (got \"4\")" },
    { "Linear(2^31, 2^31) overflows", function() nn.Linear(2 ^ 31, 2 ^ 31) end, "lutra_linear_new", "overflows" },
    { "Linear bias = 0", function() nn.Linear(4, 4, { bias = 0 }) end, "lutra.nn.Linear", "bias must be a boolean" },
    { "Linear seed = 1.5", function() nn.Linear(4, 4, { seed = 1.5 }) end, "lutra.nn.Linear", "seed must be an integer" },
    { "Linear seed = \"1\"", function() nn.Linear(4, 4, { seed = "1" }) end, "lutra.nn.Linear", "seed must be" },
    { "Linear accumulate_main_grad = 1", function() nn.Linear(4, 4, { accumulate_main_grad = 1 }) end,
      "lutra.nn.Linear", "accumulate_main_grad must be a boolean" },
    { "Linear opts a number", function() nn.Linear(4, 4, 3) end, "lutra.nn.Linear", "options must be a table" },
    { "Sequential of a tensor", function() nn.Sequential(m, x) end, "lutra.nn.Sequential",
      "argument 2 must be a module" },
    { "Sequential of a table", function() nn.Sequential({}) end, "lutra.nn.Sequential", "argument 1 must be a module" },
    { "forward of a table", function() m:forward({}) end, "module:forward", "input must be a tensor" },
    { "forward of a number", function() m:forward(3) end, "module:forward", "input must be a tensor" },
    { "forward is_first_microbatch 1", function() m:forward(x, 1) end, "module:forward", "is_first_microbatch" },
    { "backward of a string", function() m:backward("dy") end, "module:backward", "grad_output must be a tensor" },
    { "backward input_grad 0", function() m:backward(dy, 0) end, "module:backward", "input_grad must be a boolean" },
    { "quantizer of an unknown role", function() m:quantizer("bias") end, "module:quantizer", "unknown role 'bias'" },
    -- as TransformerEngine: refused whatever the group (none here), MPI or not
    { "row-parallel LayerNormLinear", function() nn.LayerNormLinear(16, 8, { parallel_mode = "row" }) end,
      "lutra_layernorm_linear_parallel_new", "row-parallel is not supported (TransformerEngine refuses it too)" },
    { "row-parallel + SP LayerNormLinear", function()
        nn.LayerNormLinear(16, 8, { parallel_mode = "row", sequence_parallel = true })
      end, "lutra_layernorm_linear_parallel_new", "the norm over the full hidden needs every feature of a row" },
  }

  local loss = nn.MSELoss()
  local target = lutra.tensor({ 4, 8 }):randn(33)
  cases {
    { "loss forward of a table", function() loss:forward({}, target) end, "loss:forward", "pred must be a tensor" },
    { "loss target a number", function() loss:forward(dy, 1) end, "loss:forward", "target must be a tensor" },
  }

  it("a NaN loss's value is a Lua number (NaN)", function()
    local l = nn.MSELoss()
    l:forward(lutra.tensor({ 2 }):fill(0 / 0), lutra.tensor({ 2 }))
    local v = l:value()
    assert.are.equal("number", type(v))
    assert.is_true(v ~= v)
  end)
end)

describe("bad inputs: the seed generator", function()
  it("unseeded fills and Linears differ; manual_seed repeats them", function()
    local a, b = lutra.tensor({ 16 }):randn(), lutra.tensor({ 16 }):randn()
    assert.are_not.equal(snap(a), snap(b))
    local w = function(mod) return snap(mod:parameters()[1].value) end
    assert.are_not.equal(w(lutra.nn.Linear(8, 8)), w(lutra.nn.Linear(8, 8)))
    lutra.manual_seed(42)
    local r1, l1 = snap(lutra.tensor({ 16 }):uniform()), w(lutra.nn.Linear(8, 8))
    lutra.manual_seed(42)
    assert.are.equal(r1, snap(lutra.tensor({ 16 }):uniform()))
    assert.are.equal(l1, w(lutra.nn.Linear(8, 8)))
    -- an explicit seed does not draw from the generator
    lutra.manual_seed(42)
    lutra.tensor({ 4 }):randn(7)
    assert.are.equal(r1, snap(lutra.tensor({ 16 }):uniform()))
  end)

  cases {
    { "manual_seed(1.5)", function() lutra.manual_seed(1.5) end, "lutra.manual_seed", "seed must be an integer" },
    { "manual_seed(\"1\")", function() lutra.manual_seed("1") end, "lutra.manual_seed", "seed must be" },
    { "manual_seed(-3)", function() lutra.manual_seed(-3) end, "lutra.manual_seed", "seed must be" },
  }
end)

-- bad_input_c_spec.lua holds the rest (at least 50): the suite has at least 130
describe("bad inputs: count", function()
  it("this file checks at least 80 bad inputs", function()
    io.stderr:write("bad inputs in this file: ", counter.n, "\n")
    assert.is_true(counter.n >= 80, "only " .. counter.n)
  end)
end)
