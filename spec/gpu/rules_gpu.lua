-- Lua scaling rules on the device against the CPU backend (lua/lutra/rules.lua,
-- src/backend/cuda/rules_cuda.c, kernels/rules/rules.cu): the histories gathered, rolled and the
-- scales written back must be the CPU's bit for bit when the amaxes are (fixed weights, the
-- same inputs and gradients on both devices), for the forward roles at the scope's exit and
-- grad_output at the backward; and a recipe with a Lua rule inside a graph capture is refused.
local lutra = require("lutra")
local nn = lutra.nn
local S = require("spec.gpu.support")
local DEV, REF = S.DEV, S.REF
local function test(name, fn) S.test(it, name, fn) end

local N = 5
local function ema(h, n)
  local e = 0
  for i = 1, n - 1 do e = 0.75 * e + 0.25 * h[i] end
  return 0.75 * e + 0.25 * h[0]
end
local function sf(amax, old, fp8_max, margin) return 0.5 * old + 0.5 * (fp8_max / 2 ^ margin / amax) end

local function run(device, recipe)
  local lin = S.hold(nn.Linear(64, 32, { seed = 5, device = device }))
  local scope = lutra.autocast { recipe = recipe }
  local trace = {}
  for s = 1, 7 do
    local x = lutra.tensor({ 32, 64 }, "f32", device):randn(30 + s, 0, s)
    local dy = lutra.tensor({ 32, 32 }, "f32", device):randn(60 + s, 0, 1 / s)
    scope:enter()
    lin:forward(x)
    scope:exit()
    lin:backward(dy)
    local row = {}
    for _, role in ipairs { "input", "weight", "grad_output" } do
      local q = lin:quantizer(role)
      local sc, inv = q:scale()
      row[role] = { sc, inv, q:history(N) }
    end
    trace[s] = row
  end
  return trace
end

describe("Lua scaling rules on " .. DEV, function()
  test("give the CPU backend's scales and histories bit for bit", function()
    local recipe = lutra.recipe.delayed { amax_history_len = N, amax_compute_algo = ema,
                                          scaling_factor_compute_algo = sf }
    local want, got = run(REF, recipe), run(DEV, recipe)
    for s = 1, #want do assert.are.same(want[s], got[s], "step " .. s) end
    assert.are_not.equal(1, want[7].grad_output[1])
  end)

  test("a scaling-rule recipe inside a graph capture is an error naming the reason", function()
    if DEV ~= "cuda" then return end -- graphs are CUDA's
    local recipe = lutra.recipe.delayed { amax_history_len = N, amax_compute_algo = ema }
    local lin = S.hold(nn.Linear(64, 32, { seed = 5, device = DEV }))
    local scope = lutra.autocast { recipe = recipe }
    local x = lutra.tensor({ 32, 64 }, "f32", DEV):randn(3)
    local ok, err = pcall(lutra.graph.capture, function()
      scope:run(function() lin:forward(x) end)
    end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("cannot run inside a CUDA graph capture", 1, true), err)
    assert.are.equal(0, (lutra.autocast_state()))
    assert.are.equal(0, lutra.C.lutra_rules_pending())
  end)
end)
