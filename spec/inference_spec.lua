-- The inference forward, module:forward(x, {grad = false}), on the CPU backend: its output bit
-- for bit the training forward's (two modules made from the same seeds, one forward each, so
-- that delayed scaling's history is the same for both), no columnwise FP8 copy made (the
-- quantized input's and weight's col_data NULL, where a training forward has them), nothing
-- kept for a backward (a backward after it refused naming the reason), and the buffers of a
-- training batch size and an evaluation batch size both kept: alternating between them
-- allocates nothing after the first round (stable addresses). Fresh random inputs each run.
local lutra = require("lutra")
local ffi = require("ffi")
local nn, R = lutra.nn, lutra.recipe

local RECIPES = {
  { name = "high precision" },
  { name = "delayed", make = function() return R.delayed {} end },
  { name = "current", make = function() return R.current {} end },
  { name = "mxfp8", make = function() return R.mxfp8 {} end },
  { name = "block", make = function() return R.block {} end },
}

local function addr(p) return tonumber(ffi.cast("uintptr_t", p)) end

local function same_bits(a, b, what)
  local x, y = a:to_table(), b:to_table()
  assert.are.equal(#y, #x, what .. ": sizes")
  for i = 1, #x do
    if x[i] ~= y[i] then error(string.format("%s: element %d: %.9g vs %.9g", what, i, x[i], y[i]), 2) end
  end
end

local function forward(m, x, rec, grad)
  local y
  if rec.make then
    lutra.autocast { recipe = rec.make() }:run(function() y = m:forward(x, { grad = grad }) end)
  else
    y = m:forward(x, { grad = grad })
  end
  return y
end

-- the models compared: each builds the same modules from a seed
local MODELS = {
  { name = "Linear", make = function(s) return nn.Linear(64, 32, { seed = s }) end, linear = true },
  { name = "Sequential(Linear, GELU, Linear)", make = function(s)
    return nn.Sequential(nn.Linear(64, 96, { seed = s }), nn.GELU(), nn.Linear(96, 32, { seed = s + 1 }))
  end },
  { name = "Sequential(Linear, SwiGLU, Linear)", make = function(s)
    return nn.Sequential(nn.Linear(64, 128, { seed = s }), nn.SwiGLU(), nn.Linear(64, 32, { seed = s + 1 }))
  end },
  { name = "Sequential(LayerNorm, Linear, SiLU, Linear, RMSNorm)", make = function(s)
    return nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 64, { seed = s }), nn.SiLU(),
                         nn.Linear(64, 32, { seed = s + 1 }), nn.RMSNorm(32))
  end },
}

