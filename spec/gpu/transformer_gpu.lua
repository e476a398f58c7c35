-- nn.TransformerLayer on the device in bf16 against the CPU layer in f32 with the same weights
-- (the device's bf16 weights copied back to the CPU as f32), forward, input gradient and every
-- parameter gradient. Bounds: NMSE 1e-3 for y and dx, 1e-2 for the weight gradients. Every
-- bf16 tensor the chain writes (QKV, attention output, MLP hidden) is rounded to 2^-9 relative
-- (NMSE ~1e-6 each); the layer's output sums the residual stream with bf16 GEMM outputs, and its
-- gradients go through two residual branches and the softmax's backward, where cancellation
-- multiplies that relative error (measured NMSE ~1e-5 .. 1e-4 on these shapes); the weight
-- gradients sum B T products of such values. A CUDA graph of a forward + backward step replays
-- on new inputs to the eager step's bits.
local lutra = require("lutra")
local nn = lutra.nn
local S = require("spec.gpu.support")
local DEV, REF = S.DEV, S.REF
local function test(name, fn) S.test(it, name, fn) end

local SEED, seed = S.clock_seeds()
local function check_nmse(got, want, bound, what)
  return S.check_nmse(got, want, bound, what, SEED)
end
-- a bf16 input on DEV and its exact f32 copy on the CPU
local function input_pair(shape) return S.bf16_pair(shape, seed()) end

local CASES = {
  { hidden = 256, ffn = 1024, H = 4, Hkv = 4, B = 2, T = 67 },
  { hidden = 256, ffn = 512, H = 4, Hkv = 2, B = 2, T = 64, rope = true, norm = "RMSNorm",
    act = "swiglu" },
}

local function layer(c, dtype, device, s)
  return nn.TransformerLayer(c.hidden, c.ffn, c.H, { num_gqa_groups = c.Hkv, rope = c.rope,
    normalization = c.norm, activation = c.act, dtype = dtype, device = device, seed = s })
end

describe("nn.TransformerLayer on " .. DEV .. " against the CPU in f32", function()
  for n, c in ipairs(CASES) do
    test("case " .. n .. ": forward, dx and the parameters' gradients within their bounds", function()
      local s = seed()
      local dev, ref = layer(c, "bf16", DEV, s), layer(c, "f32", REF, s)
      local rp = ref:parameters()
      for i, p in ipairs(dev:parameters()) do rp[i].value:set(p.value:read()) end
      local xr, xd = input_pair({ c.B, c.T, c.hidden })
      local dr, dd = input_pair({ c.B, c.T, c.hidden })
      check_nmse(dev:forward(xd), ref:forward(xr), 1e-3, "y")
      check_nmse(dev:backward(dd), ref:backward(dr), 1e-3, "dx")
      for i, p in ipairs(dev:parameters()) do
        check_nmse(p.grad, rp[i].grad, 1e-2, "parameter " .. i .. "'s gradient")
      end
    end)
  end

  -- the Residual's sums are made by the last GEMM (x as its epilogue's C) and by the norm's
  -- backward or the dgrad GEMM (dy added to dx): a step of Residual(m) launches what m's does.
  -- Its values against the sums after m (lutra.add): the two differ by a bf16 rounding of m's
  -- output (NMSE ~1e-6).
  for _, kind in ipairs { "LayerNormMLP", "Linear" } do
    test("nn.Residual around " .. kind .. " adds no launch, and sums as lutra.add does", function()
      if DEV == "cpu" then return end -- launches: CUDA graphs' nodes
      local m = kind == "Linear" and nn.Linear(256, 256, { dtype = "bf16", device = DEV })
                or nn.LayerNormMLP(256, 512, { dtype = "bf16", device = DEV, seed = seed() })
      local res = nn.Residual(m)
      local _, x = input_pair({ 96, 256 })
      local _, dy = input_pair({ 96, 256 })
      local function nodes(step)
        local g = lutra.graph.capture(step, { warmup = 1 })
        local n = g:info()
        g:destroy()
        return n
      end
      local alone = nodes(function()
        m:forward(x)
        m:backward(dy)
      end)
      local wrapped = nodes(function()
        res:forward(x)
        res:backward(dy)
      end)
      assert.are.equal(alone, wrapped, "launches of a " .. kind .. " step and of its Residual's")
      local y = lutra.tensor({ 96, 256 }, "bf16", DEV):copy(res:forward(x))
      local dx = lutra.tensor({ 96, 256 }, "bf16", DEV):copy(res:backward(dy))
      check_nmse(y, lutra.add(x, m:forward(x)), 1e-5, "y")
      check_nmse(dx, lutra.add(dy, m:backward(dy)), 1e-5, "dx")
    end)
  end

  test("a captured forward + backward replays to the eager step's bits", function()
    if DEV == "cpu" then return end -- CUDA graphs need cuda
    local c, s = CASES[2], seed()
    local graphed, eager = layer(c, "bf16", DEV, s), layer(c, "bf16", DEV, s)
    local shape = { c.B, c.T, c.hidden }
    local _, x = input_pair(shape)
    local _, dy = input_pair(shape)
    local y, dx
    local g = lutra.graph.capture(function()
      y = graphed:forward(x)
      dx = graphed:backward(dy)
    end, { warmup = 1 })
    local _, deterministic = graphed:part("attention"):plans()
    for round = 1, 2 do
      local _, fx = input_pair(shape)
      local _, fdy = input_pair(shape)
      x:copy(fx)
      dy:copy(fdy)
      g:replay()
      local want_y = eager:forward(fx)
      assert.are.equal(want_y:bytes(), y:bytes(), "replay " .. round .. ": y differs from eager")
      local want_dx = eager:backward(fdy)
      if deterministic then
        assert.are.equal(want_dx:bytes(), dx:bytes(), "replay " .. round .. ": dx differs")
      else
        check_nmse(dx, want_dx, 1e-6, "replay " .. round .. ": dx")
      end
    end
    g:destroy()
  end)
end)
