-- The fused norm + FP8 cast (kernels/norm/norm_quantize.cu), nn.LayerNormLinear and nn.LayerNormMLP
-- on the device against the CPU backend.
--   1. On the device itself, lutra.norm_quantize is bit for bit the device's nn.LayerNorm output
--      quantized by the device's quantizer (codes of both copies, scale arrays, amax, scale,
--      amax history): the fused kernel repeats norm_fwd's statistics (thread split, vector width,
--      block_sum tree) and the quantizers' f32 order of operations, so the math is the same
--      order. Per recipe, LayerNorm/RMSNorm, f32/bf16, shapes with partial 128-blocks.
--   2. Device against the CPU reference: the row statistics are the same f32 sums in the same
--      order (norm_cpu.c row_sum); the bound allows mean and rstd an f32 ulp apart, which moves y
--      by an ulp and flips a code only where y * scale lies within an ulp of an FP8 rounding
--      boundary: at most 0.1% of the codes (and of the scales) may differ, and the dequantized
--      values (both copies) agree within NMSE 1e-6.
--   3. The modules, per recipe and without one, device against CPU: the same parameters and
--      inputs; y, dx and every gradient in NMSE. Without FP8: LayerNormLinear 1e-10 (f32) and
--      1e-5 (bf16), as norm_gpu.lua and modules_gpu.lua state for the pieces; LayerNormMLP 1e-6
--      and 1e-4, fusion_gpu.lua's bounds for an MLP (cuBLASLt's GELU epilogue and the CPU's differ
--      in ulps). With FP8: an ulp of mean/rstd (or of the GELU) can flip a code at a rounding
--      boundary, one FP8 step (~6% of that element): f32 1e-5 (LayerNormLinear, as modules_gpu's
--      Sequential under FP8) and 3e-4 (LayerNormMLP, two quantized activations: a code flipped in
--      the hidden activation reaches every dx element of its row through FC1's dgrad; swiglu
--      under current scaling was seen at 1.045e-4 in dx), bf16 1e-3 (fusion_gpu.lua's FP8
--      bound). The LayerNormMLP cases cover a gated activation (swiglu)
--      and the tanh GELU fused into FC1's epilogue.
local lutra = require("lutra")
local ffi = require("ffi")
local nn = lutra.nn
local C = lutra.C
local S = require("spec.gpu.support")
local FB = require("spec.support.fp8_bytes")
local N = require("spec.support.norm_modules")
local DEV, REF, hold = S.DEV, S.REF, S.hold
local function test(name, fn) S.test(it, name, fn) end

local RECIPES = N.RECIPES

-- a norm module on device dev with parameters from the seed (host-generated: equal on both)
local function norm_on(dev, rms, h, dtype, zc, seed)
  local m, g, b = N.new_norm(rms, h, { dtype = dtype, device = dev, zero_centered_gamma = zc }, seed)
  return hold(m), g, b
end

local function count_diff(a, b)
  local n = 0
  for i = 1, #a do if a:byte(i) ~= b:byte(i) then n = n + 1 end end
  return n
end

local function dequant(q, columnwise)
  local d = q:dims()
  local shape = columnwise and { d[2], d[1] } or d
  return lutra.dequantize(q, lutra.tensor(shape, "f32", q:device_name()), columnwise)
end