describe("inference forward (grad = false)", function()
  for _, model in ipairs(MODELS) do
    for _, rec in ipairs(RECIPES) do
      it(model.name .. ", " .. rec.name .. ": output equals the training forward's, bit for bit", function()
        local seed = math.random(1, 2 ^ 20)
        local a, b = model.make(seed), model.make(seed)
        local x = lutra.tensor({ 32, 64 }):randn(seed)
        local yi = forward(a, x, rec, false)
        local yt = forward(b, x, rec, true)
        same_bits(yi, yt, model.name .. " " .. rec.name)
      end)
    end
  end

  for _, rec in ipairs(RECIPES) do
    if rec.make then
      it("makes no columnwise copies of the input or the weight (" .. rec.name .. ")", function()
        local m = nn.Linear(64, 32)
        local x = lutra.tensor({ 32, 64 }):randn(math.random(1, 2 ^ 20))
        forward(m, x, rec, true)
        for _, role in ipairs { "input", "weight" } do
          local q = m:quantized(role)
          assert.is_true(q.col_data ~= nil, role .. ": a training forward makes the columnwise copy")
        end
        forward(m, x, rec, false)
        for _, role in ipairs { "input", "weight" } do
          local q = m:quantized(role)
          assert.is_true(q.data ~= nil, role .. ": rowwise data")
          assert.is_true(q.col_data == nil, role .. ": no columnwise copy in inference")
        end
        -- the weight quantized for inference is not reused by a training forward that asks to
        -- reuse the cached weight: that one needs the columnwise copy
        lutra.autocast { recipe = rec.make() }:run(function() m:forward(x, { is_first_microbatch = false }) end)
        assert.is_true(m:quantized("weight").col_data ~= nil, "training after inference")
        m:backward(lutra.tensor({ 32, 32 }):randn(3))
      end)
    end
  end

  it("the fused activation cast of an inference forward makes no columnwise copy either", function()
    local l2 = nn.Linear(64, 32)
    local seq = nn.Sequential(nn.Linear(64, 64), nn.SiLU(), l2)
    local x = lutra.tensor({ 32, 64 }):randn(math.random(1, 2 ^ 20))
    lutra.autocast { recipe = R.delayed {} }:run(function() seq:forward(x, { grad = false }) end)
    assert.are.equal(1, (seq:fusions()))
    assert.is_true(l2:quantized("input").col_data == nil)
  end)

  local REFUSERS = {
    { name = "Linear", make = function() return nn.Linear(16, 16) end, fn = "lutra_linear_backward" },
    { name = "SiLU", make = function() return nn.SiLU() end, fn = "lutra_silu_backward" },
    { name = "LayerNorm", make = function() return nn.LayerNorm(16) end, fn = "lutra_layernorm_backward" },
    { name = "Sequential ending in a Linear", fn = "lutra_linear_backward", make = function()
      return nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
    end },
    { name = "Sequential ending in a fused GELU", fn = "lutra_gelu_backward", make = function()
      return nn.Sequential(nn.Linear(16, 16), nn.GELU())
    end },
  }
  for _, r in ipairs(REFUSERS) do
    for _, rec in ipairs { RECIPES[1], RECIPES[2] } do
      it("a backward after it is refused with the reason: " .. r.name .. " (" .. rec.name .. ")", function()
        local m = r.make()
        local y = forward(m, lutra.tensor({ 16, 16 }):randn(1), rec, false)
        local ok, err = pcall(function() m:backward(lutra.tensor({ 16, 16 }):randn(2)) end)
        assert.is_false(ok)
        assert.matches(r.fn .. ": the last forward ran with grad = false (inference): it kept nothing "
                       .. "for a backward", tostring(err), 1, true)
        -- and a training forward afterwards backpropagates again
        y = forward(m, lutra.tensor({ 16, 16 }):randn(1), rec, true)
        m:backward(lutra.tensor({ 16, 16 }):randn(2))
        assert.are.equal(256, #y:to_table())
      end)
    end
  end

  for _, rec in ipairs { RECIPES[1], RECIPES[2], RECIPES[4] } do
    it("alternating train and eval batch sizes allocates nothing after the first round (" .. rec.name .. ")", function()
      local l1, l2 = nn.Linear(64, 128), nn.Linear(64, 32)
      local seq = nn.Sequential(l1, nn.SwiGLU(), l2)
      local seen = {}
      local function note(key, p)
        if seen[key] == nil then seen[key] = addr(p) end
        assert.are.equal(seen[key], addr(p), key .. ": the buffer moved")
      end
      for round = 1, 3 do
        local xt = lutra.tensor({ 64, 64 }):randn(round)
        local yt = forward(seq, xt, rec, true)
        local dx = seq:backward(lutra.tensor({ 64, 32 }):randn(round + 10))
        note("train y", yt.data)
        note("train dx", dx.data)
        if rec.make then note("train q(x)", l2:quantized("input").data) end
        local xe = lutra.tensor({ 32, 64 }):randn(round + 20)
        local ye = forward(seq, xe, rec, false)
        note("eval y", ye.data)
        if rec.make then note("eval q(x)", l2:quantized("input").data) end
        -- the training step's output stays valid beside the evaluation one
        assert.are.equal(64 * 32, #yt:to_table())
        assert.are_not.equal(addr(yt.data), addr(ye.data))
      end
    end)
  end
end)
