-- GPU ops against the CPU backend, as tables of cases over spec/support/op_harness.lua: tensors
-- (transfers, conversions, fills, random fills, amax) and GEMMs (f32, bf16 and FP8 operands in
-- layouts TN, NN, NT, with bias and accumulate). The quantizers and delayed-scaling histories
-- are spec/gpu/quantize_ops_gpu.lua.
--
-- The CPU backend is the reference: spec/quantize_spec.lua and friends check it bit for bit
-- against the format definitions, so here every operation is run on both devices on the same
-- inputs (random tensors are generated on the host from the seed, so the same seed gives the
-- same values on both devices: the harness checks that before each case) and compared:
--   - integer-valued results (bf16/f16 conversions, fills, amax, FP8 codes) are BIT-IDENTICAL
--     (a NaN only has to stay NaN where a conversion makes one: its payload is not specified);
--   - GEMM results are close in NMSE = ||dev - cpu||^2 / ||cpu||^2 (bounds at each table).
-- Outputs are poisoned with NaN before each run, so an element a kernel forgets to write shows
-- up as non-finite.
--
-- The device is LUTRA_TEST_DEVICE (default "cuda"; see spec/gpu/support.lua): "cpu" runs the
-- whole table CPU against CPU, a smoke test without a GPU.
local math, string, table, ipairs = math, string, table, ipairs
local lutra = require("lutra")
local ffi = require("ffi")
local C = lutra.C
local R = lutra.recipe

local S = require("spec.gpu.support")
local H = require("spec.support.op_harness")
local DEV, poisoned, buf_of, hold = S.DEV, S.poisoned, S.buf_of, S.hold
local ENV = { it = it, pending = pending }

local FLT_MAX = 3.4028234663852886e38
local NZERO = -0.0

-- ---- tensors ---------------------------------------------------------------------------------

