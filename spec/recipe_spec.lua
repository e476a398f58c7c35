-- Recipes: per-role defaults, keys, and validation of every parameter.
-- Expected values are TransformerEngine's recipe defaults, written out here by hand.
local lutra = require("lutra")
local ffi = require("ffi")
local C = lutra.C
local R = lutra.recipe

-- Runs fn and returns its error message (fails the test when fn does not raise).
local function err_of(fn, ...)
  local ok, msg = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(msg)
end

-- Asserts that fn raises an error whose message contains every plain-text fragment.
local function assert_error(fn, ...)
  local frags = { ... }
  local msg = err_of(fn)
  for _, f in ipairs(frags) do
    assert.is_truthy(msg:find(f, 1, true),
                     string.format("error %q does not contain %q", msg, f))
  end
  return msg
end

local function roles(r)
  local out = {}
  for _, role in ipairs { "input", "weight", "grad_output" } do
    local k, dt = r:role(role)
    out[role] = { k, dt }
  end
  return out
end

local function key_str(r) return tostring(r:key()) end

describe("recipe defaults", function()
  it("delayed: HYBRID gives e4m3/e4m3/e5m2, all delayed", function()
    assert.are.same({ input = { "delayed", "e4m3" }, weight = { "delayed", "e4m3" },
                      grad_output = { "delayed", "e5m2" } }, roles(R.delayed()))
    assert.are.equal("delayed", R.delayed():kind())
  end)

  it("delayed e4m3 format gives e4m3 for all roles", function()
    assert.are.same({ input = { "delayed", "e4m3" }, weight = { "delayed", "e4m3" },
                      grad_output = { "delayed", "e4m3" } }, roles(R.delayed { fp8_format = "e4m3" }))
  end)

  it("delayed defaults match TE's DelayedScaling (margin 0, history 1024, max, reduce)", function()
    local d = ffi.new("lutra_delayed_desc")
    C.lutra_delayed_defaults(d)
    assert.are.equal(C.LUTRA_FORMAT_HYBRID, d.fp8_format)
    assert.are.equal(0, d.margin)
    assert.are.equal(1024, d.amax_history_len)
    assert.are.equal(C.LUTRA_AMAX_MAX, d.amax_compute_algo)
    assert.are.equal(1, d.reduce_amax)
    -- a delayed quantizer made from the default recipe has a 1024-long history
    local q = lutra.quantizer(R.delayed(), "input")
    assert.are.equal(1024, #q:history(1024))
    assert.has_error(function() q:history(1025) end)
  end)

  it("current: HYBRID by default, e4m3/e4m3/e5m2", function()
    assert.are.same({ input = { "current", "e4m3" }, weight = { "current", "e4m3" },
                      grad_output = { "current", "e5m2" } }, roles(R.current()))
    assert.are.equal("current", R.current():kind())
  end)

  it("mxfp8: e4m3 for all roles by default, hybrid on request", function()
    assert.are.same({ input = { "mxfp8", "e4m3" }, weight = { "mxfp8", "e4m3" },
                      grad_output = { "mxfp8", "e4m3" } }, roles(R.mxfp8()))
    assert.are.same({ input = { "mxfp8", "e4m3" }, weight = { "mxfp8", "e4m3" },
                      grad_output = { "mxfp8", "e5m2" } }, roles(R.mxfp8 { fp8_format = "hybrid" }))
    assert.are.equal("mxfp8", R.mxfp8():kind())
  end)

  it("block: block_1d/block_2d/block_1d, e4m3, power-of-2 scales", function()
    assert.are.same({ input = { "block_1d", "e4m3" }, weight = { "block_2d", "e4m3" },
                      grad_output = { "block_1d", "e4m3" } }, roles(R.block()))
    local d = ffi.new("lutra_block_desc")
    C.lutra_block_defaults(d)
    for i = 0, 2 do assert.are.equal(1, d.power_2_scale[i]) end
    assert.are.same({ 1, 2, 1 }, { d.block_dim[0], d.block_dim[1], d.block_dim[2] })
    assert.are.same({ input = { "block_2d", "e4m3" }, weight = { "block_1d", "e4m3" },
                      grad_output = { "block_2d", "e4m3" } },
                    roles(R.block { block_dim = { input = 2, weight = 1, grad_output = 2 } }))
    assert.are.equal("block", R.block():kind())
  end)

  it("custom: current for all roles, e4m3/e4m3/e5m2 by default; kinds per role", function()
    assert.are.same({ input = { "current", "e4m3" }, weight = { "current", "e4m3" },
                      grad_output = { "current", "e5m2" } }, roles(R.custom()))
    local r = R.custom { input = { kind = "mxfp8", format = "e4m3" },
                         weight = { kind = "block_2d", format = "e5m2" },
                         grad_output = { kind = "delayed", format = "e4m3" } }
    assert.are.same({ input = { "mxfp8", "e4m3" }, weight = { "block_2d", "e5m2" },
                      grad_output = { "delayed", "e4m3" } }, roles(r))
    local hp = R.custom { input = { kind = "none" }, weight = { kind = "none" },
                          grad_output = { kind = "none" } }
    assert.are.equal("none", (hp:role("input")))
    assert.are.equal("custom", r:kind())
  end)

  it("named() builds by name and 'none' gives nil", function()
    assert.is_nil(R.named("none"))
    assert.are.equal("current", R.named("current"):kind())
    assert_error(function() R.named("fp4") end, "lutra.recipe.named", "fp4")
  end)
end)

describe("recipe keys", function()
  it("are equal for equal fields", function()
    assert.are.equal(key_str(R.delayed()), key_str(R.delayed()))
    -- explicit defaults equal implicit ones
    assert.are.equal(key_str(R.delayed()), key_str(R.delayed {
      margin = 0, fp8_format = "hybrid", amax_history_len = 1024, amax_compute_algo = "max",
      reduce_amax = true }))
    assert.are.equal(key_str(R.delayed { margin = 3, amax_history_len = 16 }),
                     key_str(R.delayed { amax_history_len = 16, margin = 3 }))
    assert.are.equal(key_str(R.current { power_2_scale = true, amax_epsilon = 1e-6 }),
                     key_str(R.current { power_2_scale = { input = true, weight = true,
                                                            grad_output = true },
                                         amax_epsilon = 1e-6 }))
    assert.are.equal(key_str(R.mxfp8()), key_str(R.mxfp8 { fp8_format = "e4m3" }))
    assert.are.equal(key_str(R.block()),
                     key_str(R.block { block_dim = { input = 1, weight = 2, grad_output = 1 } }))
    assert.are.equal(key_str(R.custom()), key_str(R.custom {
      input = { kind = "current", format = "e4m3" }, weight = { kind = "current", format = "e4m3" },
      grad_output = { kind = "current", format = "e5m2" } }))
  end)

  it("differ when any field that changes numerics differs", function()
    local recipes = {
      R.delayed(),
      R.delayed { margin = 1 },
      R.delayed { amax_history_len = 16 },
      R.delayed { amax_compute_algo = "most_recent" },
      R.delayed { fp8_format = "e4m3" },
      R.delayed { reduce_amax = false },
      R.current(),
      R.current { fp8_format = "e4m3" },
      R.current { power_2_scale = true },
      R.current { power_2_scale = { weight = true } },
      R.current { amax_epsilon = 1e-3 },
      R.current { amax_epsilon = { grad_output = 1e-3 } },
      R.mxfp8(),
      R.mxfp8 { fp8_format = "hybrid" },
      R.block(),
      R.block { power_2_scale = false },
      R.block { block_dim = 1 },
      R.block { block_dim = { weight = 1, input = 2 } },
      R.block { amax_epsilon = 1e-4 },
      R.block { fp8_format = "hybrid" },
      R.custom(),
      R.custom { grad_output = { kind = "delayed", format = "e5m2" } },
      R.custom { grad_output = { kind = "delayed", format = "e5m2" }, margin = 2 },
      R.custom { input = { kind = "mxfp8" }, weight = { kind = "mxfp8" } },
      R.custom { input = { kind = "none" }, weight = { kind = "none" } },
      R.custom { weight = { power_2_scale = true } },
    }
    local seen = {}
    for i, r in ipairs(recipes) do
      local k = key_str(r)
      assert.is_nil(seen[k], string.format("recipe %d has the same key as recipe %s", i,
                                           tostring(seen[k])))
      seen[k] = i
    end
  end)

  it("custom with the same roles as current is a different recipe kind and key", function()
    assert.are_not.equal(key_str(R.current()), key_str(R.custom()))
  end)
end)

describe("recipe validation", function()
  it("delayed: negative margin", function()
    assert_error(function() R.delayed { margin = -1 } end,
                 "lutra_recipe_delayed: margin must be in 0..32")
  end)

  it("delayed: amax_history_len 0 and negative, and too long", function()
    assert_error(function() R.delayed { amax_history_len = 0 } end,
                 "lutra_recipe_delayed: amax_history_len must be >= 1")
    assert_error(function() R.delayed { amax_history_len = -5 } end,
                 "lutra_recipe_delayed: amax_history_len must be >= 1")
    assert_error(function() R.delayed { amax_history_len = 2 ^ 20 + 1 } end,
                 "lutra_recipe_delayed: amax_history_len")
  end)

  it("e5m2 fp8_format is refused by delayed, current, mxfp8 and block", function()
    assert_error(function() R.delayed { fp8_format = "e5m2" } end,
                 "lutra_recipe_delayed: fp8_format E5M2 is not supported")
    assert_error(function() R.current { fp8_format = "e5m2" } end,
                 "lutra_recipe_current: fp8_format E5M2 is not supported")
    assert_error(function() R.mxfp8 { fp8_format = "e5m2" } end,
                 "lutra_recipe_mxfp8: fp8_format E5M2 is not supported")
    assert_error(function() R.block { fp8_format = "e5m2" } end,
                 "lutra_recipe_block: fp8_format E5M2 is not supported")
  end)

  it("unknown fp8_format: by name in Lua, by code in C", function()
    assert_error(function() R.delayed { fp8_format = "e3m4" } end,
                 "lutra.recipe.delayed: unknown fp8_format 'e3m4'")
    assert_error(function() R.current { fp8_format = 9 } end,
                 "lutra_recipe_current: unknown fp8_format 9")
  end)

  it("unknown amax_compute_algo: by name in Lua, by code in C", function()
    assert_error(function() R.delayed { amax_compute_algo = "mean" } end,
                 "lutra.recipe.delayed: unknown amax_compute_algo 'mean'")
    assert_error(function() R.delayed { amax_compute_algo = 2 } end,
                 "lutra_recipe_delayed: unknown amax_compute_algo 2")
    assert_error(function()
      R.custom { grad_output = { kind = "delayed" }, amax_compute_algo = 5 }
    end, "lutra_recipe_custom: unknown amax_compute_algo 5")
  end)

  it("unknown option keys in the Lua table are errors (typos are not ignored)", function()
    assert_error(function() R.delayed { margine = 1 } end,
                 "lutra.recipe.delayed: unknown option 'margine'")
    assert_error(function() R.current { power2_scale = true } end,
                 "lutra.recipe.current: unknown option 'power2_scale'")
    assert_error(function() R.mxfp8 { block = 32 } end,
                 "lutra.recipe.mxfp8: unknown option 'block'")
    assert_error(function() R.block { blockdim = 1 } end,
                 "lutra.recipe.block: unknown option 'blockdim'")
    assert_error(function() R.custom { bias = {} } end,
                 "lutra.recipe.custom: unknown option 'bias'")
    assert_error(function() R.custom { input = { kind = "current", fmt = "e4m3" } } end,
                 "lutra.recipe.custom input: unknown option 'fmt'")
    assert_error(function() R.current { power_2_scale = { bias = true } } end,
                 "lutra.recipe.current: power_2_scale has unknown role 'bias'")
    assert_error(function() R.delayed(5) end, "lutra.recipe.delayed: options must be a table")
  end)

  it("block: block_dim 3 (and 0) for any role", function()
    assert_error(function() R.block { block_dim = 3 } end,
                 "lutra_recipe_block: block_dim for input must be 1 (1x128) or 2 (128x128)")
    assert_error(function() R.block { block_dim = { grad_output = 0 } } end,
                 "lutra_recipe_block: block_dim for grad_output must be 1")
    assert_error(function() R.block { block_dim = { weight = 3 } } end,
                 "lutra_recipe_block: block_dim for weight")
  end)

  it("negative, infinite or NaN amax_epsilon", function()
    assert_error(function() R.current { amax_epsilon = -1e-6 } end,
                 "lutra_recipe_current: amax_epsilon for input must be finite and >= 0")
    assert_error(function() R.current { amax_epsilon = { weight = -1 } } end,
                 "lutra_recipe_current: amax_epsilon for weight")
    assert_error(function() R.block { amax_epsilon = 1 / 0 } end,
                 "lutra_recipe_block: amax_epsilon for input must be finite")
    assert_error(function() R.block { amax_epsilon = { grad_output = 0 / 0 } } end,
                 "lutra_recipe_block: amax_epsilon for grad_output")
    assert_error(function() R.custom { weight = { amax_epsilon = -2 } } end,
                 "lutra_recipe_custom: amax_epsilon for weight")
  end)

  it("mxfp8: negative margin", function()
    assert_error(function() R.mxfp8 { margin = -1 } end, "lutra_recipe_mxfp8: margin must be")
  end)

  it("mxfp8: margin other than 0 is refused (lutra.h: 'kept for TE parity; must be 0')", function()
    -- MXFP8 quantization ignores margin, so accepting 1 would silently do nothing with it.
    assert_error(function() R.mxfp8 { margin = 1 } end, "lutra_recipe_mxfp8: margin")
  end)

  it("custom: e5m2 input and weight together", function()
    assert_error(function()
      R.custom { input = { kind = "current", format = "e5m2" },
                 weight = { kind = "current", format = "e5m2" } }
    end, "lutra_recipe_custom: input and weight cannot both be e5m2")
    -- one of them e5m2 is a valid E4M3 x E5M2 GEMM (grad_output e4m3: wgrad pairs it with input)
    local r = R.custom { input = { kind = "current", format = "e5m2" },
                         grad_output = { format = "e4m3" } }
    assert.are.same({ "current", "e5m2" }, { r:role("input") })
  end)

  it("custom: only one of input and weight quantized", function()
    assert_error(function() R.custom { input = { kind = "none" } } end,
                 "lutra_recipe_custom: input and weight must both be quantized")
    assert_error(function() R.custom { weight = { kind = "none" } } end,
                 "lutra_recipe_custom: input and weight must both be quantized")
  end)

  it("custom: unknown kind and format, by name and by code", function()
    assert_error(function() R.custom { input = { kind = "mxfp4" } } end,
                 "lutra.recipe.custom: unknown kind 'mxfp4'")
    assert_error(function() R.custom { input = { kind = 42 } } end,
                 "lutra_recipe_custom: unknown quantizer kind 42 for input")
    assert_error(function() R.custom { input = { format = "bf16" } } end,
                 "lutra.recipe.custom: unknown format 'bf16'")
    assert_error(function() R.custom { weight = { format = C.LUTRA_F32 } } end,
                 "lutra_recipe_custom: format for weight must be e4m3 or e5m2")
  end)

  it("custom: delayed-role fields are validated (margin, history length)", function()
    assert_error(function()
      R.custom { grad_output = { kind = "delayed" }, margin = -2 }
    end, "lutra_recipe_custom: margin must be in 0..32")
    assert_error(function()
      R.custom { input = { kind = "delayed" }, weight = { kind = "delayed" }, amax_history_len = 0 }
    end, "lutra_recipe_custom: amax_history_len must be >= 1")
  end)

  it("a refused recipe leaves the last error naming the C call, status EINVAL", function()
    local d = ffi.new("lutra_delayed_desc")
    C.lutra_delayed_defaults(d)
    d.margin = -3
    local box = ffi.new("lutra_recipe*[1]")
    assert.are.equal(C.LUTRA_EINVAL, C.lutra_recipe_delayed(d, box))
    assert.are.equal("lutra_recipe_delayed: margin must be in 0..32 so that the scale fp8_max / amax / "
                     .. "2^margin stays a normal float (got -3)",
                     ffi.string(C.lutra_last_error()))
    assert.are.equal(C.LUTRA_EINVAL, C.lutra_recipe_delayed(nil, box))
    assert.is_truthy(ffi.string(C.lutra_last_error()):find("lutra_recipe_delayed: desc is NULL", 1, true))
  end)

  it("role() refuses an unknown role", function()
    assert_error(function() R.current():role("bias") end, "unknown role 'bias'")
    assert_error(function() R.current():role(7) end, "lutra_recipe_role: unknown role 7")
  end)
end)
