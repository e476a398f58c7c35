-- Activation modules (src/nn/activation.c) on the GPU against the CPU backend, as a table of
-- cases over spec/support/op_harness.lua: every kind, forward y and backward dx, f32/bf16/f16,
-- shapes that take the vectorized path (16-byte aligned, a multiple of the vector width) and
-- ones that do not (odd sizes; gated halves h = 13 start at any element offset).
--
-- kernels/activation/activation_math.cuh is src/backend/cpu/activation_cpu.c operation for
-- operation, so
--   - ReLU, SquaredReLU and ReGLU (comparisons, products, no transcendental) are BIT-IDENTICAL;
--   - the sigmoid kinds (SiLU, QuickGELU, SwiGLU), the tanh GELU and GeGLU round CUDA's expf,
--     the erf GELU CUDA's erff as well, Tanh CUDA's tanhf and expf; those are within 2 ulp of
--     libm's but not always the same bits, so they are compared by NMSE: f32 1e-12 (a few ulps, ~1e-7 relative, on some
--     elements), bf16/f16 1e-5 (where that moves a value across a rounding boundary, one ulp of
--     the 16-bit format: 2^-8 / 2^-11 relative, on a small fraction of elements).
-- Outputs are the modules' own buffers, so they are not poisoned; NMSE fails on a non-finite
-- element, and the exact kinds compare every byte.
local lutra = require("lutra")
local nn = lutra.nn

local S = require("spec.gpu.support")
local H = require("spec.support.op_harness")
local DEV, hold = S.DEV, S.hold
local ENV = { it = it, pending = pending }

local KINDS = {
  { name = "ReLU", new = nn.ReLU, exact = true },
  { name = "SquaredReLU", new = nn.SquaredReLU, exact = true },
  { name = "ReGLU", new = nn.ReGLU, exact = true, gated = true },
  { name = "GELU tanh", new = nn.GELU },
  { name = "GELU erf", new = function() return nn.GELU({ approximate = "none" }) end },
  { name = "SiLU", new = nn.SiLU },
  { name = "Tanh", new = nn.Tanh },
  { name = "QuickGELU", new = nn.QuickGELU },
  { name = "SwiGLU", new = nn.SwiGLU, gated = true },
  { name = "GeGLU", new = nn.GeGLU, gated = true },
}

local BOUND = { f32 = 1e-12, bf16 = 1e-5, f16 = 1e-5 }

local T = {}
for _, k in ipairs(KINDS) do
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    local shapes = k.gated and { { 5, 26 }, { 64, 256 } } or { { 7, 13 }, { 64, 96 } }
    for _, shape in ipairs(shapes) do
      T[#T + 1] = {
        name = k.name .. " forward and backward",
        params = { dtype = dt, shape = shape },
        inputs = function(dev, p)
          local yshape = { p.shape[1], k.gated and p.shape[2] / 2 or p.shape[2] }
          return { x = lutra.tensor(p.shape, p.dtype, dev):randn(301 + p.shape[2], 0, 2),
                   dy = lutra.tensor(yshape, p.dtype, dev):randn(302 + p.shape[2], 0, 1) }
        end,
        run = function(_, x)
          local m = hold(k.new())
          -- twice: the second run reuses the module's buffers
          m:forward(x.x)
          local y = m:forward(x.x)
          local dx = m:backward(x.dy)
          return { y = y, dx = dx }
        end,
        compare = (not k.exact) and { nmse = BOUND[dt] } or nil,
      }
    end
  end
end

describe("activations on " .. DEV, function()
  H.run(T, ENV)
end)
