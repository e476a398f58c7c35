-- Bad inputs, part 2: recipes, quantizers, autocast, optimizers through the Lua API, and the C
-- API called directly through ffi.C (the status, and lutra_last_error naming the call). Each
-- object involved is checked to still work, bit for bit, after the refused call.
local lutra = require("lutra")
local ffi, C = lutra.ffi, lutra.C
local E = require("spec.support.errors")
local expect_error = E.expect_error
local R = lutra.recipe

local counter = { n = 0 }
local c_check = E.c_check
local function cases(list) E.cases(list, counter, it) end

describe("bad inputs: recipes", function()
  cases {
    { "delayed margin 200 (scale 0, scale_inv inf)", function() R.delayed { margin = 200 } end,
      "lutra_recipe_delayed", "margin must be in 0..32 so that the scale" },
    { "delayed margin 33", function() R.delayed { margin = 33 } end, "lutra_recipe_delayed", "got 33" },
    { "delayed margin 1.5", function() R.delayed { margin = 1.5 } end, "lutra.recipe.delayed",
      "margin must be an integer (got 1.5)" },
    { "delayed margin \"1\"", function() R.delayed { margin = "1" } end, "lutra.recipe.delayed",
      "margin must be an integer (got \"1\")" },
    { "delayed margin 2^40 (past int32)", function() R.delayed { margin = 2 ^ 40 } end,
      "lutra.recipe.delayed", "margin must be an integer in" },
    { "delayed reduce_amax \"no\"", function() R.delayed { reduce_amax = "no" } end,
      "lutra.recipe.delayed", "reduce_amax must be a boolean (got \"no\")" },
    { "delayed reduce_amax 0", function() R.delayed { reduce_amax = 0 } end, "lutra.recipe.delayed",
      "reduce_amax must be a boolean" },
    { "delayed amax_history_len 2.5", function() R.delayed { amax_history_len = 2.5 } end,
      "lutra.recipe.delayed", "amax_history_len must be an integer" },
    { "custom margin 200 with a delayed role", function()
        R.custom { grad_output = { kind = "delayed", format = "e4m3" }, margin = 200 }
      end, "lutra_recipe_custom", "margin must be in 0..32" },
    { "custom margin 200 without a delayed role", function() R.custom { margin = 200 } end,
      "lutra_recipe_custom", "margin must be in 0..32" },
    { "mxfp8 margin 1.5", function() R.mxfp8 { margin = 1.5 } end, "lutra.recipe.mxfp8", "margin must be an integer" },
    { "current power_2_scale 1", function() R.current { power_2_scale = 1 } end, "lutra.recipe.current",
      "power_2_scale must be a boolean" },
    { "current amax_epsilon \"0\"", function() R.current { amax_epsilon = "0" } end, "lutra.recipe.current",
      "amax_epsilon must be a number" },
    { "block block_dim 1.5", function() R.block { block_dim = 1.5 } end, "lutra.recipe.block",
      "block_dim must be an integer" },
    { "block power_2_scale per role \"yes\"", function() R.block { power_2_scale = { input = "yes" } } end,
      "lutra.recipe.block", "power_2_scale must be a boolean" },
    { "custom: e5m2 input and grad_output (wgrad)", function()
        R.custom { input = { format = "e5m2" }, grad_output = { format = "e5m2" } }
      end, "lutra_recipe_custom", "the wgrad GEMM would be E5M2 x E5M2" },
    { "custom: e5m2 weight and grad_output (dgrad)", function()
        R.custom { weight = { format = "e5m2" } }
      end, "lutra_recipe_custom", "the dgrad GEMM would be E5M2 x E5M2" },
    { "custom: role not a table", function() R.custom { input = "current" } end, "lutra.recipe.custom",
      "input must be a table" },
    { "custom: role power_2_scale 1", function() R.custom { input = { power_2_scale = 1 } } end,
      "lutra.recipe.custom", "input.power_2_scale must be a boolean" },
  }

  it("custom: e5m2 grad_output with e4m3 input and weight is accepted and trains", function()
    local r = R.custom { input = { format = "e4m3" }, weight = { format = "e4m3" },
                         grad_output = { format = "e5m2" } }
    local m = lutra.nn.Linear(32, 32, { seed = 9 })
    local s = lutra.autocast { recipe = r }
    s:run(function() m:forward(lutra.tensor({ 32, 32 }):randn(1)) end)
    m:backward(lutra.tensor({ 32, 32 }):randn(2))
  end)
end)