-- edge values for conversions: RNE ties of bf16 and f16, overflow, subnormals, signed zero,
-- infinities, NaN, and the largest finite values
local function edge_values()
  local v = { 0, NZERO, 1, -1, 1 + 2 ^ -8, 1 + 3 * 2 ^ -8, -(1 + 2 ^ -8), 1 + 2 ^ -8 + 2 ^ -20,
              1 + 2 ^ -11, 1 + 3 * 2 ^ -11, 2 - 2 ^ -9, 65504, 65519, 65520, 70000, -70000,
              6.1e-5, 6e-8, 3e-8, 2.9e-8, 1e-7, -1e-7, 1e-40, -1e-40, 1.1754942e-38, FLT_MAX,
              -FLT_MAX, 3.3961775e38, 3.39e38, 1e30, -1e30, math.huge, -math.huge, 0 / 0,
              448, 449, 57344, 61440, 0.1, -0.3, 1 / 3, 2 ^ -126, 2 ^ -133, 2 ^ -149, 3.14159265 }
  local n = #v
  for i = 1, n do v[#v + 1] = v[i] * 0.7 end -- more rounding cases
  return v
end
local EDGE = edge_values()
local EDGE_BUF = buf_of(EDGE)

local T = {}
local function add(list, case) list[#list + 1] = case end

-- set/get of f32 is a plain transfer: both devices must give back the host's bits themselves
local BIG = { 997, 1009 }
add(T, { name = "set/get f32 round trip is bit-exact (NaN, inf, -0, subnormals, FLT_MAX)",
  run = function(dev)
    local n = #EDGE
    local t = lutra.tensor({ n }, "f32", dev):set(EDGE_BUF)
    -- a larger random buffer, read back through a reused buffer
    local hb = lutra.tensor(BIG, "f32", "cpu"):randn(11, 0, 3):read()
    local d = lutra.tensor(BIG, "f32", dev):set(hb)
    local out = ffi.new("float[?]", BIG[1] * BIG[2])
    ffi.fill(out, BIG[1] * BIG[2] * 4, 0xff) -- NaN: a word not read back stays visible
    d:read(out)
    return { ["get_f32 after set_f32"] = H.f32_blob(t:read(), n), ["bytes() after set_f32"] = t:bytes(),
             ["1M-element round trip"] = H.f32_blob(out, BIG[1] * BIG[2]),
             ["1M-element source"] = H.f32_blob(hb, BIG[1] * BIG[2]) }
  end,
  check = function(got)
    local src = ffi.string(EDGE_BUF, #EDGE * 4)
    -- get_f32 hands every NaN to the host as the one quiet NaN 0x7FC00000 (src/core/dtype.h:
    -- LuaJIT's NaN tags); bytes() gives the stored bits themselves
    local canonical = ffi.new("float[?]", #EDGE)
    for i = 0, #EDGE - 1 do canonical[i] = EDGE_BUF[i] end
    local words = ffi.cast("uint32_t *", canonical)
    for i = 0, #EDGE - 1 do
      if canonical[i] ~= canonical[i] then words[i] = 0x7FC00000 end
    end
    S.assert_same_bytes(got["get_f32 after set_f32"].bytes, ffi.string(canonical, #EDGE * 4),
                        "get_f32 after set_f32 vs the host (NaNs canonical)", 4)
    S.assert_same_bytes(got["bytes() after set_f32"], src, "bytes() after set_f32 vs the host", 4)
    S.assert_same_bytes(got["1M-element round trip"].bytes, got["1M-element source"].bytes,
                        "1M-element round trip vs the host", 4)
  end })

for _, dt in ipairs { "bf16", "f16" } do
  add(T, { name = "set_f32 into a 16-bit tensor and get_f32 back give the CPU's bits",
    params = { dtype = dt },
    inputs = function(dev, p) return { x = lutra.tensor({ #EDGE }, p.dtype, dev):set(EDGE_BUF) } end,
    inputs_compare = "bits_nan",
    run = function(_, x) return { ["get_f32"] = H.f32_blob(x.x:read(), #EDGE) } end,
    compare = "bits_nan" })
end

-- conversions run by the device's copy kernel: bit-exact (RNE), NaN stays NaN
local CONVERSIONS = { { "f32", "bf16" }, { "f32", "f16" }, { "bf16", "f32" }, { "f16", "f32" },
                      { "bf16", "f16" }, { "f16", "bf16" }, { "f32", "f32" },
                      { "bf16", "bf16" }, { "f16", "f16" } }
for _, cv in ipairs(CONVERSIONS) do
  for _, std in ipairs { "edge", 1e-3, 1, 300, 1e5 } do
    add(T, { name = "copy is bit-exact", params = { from = cv[1], to = cv[2], values = std },
      inputs = function(dev, p)
        if p.values == "edge" then return { x = lutra.tensor({ #EDGE }, p.from, dev):set(EDGE_BUF) } end
        return { x = lutra.tensor(BIG, p.from, dev):randn(77, 0, p.values) }
      end,
      inputs_compare = "bits_nan",
      run = function(dev, x, p) return { y = poisoned(x.x:dims(), p.to, dev):copy(x.x) } end,
      compare = "bits_nan" })
  end
end

for _, dt in ipairs { "f32", "bf16", "f16" } do
  for _, value in ipairs { 0, NZERO, 1.5, -3.25e-3, 1 + 2 ^ -8, 1e30, -math.huge, 1e-40, 0 / 0 } do
    add(T, { name = "fill writes the CPU's bits", params = { dtype = dt, value = value },
      run = function(dev, _, p)
        -- poisoned with a sentinel (not NaN: filling NaN must be seen to write)
        return { y = lutra.tensor({ 33, 65 }, p.dtype, dev):fill(-7.25):fill(p.value) }
      end,
      compare = "bits_nan" })
  end
end

for _, dt in ipairs { "f32", "bf16", "f16" } do
  for _, seed in ipairs { 0, 1, 42, 123456789 } do
    add(T, { name = "randn and uniform: the same seed gives the same values",
      params = { dtype = dt, seed = seed },
      run = function(dev, _, p)
        return { randn = lutra.tensor({ 64, 96 }, p.dtype, dev):randn(p.seed, 0.5, 2),
                 uniform = lutra.tensor({ 3, 100 }, p.dtype, dev):uniform(p.seed, -2, 5) }
      end })
  end
end
add(T, { name = "randn: different seeds give different values",
  run = function(dev)
    return { a = lutra.tensor({ 256 }, "f32", dev):randn(1), b = lutra.tensor({ 256 }, "f32", dev):randn(2) }
  end,
  check = function(got)
    assert.are_not.equal(got.a:bytes(), got.b:bytes(), "different seeds gave the same values")
  end })

for _, dt in ipairs { "f32", "bf16", "f16" } do
  for _, shape in ipairs { { 1 }, { 7, 13 }, BIG } do
    for _, std in ipairs { 1e-3, 300 } do
      add(T, { name = "amax is exact", params = { dtype = dt, shape = shape, std = std },
        inputs = function(dev, p)
          return { x = lutra.tensor(p.shape, p.dtype, dev):randn(500 + #p.shape + p.shape[1], -0.1 * p.std, p.std) }
        end,
        run = function(_, x) return { amax = S.amax_of(x.x) } end })
    end
  end
end
add(T, { name = "amax of a negative extreme and of zeros",
  inputs = function(dev) return { x = lutra.tensor({ 4 }, "f32", dev):set(buf_of { 1, -7.5, 3, 0 }) } end,
  run = function(dev, x)
    return { amax = S.amax_of(x.x), zeros = S.amax_of(lutra.tensor({ 5, 5 }, "f32", dev)) }
  end,
  check = function(got)
    assert.are.equal(7.5, got.amax)
    assert.are.equal(0, got.zeros)
  end })

describe("tensors on " .. DEV, function()
  H.run(T, ENV)

  -- device-only API facts (the device a tensor reports, a synchronize call): nothing to compare
  -- with the CPU, so a plain test
  S.test(it, "reshape, from_table and device synchronize", function()
    local t = lutra.from_table({ 1, 2, 3, 4, 5, 6 }, { 2, 3 }, "f32", DEV)
    assert.are.equal(DEV, t:device_name())
    t:reshape({ 3, 2 })
    assert.are.same({ 3, 2 }, t:dims())
    assert.are.same({ 1, 2, 3, 4, 5, 6 }, t:to_table())
    local st = C.lutra_device_synchronize(DEV == "cpu" and C.LUTRA_CPU or C.LUTRA_CUDA)
    assert.are.equal(0, st, ffi.string(C.lutra_last_error()))
    local labels = lutra.from_table({ 3, 1, 4, 1, 5 }, { 5 }, "i32", DEV)
    assert.are.equal("i32", labels:dtype_name())
  end)
end)

-- ---- GEMMs ---------------------------------------------------------------------------------

-- Stored shapes for D [m, n] = op(B) @ op(A) in TransformerEngine's layout names.
local GL = require("spec.support.gemm_layouts")
local LAYOUTS, LAYOUT_ORDER = GL.LAYOUTS, GL.ORDER

-- epilogues: bias (of D's dtype unless given) and accumulate (D starts from random values,
-- the same on both devices; otherwise D is poisoned with NaN)
local EPILOGUES = {
  { name = "plain" }, { name = "bias", bias = true }, { name = "accumulate", acc = true },
  { name = "bias+accumulate", bias = true, acc = true },
}

-- runs the GEMM on one device; operands are that device's tensors
local function gemm_on(device, A, ta, B, tb, m, n, ddt, epi, seed)
  local D
  if epi.acc then
    D = lutra.tensor({ m, n }, ddt, device):randn(seed + 1, 0, 2)
  else
    D = poisoned({ m, n }, ddt, device)
  end
  local bias
  if epi.bias then bias = lutra.tensor({ n }, epi.bias_dtype or ddt, device):randn(seed + 2, 0.5, 1) end
  lutra.gemm(A, ta, B, tb, D, bias, epi.acc)
  return D
end

-- inputs A and B of a layout, random from the seed
local function operands(dev, L, m, n, k, odt, seed, stdb, mean)
  return { A = lutra.tensor(L.a(m, n, k), odt, dev):randn(seed, mean or 0, 1),
           B = lutra.tensor(L.b(m, n, k), odt, dev):randn(seed + 10, mean or 0, stdb or 1) }
end

-- Bounds: f32 D: NMSE <= 1e-10. Operands are identical and the GPU accumulates in f32 (cuBLASLt
-- runs true f32 for f32 operands here, not TF32: TF32 would measure ~1e-7), so only the
-- summation order differs: ~k * 2^-48 relative per element, ~1e-13 measured-scale for k = 1024.
-- bf16 D: NMSE <= 2e-5: the f32 results are rounded to bf16 (2^-9 relative); an element whose
-- f32 values fall on either side of a rounding boundary differs by one bf16 ulp (measured
-- 1.1e-5 at worst).
local function hp_bound(ddt) return ddt == "f32" and 1e-10 or 2e-5 end
local G = {}
local HP_SHAPES = { { 128, 96, 160 }, { 33, 45, 71 }, { 192, 320, 1024 } }
for _, lname in ipairs(LAYOUT_ORDER) do
  for _, odt in ipairs { "f32", "bf16" } do
    for _, ddt in ipairs { "f32", "bf16" } do
      for si, s in ipairs(HP_SHAPES) do
        add(G, { name = "GEMM plain, bias, accumulate, bias+accumulate",
          params = { layout = lname, operands = odt, D = ddt, mnk = s, seed = 7000 + 100 * si },
          inputs = function(dev, p)
            return operands(dev, LAYOUTS[p.layout], s[1], s[2], s[3], p.operands, p.seed)
          end,
          run = function(dev, x, p)
            local L, out = LAYOUTS[p.layout], {}
            for _, epi in ipairs(EPILOGUES) do
              out[epi.name] = gemm_on(dev, x.A, L.ta, x.B, L.tb, s[1], s[2], p.D, epi, p.seed + 20)
            end
            return out
          end,
          compare = { nmse = hp_bound(ddt) } })
      end
    end
  end
end

for _, c in ipairs { { ddt = "f32", bdt = "bf16" }, { ddt = "bf16", bdt = "f32" } } do
  add(G, { name = "GEMM TN with a bias of another dtype than D", params = { D = c.ddt, bias = c.bdt },
    inputs = function(dev) return { A = lutra.tensor({ 96, 128 }, "bf16", dev):randn(31),
                                    B = lutra.tensor({ 64, 128 }, "bf16", dev):randn(32, 0, 1) } end,
    run = function(dev, x, p)
      local out = {}
      for _, acc in ipairs { false, true } do
        local epi = { bias = true, bias_dtype = p.bias, acc = acc }
        out["accumulate " .. tostring(acc)] = gemm_on(dev, x.A, true, x.B, false, 64, 96, p.D, epi, 33)
      end
      return out
    end,
    compare = { nmse = hp_bound(c.ddt) } })
end

-- k = 4096 with a large mean: TF32 (10-bit mantissa inputs) would give NMSE ~1e-7 here
add(G, { name = "f32 GEMMs run in true f32 (NMSE far below TF32's)", params = { mnk = { 128, 128, 4096 } },
  inputs = function(dev) return { A = lutra.tensor({ 128, 4096 }, "f32", dev):randn(41, 0.5, 1),
                                  B = lutra.tensor({ 128, 4096 }, "f32", dev):randn(42, 0.5, 1) } end,
  run = function(dev, x)
    return { D = gemm_on(dev, x.A, true, x.B, false, 128, 128, "f32", EPILOGUES[1], 43) }
  end,
  compare = { nmse = 1e-10 } })

-- FP8 operands: two tensors quantized on both devices (rowwise + columnwise), whose codes must be
-- bit-identical; NN and NT use the columnwise copies (Hopper runs FP8 only as TN). The CPU
-- dequantizes and runs an f32 GEMM; the GPU runs cuBLASLt's FP8 GEMM (per-tensor scales) or
-- dequantizes MXFP8 / block operands to bf16 and runs a bf16 GEMM, both accumulating in f32.
-- Bound NMSE <= 1e-6 for f32 and bf16 D: the products are the same, only accumulation differs
-- (Hopper's FP8 MMA keeps fewer accumulator bits between f32 promotions, ~2^-14 relative, NMSE
-- ~1e-8 at most). Dequantizing to bf16 is exact for power-of-2 scales (MXFP8's E8M0, block with
-- power_2_scale); for block scaling WITHOUT power_2_scale each dequantized operand is rounded to
-- bf16 (relative error <= 2^-9, RMS ~1.1e-3 per operand), NMSE ~2.6e-6 over a random-sign sum:
-- bound 2e-5. bf16 D with bias and accumulate: cuBLASLt adds C and the bias in another order
-- than the CPU's single rounding, so values near a rounding boundary move by one bf16 ulp
-- (measured on the H200: NMSE ~6e-6): bound 2e-5 for every bf16 D.
local KINDS = {
  { name = "current", make = function() return R.current() end, bound = 1e-6 },
  { name = "current power_2_scale", make = function() return R.current { power_2_scale = true } end, bound = 1e-6 },
  { name = "mxfp8", make = function() return R.mxfp8 { fp8_format = "hybrid" } end, bound = 1e-6 },
  { name = "block (1x128 x 128x128, power_2_scale)", make = function() return R.block { fp8_format = "hybrid" } end, bound = 1e-6 },
  { name = "block without power_2_scale", make = function() return R.block { fp8_format = "hybrid", power_2_scale = false } end, bound = 2e-5 },
}
-- (m, n, k, dtype of the tensors quantized into the operands)
local FP8_SHAPES = { { 64, 96, 160, "f32" }, { 64, 96, 160, "bf16" }, { 256, 384, 512, "f32" } }

-- quantizes A and B with roles of r on dev: the FP8 tensors and their codes as outputs
local function fp8_operands(dev, r, roles, A, B, out)
  local qA = hold(lutra.quantizer(r, roles[1], { device = dev }))
  local qB = hold(lutra.quantizer(r, roles[2], { device = dev }))
  local fa, ga = qA:quantize(A), qB:quantize(B)
  out["A codes"], out["A columnwise codes"] = fa:bytes(false), fa:bytes(true)
  out["B codes"], out["B columnwise codes"] = ga:bytes(false), ga:bytes(true)
  return fa, ga
end
for ki, kind in ipairs(KINDS) do
  for _, lname in ipairs(LAYOUT_ORDER) do
    for si, s in ipairs(FP8_SHAPES) do
      local L = LAYOUTS[lname]
      add(G, { name = "FP8 GEMM, f32 and bf16 D, bias and accumulate",
        params = { recipe = kind.name, layout = lname .. " (A " .. L.roles[1] .. ", B " .. L.roles[2] .. ")",
                   mnk = { s[1], s[2], s[3] }, operands = s[4] },
        inputs = function(dev) return operands(dev, L, s[1], s[2], s[3], s[4], 8000 + 100 * si, 0.1) end,
        run = function(dev, x)
          local out = {}
          local fa, ga = fp8_operands(dev, kind.make(), L.roles, x.A, x.B, out)
          for _, ddt in ipairs { "f32", "bf16" } do
            for _, epi in ipairs { EPILOGUES[1], EPILOGUES[4] } do
              out[ddt .. " D, " .. epi.name] = gemm_on(dev, fa, L.ta, ga, L.tb, s[1], s[2], ddt, epi,
                                                        8000 + 100 * si + 20)
            end
          end
          return out
        end,
        compare = function(label)
          if label:find("codes", 1, true) then return "bytes" end
          local bound = KINDS[ki].bound
          return { nmse = label:sub(1, 4) == "bf16" and math.max(bound, 2e-5) or bound }
        end })
    end
  end
end

for _, roles in ipairs { { "weight", "input" }, { "weight", "grad_output" }, { "grad_output", "input" } } do
  add(G, { name = "FP8 TN with E4M3 and E5M2 operands (current scaling)",
    params = { A = roles[1], B = roles[2] },
    inputs = function(dev) return { A = lutra.tensor({ 64, 256 }, "f32", dev):randn(61, 0, 1),
                                    B = lutra.tensor({ 128, 256 }, "f32", dev):randn(62, 0, 3) } end,
    run = function(dev, x)
      local out = {}
      local fa, ga = fp8_operands(dev, R.current(), roles, x.A, x.B, out)
      out.dtypes = fa:dtype_name() .. " x " .. ga:dtype_name()
      for _, ddt in ipairs { "f32", "bf16" } do
        out[ddt .. " D"] = gemm_on(dev, fa, true, ga, false, 128, 64, ddt, EPILOGUES[1], 63)
      end
      return out
    end,
    compare = function(label)
      if label == "dtypes" or label:find("codes", 1, true) then return "bytes" end
      return { nmse = 1e-6 }
    end })
end

describe("GEMM on " .. DEV, function()
  H.run(G, ENV)
end)