for _, rc in ipairs(RECIPES) do
  for _, rms in ipairs { false, true } do
    for _, dtype in ipairs { "f32", "bf16" } do
      local shapes = { { 256, 1024 }, { 64, 96 } }
      if rc.name ~= "mxfp8" then shapes[3] = { 208, 336 } end -- partial 128-blocks
      if rc.cfg.tensor then
        -- per-tensor's row-resident kernel with 64 and 128 KB of staged columnwise codes
        shapes[#shapes + 1] = { 48, 4096 }
        shapes[#shapes + 1] = { 16, 8192 }
        -- 16-bit matrices of 4M elements and more take the tile path (the statistics, with
        -- max|y| under current scaling, then the quantizer's tiles): rows of 4096 (current
        -- scaling's) and narrow rows (both recipes')
        if dtype == "bf16" then
          shapes[#shapes + 1] = { 1024, 4096 }
          shapes[#shapes + 1] = { 5472, 768 }
        end
      end
      for _, shape in ipairs(shapes) do
        local name = string.format("%s %s %s [%d, %d]", rc.name, rms and "RMSNorm" or "LayerNorm",
                                   dtype, shape[1], shape[2])
        describe("lutra.norm_quantize on " .. DEV, function()
          test(name .. ": bit for bit the device's norm output quantized", function()
            local seed = math.random(1, 2 ^ 30)
            local zc = seed % 2 == 0
            local norm, g, b = norm_on(DEV, rms, shape[2], dtype, zc, seed)
            local r = rc.make()
            local qf, qr = hold(lutra.quantizer(r, "input", { device = DEV })),
                           hold(lutra.quantizer(r, "input", { device = DEV }))
            local y = S.poisoned(shape, dtype, DEV)
            local opts = { rms = rms, zero_centered_gamma = zc, y = y }
            local function step(xseed)
              local x = lutra.tensor(shape, dtype, DEV):randn(xseed, 0.3, 1.7)
              return lutra.norm_quantize(qf, x, g, b, opts), qr:quantize(norm:forward(x)), x
            end
            step(seed + 7) -- the outputs hold another input's codes before the compared run
            local got, want = step(seed + 8)
            FB.same_snapshot(FB.snapshot(qf, got, rc.cfg), FB.snapshot(qr, want, rc.cfg), name)
            S.assert_same_tensor(y, norm:forward(lutra.tensor(shape, dtype, DEV)
                                                   :randn(seed + 8, 0.3, 1.7)), name .. ": y")
            if rc.cfg.delayed then
              qf:update()
              qr:update()
              got, want = step(seed + 9)
              FB.same_snapshot(FB.snapshot(qf, got, rc.cfg), FB.snapshot(qr, want, rc.cfg),
                               name .. " after an update")
            end
          end)

          test(name .. ": against the CPU reference (statistics' summation order)", function()
            local seed = math.random(1, 2 ^ 30)
            local out = {}
            for i, dev in ipairs { REF, DEV } do
              local _, g, b = norm_on(dev, rms, shape[2], dtype, false, seed)
              local q = hold(lutra.quantizer(rc.make(), "input", { device = dev }))
              local x = lutra.tensor(shape, dtype, dev):randn(seed + 3, 0.3, 1.7)
              out[i] = lutra.norm_quantize(q, x, g, b, { rms = rms })
            end
            for _, col in ipairs { false, true } do
              local what = name .. (col and " columnwise" or " rowwise")
              local a, bb = out[1]:bytes(col), out[2]:bytes(col)
              local n = count_diff(a, bb)
              assert.is_true(n <= math.max(2, #a * 1e-3),
                             string.format("%s: %d of %d codes differ", what, n, #a))
              local sa, sb = FB.scale_bytes(out[1], col), FB.scale_bytes(out[2], col)
              local ns = count_diff(sa, sb)
              assert.is_true(ns <= math.max(4, #sa * 1e-3),
                             string.format("%s: %d of %d scale bytes differ", what, ns, #sa))
              S.assert_nmse(dequant(out[2], col), dequant(out[1], col), 1e-6, what .. " values")
            end
          end)
        end)
      end
    end
  end
end

-- ---- modules -------------------------------------------------------------------------------

local function module_pair(make, seed)
  local a, b = hold(make(REF)), hold(make(DEV))
  local pa, pb = a:parameters(), b:parameters()
  for i = 1, #pa do
    pa[i].value:randn(seed + i, 0, 0.5)
    pb[i].value:randn(seed + i, 0, 0.5)
  end
  return a, b, pa, pb
end

-- NMSE bounds of the module cases (see the header)
local function bound(rc, dtype, mlp)
  if not rc.make then
    if dtype == "bf16" then return mlp and 1e-4 or 1e-5 end
    return mlp and 1e-6 or 1e-10
  end
  if dtype == "bf16" then return 1e-3 end
  return mlp and 3e-4 or 1e-5
end

local CASES = N.recipe_cases()

local MODULES = {
  { name = "LayerNormLinear LayerNorm", rows = 64, in_ = 256, out = 128,
    make = function(o) return nn.LayerNormLinear(256, 128, o) end },
  { name = "LayerNormLinear RMSNorm", rows = 64, in_ = 256, out = 128,
    make = function(o) o.normalization = "RMSNorm" return nn.LayerNormLinear(256, 128, o) end },
  { name = "LayerNormMLP swiglu", rows = 64, in_ = 128, out = 128, mlp = true,
    make = function(o) o.activation = "swiglu" return nn.LayerNormMLP(128, 256, o) end },
  { name = "LayerNormMLP gelu", rows = 64, in_ = 128, out = 128, mlp = true,
    make = function(o) o.activation = "gelu" return nn.LayerNormMLP(128, 256, o) end },
}

for _, md in ipairs(MODULES) do
  describe("nn." .. md.name .. " on " .. DEV, function()
    for _, rc in ipairs(CASES) do
      for _, dtype in ipairs { "f32", "bf16" } do
        local name = md.name .. " " .. rc.name .. " " .. dtype
        test(name .. ": forward and backward match the CPU, two steps", function()
          local seed = math.random(1, 2 ^ 30)
          local a, b, pa, pb = module_pair(function(dev)
            return md.make({ dtype = dtype, device = dev, seed = seed })
          end, seed)
          local recipes = { rc.make and rc.make() or nil, rc.make and rc.make() or nil }
          for step = 1, 2 do
            local xa, xb = S.randn_pair({ md.rows, md.in_ }, dtype, seed + 10 * step)
            local ga, gb = S.randn_pair({ md.rows, md.out }, dtype, seed + 10 * step + 1)
            local res = {}
            for i, m in ipairs { a, b } do
              local s = recipes[i] and lutra.autocast{ recipe = recipes[i] } or nil
              if s then s:enter() end
              local y = m:forward(i == 1 and xa or xb)
              local dx = m:backward(i == 1 and ga or gb)
              if s then s:exit() end
              res[i] = { y = y, dx = dx }
            end
            local what = name .. " step " .. step
            local bd = bound(rc, dtype, md.mlp)
            S.assert_nmse(res[2].y, res[1].y, bd, what .. ": y")
            S.assert_nmse(res[2].dx, res[1].dx, bd, what .. ": dx")
            for i = 1, #pa do S.assert_nmse(pb[i].grad, pa[i].grad, bd, what .. ": grad " .. i) end
          end
        end)
      end
    end
  end)
end

describe("nn.LayerNormLinear on " .. DEV .. ": the fused path is taken", function()
  test("every FP8 recipe but 128x128 input tiles writes the GEMM input from the norm", function()
    for _, rc in ipairs(RECIPES) do
      local m = hold(nn.LayerNormLinear(128, 64, { device = DEV, dtype = "bf16" }))
      local s = lutra.autocast{ recipe = rc.make() }
      s:enter()
      m:forward(lutra.tensor({ 64, 128 }, "bf16", DEV):randn(1))
      s:exit()
      assert.is_true(m:norm_fused(), rc.name)
    end
    assert.is_not_nil(ffi.cast("void *", C.lutra_norm_quantize))
  end)
end)

describe("nn.Residual on " .. DEV, function()
  -- make(hidden, dtype, dev) wrapped in a Residual on the reference and on DEV: y and dx the same
  local function check_residual(make, dtype, shape, what)
    local out = {}
    for i, dev in ipairs { REF, DEV } do
      local r = hold(nn.Residual(make(shape[2], dtype, dev)))
      local x = lutra.tensor(shape, dtype, dev):randn(shape[2] + 5)
      local dy = lutra.tensor(shape, dtype, dev):randn(shape[2] + 6)
      out[i] = { S.keep(r:forward(x)), r:backward(dy) }
    end
    what = what .. " " .. dtype .. " " .. shape[1] .. "x" .. shape[2]
    S.assert_same_tensor(out[2][1], out[1][1], what .. " y")
    S.assert_same_tensor(out[2][2], out[1][2], what .. " dx")
  end

  test("the sum is the CPU's bit for bit (one f32 addition rounded once)", function()
    for _, dtype in ipairs { "f32", "bf16", "f16" } do
      for _, shape in ipairs { { 64, 256 }, { 7, 13 } } do -- vector and scalar paths
        check_residual(function() return nn.ReLU() end, dtype, shape, "ReLU")
      end
    end
  end)

  -- around a norm the backward's sum is the norm kernel's (dx_add): the row kernels of every
  -- width class (a warp a row up to 256 columns, a block a row beyond), and the scalar path
  test("around a norm: dx + dy in the norm's backward kernel, the CPU's bit for bit", function()
    for _, kind in ipairs { "LayerNorm", "RMSNorm" } do
      local function make(h, dtype, dev) return nn[kind](h, { dtype = dtype, device = dev }) end
      for _, dtype in ipairs { "f32", "bf16" } do
        for _, shape in ipairs { { 96, 256 }, { 96, 768 }, { 33, 4096 }, { 7, 13 } } do
          check_residual(make, dtype, shape, kind)
        end
      end
    end
  end)
end)
