-- The inference forward (grad = false) on the device: against the CPU backend (NMSE: the CPU and
-- cuBLASLt accumulate in another order) and against the device's own training forward (two
-- Linears from the same seed: the rowwise-only casts write the codes the cast + transpose
-- kernels write, bit for bit, and the GEMM is the same plan, so the outputs are the same bits);
-- no columnwise copy made on the device; train and eval batch sizes alternating with stable
-- buffer addresses.
local lutra = require("lutra")
local ffi = require("ffi")
local nn, R = lutra.nn, lutra.recipe
local S = require("spec.gpu.support")
local DEV, REF, hold = S.DEV, S.REF, S.hold
local function test(name, fn) S.test(it, name, fn) end

local RECIPES = {
  { name = "bf16" },
  { name = "FP8 delayed", make = function() return R.delayed {} end },
  { name = "FP8 current", make = function() return R.current {} end },
  { name = "FP8 mxfp8", make = function() return R.mxfp8 {} end },
  { name = "FP8 block", make = function() return R.block {} end },
}

local function forward(m, x, rec, grad)
  local y
  local opts = { grad = grad }
  if rec.make then
    lutra.autocast { recipe = rec.make() }:run(function() y = m:forward(x, opts) end)
  else
    y = m:forward(x, opts)
  end
  return y
end

local function addr(p) return tonumber(ffi.cast("uintptr_t", p)) end

describe("inference forward on " .. DEV, function()
  for _, rec in ipairs(RECIPES) do
    test(rec.name .. ": Linear inference equals the device's training forward and the CPU's", function()
      local seed = math.random(1, 2 ^ 20)
      local IN, OUT, N = 256, 128, 128
      local a = hold(nn.Linear(IN, OUT, { dtype = "bf16", device = DEV, seed = 7 }))
      local b = hold(nn.Linear(IN, OUT, { dtype = "bf16", device = DEV, seed = 7 }))
      local c = hold(nn.Linear(IN, OUT, { dtype = "bf16", device = REF, seed = 7 }))
      local xd = lutra.tensor({ N, IN }, "bf16", DEV):randn(seed)
      local xc = lutra.tensor({ N, IN }, "bf16", REF):randn(seed)
      local yi = forward(a, xd, rec, false)
      local yt = forward(b, xd, rec, true)
      local yc = forward(c, xc, rec, false)
      assert.are.same(yt:to_table(), yi:to_table(), "inference vs training on the device")
      S.assert_nmse(yi, yc, 1e-4, rec.name .. ": against the CPU")
      if rec.make then
        for _, role in ipairs { "input", "weight" } do
          assert.is_true(a:quantized(role).col_data == nil, role .. ": no columnwise copy")
          assert.is_true(b:quantized(role).col_data ~= nil, role .. ": training has one")
        end
      end
      local ok, err = pcall(function() a:backward(lutra.tensor({ N, OUT }, "bf16", DEV)) end)
      assert.is_false(ok)
      assert.matches("grad = false (inference)", tostring(err), 1, true)
    end)
  end

  test("Sequential(Linear, SwiGLU, Linear), FP8 delayed: train and eval batches alternate on stable buffers", function()
    local l1 = nn.Linear(128, 256, { dtype = "bf16", device = DEV, seed = 3 })
    local l2 = nn.Linear(128, 64, { dtype = "bf16", device = DEV, seed = 4 })
    local seq = hold(nn.Sequential(l1, nn.SwiGLU(), l2))
    local seen = {}
    local function note(key, p)
      if seen[key] == nil then seen[key] = addr(p) end
      assert.are.equal(seen[key], addr(p), key .. ": the buffer moved")
    end
    local rec = RECIPES[2]
    for round = 1, 3 do
      local yt = forward(seq, lutra.tensor({ 128, 128 }, "bf16", DEV):randn(round), rec, true)
      seq:backward(lutra.tensor({ 128, 64 }, "bf16", DEV):randn(round + 5))
      note("train y", yt.data)
      note("train q(x)", l2:quantized("input").data)
      local ye = forward(seq, lutra.tensor({ 32, 128 }, "bf16", DEV):randn(round + 9), rec, false)
      note("eval y", ye.data)
      note("eval q(x)", l2:quantized("input").data)
      assert.is_true(l2:quantized("input").col_data == nil)
      assert.are.equal(128 * 64, #yt:to_table())
    end
  end)
end)