describe("bad inputs: quantizers, autocast, optimizers", function()
  local r = R.current()
  local q = lutra.quantizer(r, "input")
  local x = lutra.tensor({ 32, 32 }):randn(41)
  local want = q:quantize(x):bytes()
  after_each(function() assert.are.equal(want, q:quantize(x):bytes(), "the quantizer changed") end)

  local m = lutra.nn.Linear(8, 8, { seed = 3 })
  local opt = lutra.optim.SGD(m, { lr = 0.1 })
  cases {
    { "quantizer recipe a table", function() lutra.quantizer({}, "input") end, "lutra.quantizer", "recipe must be a recipe" },
    { "quantizer rowwise 1", function() lutra.quantizer(r, "input", { rowwise = 1 }) end, "lutra.quantizer",
      "rowwise must be a boolean" },
    { "quantizer role 0.5", function() lutra.quantizer(r, 0.5) end, "lutra.quantizer", "role code must be an integer" },
    { "quantize a table", function() q:quantize({}) end, "quantizer:quantize", "x must be a tensor" },
    { "quantize_dbias dbias a number", function() q:quantize_dbias(x, 1) end, "quantizer:quantize_dbias",
      "dbias must be a tensor" },
    { "quantize_dbias accumulate 1", function() q:quantize_dbias(x, lutra.tensor({ 32 }), 1) end,
      "quantizer:quantize_dbias", "accumulate must be a boolean" },
    { "quantize_skip skip a string", function() q:quantize_skip(x, "no") end, "quantizer:quantize_skip",
      "skip must be a tensor" },
    { "history(-1)", function() q:history(-1) end, "quantizer:history", "n must be a positive integer" },
    { "history(1.5)", function() q:history(1.5) end, "quantizer:history", "n must be a positive integer" },
    { "record_amax(\"1\")", function() q:record_amax("1") end, "quantizer:record_amax", "amax must be a number" },
    { "dequantize out a table", function() lutra.dequantize(q:quantize(x), {}) end, "lutra.dequantize",
      "out must be a tensor" },
    { "dequantize columnwise 1", function() lutra.dequantize(q:quantize(x), lutra.tensor({ 32, 32 }), 1) end,
      "lutra.dequantize", "columnwise must be a boolean" },
    { "autocast recipe a string", function() lutra.autocast { recipe = "delayed" } end, "lutra.autocast",
      "recipe must be a recipe" },
    { "autocast enabled 1", function() lutra.autocast { recipe = r, enabled = 1 } end, "lutra.autocast",
      "enabled must be a boolean" },
    { "autocast calibrating \"yes\"", function() lutra.autocast { calibrating = "yes" } end, "lutra.autocast",
      "calibrating must be a boolean" },
    { "SGD lr \"x\"", function() lutra.optim.SGD(m, { lr = "x" }) end, "lutra.optim.SGD", "lr must be a number (got \"x\")" },
    { "AdamW beta1 a table", function() lutra.optim.AdamW(m, { beta1 = {} }) end, "lutra.optim.AdamW",
      "beta1 must be a number" },
    { "SGD of a tensor", function() lutra.optim.SGD(x) end, "lutra.optim.SGD", "module must be a module" },
    { "set_lr(\"1\")", function() opt:set_lr("1") end, "optim:set_lr", "lr must be a number" },
  }
end)

