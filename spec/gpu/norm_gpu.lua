-- LayerNorm and RMSNorm on the device against the CPU backend: the same parameters and inputs on
-- both, output, input gradient and parameter gradients within NMSE bounds: 1e-10 for f32 (the
-- row sums and element formulas are the CPU's f32 sequence, so the bound is slack kept for a
-- sum order a future kernel may change), 1e-5 for bf16 (an ulp flip of a bf16 output). Shapes cover
-- the vector path (hidden % 8 == 0), the scalar path (odd hidden), several row blocks of the
-- dgamma/dbeta reduction (rows > 64), the row-resident kernels' widths and a wider row, threads
-- with unequal shares of a row and rows far from zero.
local lutra = require("lutra")
local nn = lutra.nn
local S = require("spec.gpu.support")
local DEV, REF, hold = S.DEV, S.REF, S.hold
local function test(name, fn) S.test(it, name, fn) end

local CASES = {
  { dtype = "f32", bound = 1e-10, rows = 300, hidden = 1024 },
  { dtype = "f32", bound = 1e-10, rows = 7, hidden = 77 },
  { dtype = "bf16", bound = 1e-5, rows = 300, hidden = 512 },
  { dtype = "bf16", bound = 1e-5, rows = 33, hidden = 100, zc = true },
  -- the row-resident kernels at their widths (2 and 4 vectors a thread: 64 and 128 KB of shared
  -- memory in the backward; f32 at 8 vectors) over many row blocks, and a row wider than they
  -- hold (the separate dx and column-sum kernels)
  { dtype = "bf16", bound = 1e-5, rows = 700, hidden = 4096 },
  { dtype = "bf16", bound = 1e-5, rows = 40, hidden = 8192, zc = true },
  { dtype = "f32", bound = 1e-10, rows = 20, hidden = 8192 },
  { dtype = "bf16", bound = 1e-5, rows = 9, hidden = 12288 },
  -- threads with unequal shares of a row (300 scalars over 256 threads, 257 vectors of 8), and
  -- rows far from zero (mean 1e3)
  { dtype = "f32", bound = 1e-10, rows = 50, hidden = 300 },
  { dtype = "bf16", bound = 1e-5, rows = 30, hidden = 2056 },
  { dtype = "f32", bound = 1e-10, rows = 64, hidden = 4096, mean = 1e3 },
}

for _, kind in ipairs { "LayerNorm", "RMSNorm" } do
  describe("nn." .. kind .. " on " .. DEV, function()
    for _, c in ipairs(CASES) do
      local name = string.format("%s [%d, %d]%s", c.dtype, c.rows, c.hidden,
                                 c.zc and " zero_centered_gamma" or "")
      test(name .. ": forward and backward match the CPU", function()
        local seed = math.random(1, 2 ^ 30)
        local opts = function(dev)
          return { dtype = c.dtype, device = dev, zero_centered_gamma = c.zc }
        end
        local ma, mb = hold(nn[kind](c.hidden, opts(REF))), hold(nn[kind](c.hidden, opts(DEV)))
        local pa, pb = ma:parameters(), mb:parameters()
        for i = 1, #pa do
          pa[i].value:randn(seed + 10 + i, i == 1 and not c.zc and 1 or 0, 0.3)
          pb[i].value:randn(seed + 10 + i, i == 1 and not c.zc and 1 or 0, 0.3)
        end
        local shape = { c.rows, c.hidden }
        local xa = lutra.tensor(shape, c.dtype, REF):randn(seed, c.mean or 0.5, 2)
        local xb = lutra.tensor(shape, c.dtype, DEV):randn(seed, c.mean or 0.5, 2)
        local ga = lutra.tensor(shape, c.dtype, REF):randn(seed + 1)
        local gb = lutra.tensor(shape, c.dtype, DEV):randn(seed + 1)
        S.assert_nmse(mb:forward(xb), ma:forward(xa), c.bound, name .. ": output")
        S.assert_nmse(mb:backward(gb), ma:backward(ga), c.bound, name .. ": input gradient")
        for i = 1, #pa do
          S.assert_nmse(pb[i].grad, pa[i].grad, c.bound, name .. ": param " .. i .. " grad")
        end
        -- the reduction is deterministic: a second backward gives the same bits
        local first = pb[1].grad:to_table()
        mb:backward(gb)
        assert.are.same(first, pb[1].grad:to_table(), "dgamma repeats bit for bit")
      end)
    end
  end)
end
