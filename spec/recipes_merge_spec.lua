-- The recipe prototyping features (hybrid quantizers, factory recipes, backward overrides) with
-- what came beside them: inference forwards and the weight cache, activations inside the casts,
-- LayerNormLinear's norm writing the FP8 input, and checkpoints. Every comparison is bit for bit
-- against the same computation taken another way (a fresh module, the modules run one by one, a
-- plain recipe), with fresh random inputs.
local lutra = require("lutra")
local nn = lutra.nn
local R = lutra.recipe

local function cur(format, colfmt) return { kind = "current", format = format, columnwise_format = colfmt } end
local function del(format, colfmt)
  return { kind = "delayed", format = format, columnwise_format = colfmt }
end

local tmp = os.tmpname()
os.remove(tmp)
os.execute("mkdir -p " .. tmp)
local function path(name) return tmp .. "/" .. name end

describe("recipe prototyping with the rest of lutra", function()
  local seed = os.time() % 100000

  it("requantize a hybrid weight's columnwise copy after an inference forward", function()
    -- the inference forward quantizes the weight rowwise only: a later training forward that
    -- reuses the cached weight (is_first_microbatch = false) must not read a stale columnwise copy
    local hybrid = R.custom { input = cur("e4m3"), weight = cur("e5m2", "e4m3"),
                              grad_output = cur("e5m2") }
    local x = lutra.tensor({ 16, 32 }):randn(seed, 0, 1)
    local dy = lutra.tensor({ 16, 32 }):randn(seed + 1, 0, 0.1)
    local w2 = lutra.tensor({ 32, 32 }):randn(seed + 2, 0, 0.2)
    local lin = nn.Linear(32, 32, { seed = 3 })
    local scope = lutra.autocast { recipe = hybrid }
    scope:run(function() lin:forward(x) end)
    lin:backward(dy)
    lin:parameters()[1].value:copy(w2) -- the optimizer's step
    scope:run(function()
      lin:forward(x, { grad = false })
      lin:forward(x, { is_first_microbatch = false })
    end)
    local dx = lin:backward(dy):to_table()
    local fresh = nn.Linear(32, 32, { seed = 3 })
    fresh:parameters()[1].value:copy(w2)
    scope:run(function() fresh:forward(x) end)
    assert.are.same(fresh:backward(dy):to_table(), dx)
  end)

  it("keep the activation's output for a high-precision backward of a fused input cast", function()
    -- delayed scaling runs ReLU inside the second Linear's input cast; with backward_override
    -- "high_precision" its wgrad reads the activation's output in high precision
    local r = R.delayed { backward_override = "high_precision" }
    local x = lutra.tensor({ 16, 32 }):randn(seed + 3, 0, 1)
    local dy = lutra.tensor({ 16, 16 }):randn(seed + 4, 0, 0.1)
    local function build()
      return nn.Linear(32, 48, { seed = 11 }), nn.ReLU(), nn.Linear(48, 16, { seed = 12 })
    end
    local a1, act, a2 = build()
    local seq = nn.Sequential(a1, act, a2)
    local scope = lutra.autocast { recipe = r }
    scope:run(function() seq:forward(x) end)
    seq:backward(dy)
    assert.is_true(seq:fusions() >= 1, "the activation did not run inside the cast")
    local b1, bact, b2 = build()
    lutra.autocast { recipe = r }:run(function() b2:forward(bact:forward(b1:forward(x))) end)
    b1:backward(bact:backward(b2:backward(dy)))
    assert.are.same(b2:parameters()[1].grad:to_table(), a2:parameters()[1].grad:to_table())
    assert.are.same(b1:parameters()[1].grad:to_table(), a1:parameters()[1].grad:to_table())
  end)

  it("run LayerNormLinear's hybrid input through two casts, not the norm's one", function()
    local x = lutra.tensor({ 16, 32 }):randn(seed + 5, 0, 2)
    local dy = lutra.tensor({ 16, 32 }):randn(seed + 6, 0, 0.1)
    local function run(recipe)
      local m = nn.LayerNormLinear(32, 32, { seed = 21 })
      local y = lutra.autocast { recipe = recipe }:run(function() return m:forward(x):to_table() end)
      local dx = m:backward(dy):to_table()
      local p = m:parameters()
      return { y = y, dx = dx, wgrad = p[3].grad:to_table(), fused = m:norm_fused() }
    end
    local h = run(R.custom { input = cur("e4m3", "e5m2"), weight = cur("e4m3"),
                             grad_output = cur("e5m2", "e4m3") })
    local rw = run(R.custom { input = cur("e4m3"), weight = cur("e4m3"), grad_output = cur("e5m2") })
    local cw = run(R.custom { input = cur("e5m2"), weight = cur("e4m3"), grad_output = cur("e4m3") })
    assert.is_false(h.fused)
    assert.is_true(rw.fused) -- the plain recipe's norm writes the FP8 input (same codes)
    assert.are.same(rw.y, h.y)
    assert.are.same(rw.dx, h.dx)
    assert.are.same(cw.wgrad, h.wgrad)
    assert.are_not.same(rw.wgrad, cw.wgrad)
    -- a high-precision backward reads the norm's output: the norm writes it, not the FP8 input
    local hp = run(R.current { backward_override = "high_precision" })
    assert.is_false(hp.fused)
  end)

  it("tell a factory which kind of module asks", function()
    local asked = {}
    local f = R.custom { factory = function(role, kind, name)
      asked[#asked + 1] = kind .. "/" .. name
      return { kind = "current", format = role == "grad_output" and "e5m2" or "e4m3" }
    end }
    local m = nn.LayerNormLinear(32, 16, { seed = 1 })
    local x = lutra.tensor({ 16, 32 }):randn(seed + 7)
    lutra.autocast { recipe = f }:run(function() m:forward(x) end)
    assert.are.same({ "layernorm_linear/", "layernorm_linear/", "layernorm_linear/" }, asked)
  end)

  it("leave nothing waiting after a factory that raised, and ask again at the next forward", function()
    local ffi = require("ffi")
    local fail = true
    local f = R.custom { factory = function(role)
      if fail then error("no choice yet") end
      return { kind = "current", format = role == "grad_output" and "e5m2" or "e4m3" }
    end }
    local lin = nn.Linear(16, 16, { seed = 2 })
    local x = lutra.tensor({ 16, 16 }):randn(seed + 12)
    local scope = lutra.autocast { recipe = f }
    local ok, err = pcall(scope.run, scope, function() lin:forward(x) end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("no choice yet", 1, true), err)
    assert.are_not.equal(0, lutra.C.lutra_factory_request(ffi.new("int[1]"),
                                                          ffi.new("const char*[1]"),
                                                          ffi.new("const char*[1]")))
    assert.truthy(ffi.string(lutra.C.lutra_last_error()):find("no module waits", 1, true))
    fail = false
    local y = scope:run(function() return lin:forward(x):to_table() end)
    assert.are.equal(256, #y)
    assert.is_not_nil(lin:quantizer("input")) -- the choice was stored this time
  end)

  it("save and restore a hybrid role's columnwise quantizer in a checkpoint", function()
    local r = R.custom { input = del("e4m3", "e5m2"), weight = del("e4m3"),
                         grad_output = del("e5m2", "e4m3"), amax_history_len = 4 }
    local x = lutra.tensor({ 16, 32 }):randn(seed + 8, 0, 1)
    local dy = lutra.tensor({ 16, 16 }):randn(seed + 9, 0, 0.1)
    local function model() return nn.Sequential(nn.Linear(32, 16, { seed = 31 })) end
    local function step(net, scale)
      x:randn(seed + 10 + scale, 0, scale)
      lutra.autocast { recipe = r }:run(function() net:forward(x) end)
      net:backward(dy)
    end
    local a = model()
    for s = 1, 3 do step(a, s) end
    local file = path("hybrid.st")
    lutra.save(file, { model = a })
    local f = io.open(file, "rb")
    local bytes = f:read("*a")
    f:close()
    assert.truthy(bytes:find('"0.fp8.input_columnwise.amax_history"', 1, true))
    assert.truthy(bytes:find('"0.fp8.grad_output_columnwise.scale"', 1, true))
    local b = model()
    lutra.load(file, { model = b, recipe = r })
    step(a, 4)
    step(b, 4)
    assert.are.same(a:parameters()[1].grad:to_table(), b:parameters()[1].grad:to_table())
    -- a fresh model's factory choice is made at its first forward: a load cannot build it
    local fr = R.custom { factory = function(role)
      return { kind = "delayed", format = role == "grad_output" and "e5m2" or "e4m3" }
    end }
    local ok, err = pcall(lutra.load, file, { model = model(), recipe = fr })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("run one forward under the recipe", 1, true), err)
  end)
end)