describe("bad inputs: the C API through ffi.C", function()
  local shape = ffi.new("int64_t[2]")
  local box = ffi.new("lutra_tensor*[1]")
  local x = lutra.tensor({ 4, 4 }):randn(51)
  local want = x:bytes()
  after_each(function() assert.are.equal(want, x:bytes(), "x changed") end)

  local function new(d0, d1, dtype)
    shape[0], shape[1] = d0, d1
    return C.lutra_tensor_new(dtype or C.LUTRA_F32, 2, shape, C.LUTRA_CPU, box)
  end
  local buf = ffi.new("float[16]")
  local names = ffi.new("const char*[2]")
  local sizes = ffi.new("size_t[2]")
  local d = ffi.new("lutra_delayed_desc")
  local cd = ffi.new("lutra_custom_desc")
  cases {
    { "tensor_new 2^31 x 2^31", function() c_check(new(2 ^ 31, 2 ^ 31)) end, "lutra_tensor_new", "overflows" },
    { "tensor_new 2^32 x 2^30 bf16", function() c_check(new(2 ^ 32, 2 ^ 30, C.LUTRA_BF16)) end,
      "lutra_tensor_new", "overflows" },
    { "tensor_new int64 overflow", function() c_check(new(2 ^ 62, 4)) end, "lutra_tensor_new", "shape overflows" },
    { "tensor_new ndim 5", function() c_check(C.lutra_tensor_new(C.LUTRA_F32, 5, shape, 0, box)) end,
      "lutra_tensor_new", "ndim 5 is out of range" },
    { "tensor_new out NULL", function() c_check(C.lutra_tensor_new(C.LUTRA_F32, 2, shape, 0, nil)) end,
      "lutra_tensor_new", "out is NULL" },
    { "set_f32 n != numel", function() c_check(C.lutra_tensor_set_f32(x, buf, 15)) end,
      "lutra_tensor_set_f32", "15 values given for a tensor of 16" },
    { "get_f32 n != numel", function() c_check(C.lutra_tensor_get_f32(x, buf, 17)) end,
      "lutra_tensor_get_f32", "17 values given" },
    { "get_f32 dst NULL", function() c_check(C.lutra_tensor_get_f32(x, nil, 16)) end,
      "lutra_tensor_get_f32", "dst is NULL" },
    { "set_i32 on f32", function() c_check(C.lutra_tensor_set_i32(x, ffi.new("int32_t[16]"), 16)) end,
      "lutra_tensor_set_i32", "is not i32" },
    { "get_bytes wrong size", function() c_check(C.lutra_tensor_get_bytes(x, 0, buf, 63)) end,
      "lutra_tensor_get_bytes", "63 bytes asked for a tensor of 64 bytes" },
    { "reshape ndim 0", function() c_check(C.lutra_tensor_reshape(x, 0, shape)) end,
      "lutra_tensor_reshape", "ndim 0 is out of range" },
    { "uniform NaN bound", function() c_check(C.lutra_tensor_uniform(x, 1, 0 / 0, 1)) end,
      "lutra_tensor_uniform", "parameters must be finite" },
    { "seed_next out NULL", function() c_check(C.lutra_seed_next(nil)) end, "lutra_seed_next", "out is NULL" },
    { "layout(-1)", function() c_check(C.lutra_layout(-1, names, names + 1, sizes, sizes + 1)) end,
      "lutra_layout", "entry -1 is out of range" },
    { "layout past the end", function() c_check(C.lutra_layout(100000, names, names + 1, sizes, sizes + 1)) end,
      "lutra_layout", "entry 100000 is out of range" },
    { "layout NULL outputs", function() c_check(C.lutra_layout(0, nil, nil, nil, nil)) end,
      "lutra_layout", "output pointers must not be NULL" },
    { "recipe_delayed margin 200", function()
        C.lutra_delayed_defaults(d); d.margin = 200
        c_check(C.lutra_recipe_delayed(d, ffi.new("lutra_recipe*[1]")))
      end, "lutra_recipe_delayed", "margin must be in 0..32" },
    { "recipe_custom e5m2 x e5m2 in dgrad", function()
        C.lutra_custom_defaults(cd); cd.format[C.LUTRA_ROLE_WEIGHT] = C.LUTRA_E5M2
        c_check(C.lutra_recipe_custom(cd, ffi.new("lutra_recipe*[1]")))
      end, "lutra_recipe_custom", "dgrad" },
    { "gemm D is A", function() c_check(C.lutra_gemm(x, 0, x, 0, x, nil, 0)) end, "lutra_gemm", "D aliases A" },
  }

  it("lutra_layout(-1) returns EINVAL with its message set (not a stale one)", function()
    C.lutra_tensor_get_f32(x, nil, 16) -- leaves another message behind
    assert.are.equal(C.LUTRA_EINVAL, C.lutra_layout(-1, names, names + 1, sizes, sizes + 1))
    local msg = ffi.string(C.lutra_last_error())
    assert.are.equal("lutra_layout: entry -1 is out of range 0..", msg:sub(1, 42))
  end)

  it("lutra_tensor_new zero-fills i32 and float tensors", function()
    shape[0], shape[1] = 8, 8
    for _, dt in ipairs { C.LUTRA_I32, C.LUTRA_F32, C.LUTRA_BF16 } do
      c_check(C.lutra_tensor_new(dt, 2, shape, C.LUTRA_CPU, box))
      local t = ffi.gc(box[0], C.lutra_tensor_unref)
      assert.are.equal(string.rep("\0", t:size() * tonumber(C.lutra_dtype_size(dt))), t:bytes())
    end
  end)
end)

describe("bad inputs: the suite's count", function()
  -- (busted gives each spec file its own globals: bad_input_spec.lua checks its own count)
  it("this file checks at least 50 bad inputs (bad_input_spec.lua at least 80)", function()
    io.stderr:write("bad inputs in this file: ", counter.n, "\n")
    assert.is_true(counter.n >= 50, "only " .. counter.n)
  end)
end)
