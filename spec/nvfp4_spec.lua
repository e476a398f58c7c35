-- NVFP4 quantization (lutra/nvfp4.h, src/backend/cpu/nvfp4_cpu.c) against an independent
-- reference (spec/support/nvfp4_ref.lua: FP64 rounding to the E2M1 grid, f32 steps emulated):
-- codes, block scales and the decode scale byte for byte for 1x16 blocks, 16x16 tiles, the RHT
-- copy and stochastic rounding; the error bound of quantize -> dequantize; stochastic rounding
-- unbiased and reproducible; the RHT orthogonal and neutral for the wgrad GEMM.
local lutra = require("lutra")
local ffi = require("ffi")
local ref = require("spec.support.nvfp4_ref")
local C = lutra.C
local R = lutra.recipe

-- a [rows, cols] f32 tensor of N(0,1) values whose rows and 16-column blocks have magnitudes
-- 2^-6 .. 2^6 apart (so block scales differ), and its values
local function spread(rows, cols, seed)
  local v = lutra.tensor({ rows, cols }):randn(seed, 0, 1):to_table()
  for r = 0, rows - 1 do
    for c = 1, cols do
      v[r * cols + c] = ref.r32(v[r * cols + c] * 2 ^ ((r * 7 + math.floor((c - 1) / 16) * 3) % 13 - 6))
    end
  end
  return lutra.from_table(v, { rows, cols }), v
end

local function check_copy(t, columnwise, lines, len, codes, scales, dec, what)
  assert.are.equal(ref.pack(codes, #lines * len), t:bytes(columnwise), what .. " codes")
  local sc, d = ref.read_scales(columnwise and t.col_scale_inv or t.scale_inv, #lines, len)
  for i = 0, #lines * len / 16 - 1 do assert.are.equal(scales[i], sc[i], what .. " scale " .. i) end
  assert.are.equal(dec, d, what .. " decode scale")
end

describe("NVFP4", function()
  it("decodes every E2M1 code and encodes a dense sweep as the FP64 reference", function()
    for c = 0, 15 do
      assert.are.equal(ref.e2m1_value(c), C.lutra_decode(C.LUTRA_E2M1, c), "code " .. c)
    end
    local n = 0
    -- every 4 ulps of bf16's grid over [-8, 8] plus the midpoints and specials
    for i = -8 * 4096, 8 * 4096 do
      local v = i / 4096
      assert.are.equal(ref.e2m1(v), C.lutra_encode(C.LUTRA_E2M1, v), "value " .. v)
      n = n + 1
    end
    for _, v in ipairs { 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6, 6.5, 1e30, -0.25, -5, -1e-45 } do
      assert.are.equal(ref.e2m1(v), C.lutra_encode(C.LUTRA_E2M1, v), "value " .. v)
    end
    assert.are.equal(7, C.lutra_encode(C.LUTRA_E2M1, 0 / 0))
    assert.are.equal(7, C.lutra_encode(C.LUTRA_E2M1, math.huge))
    assert.are.equal(15, C.lutra_encode(C.LUTRA_E2M1, -math.huge))
    assert.are.equal(8, C.lutra_encode(C.LUTRA_E2M1, -0.0))
    assert.is_true(n > 60000)
  end)

  it("quantizes 1x16 blocks (rowwise) and the RHT columnwise copy byte for byte", function()
    local rows, cols = 48, 64
    local x, v = spread(rows, cols, 11)
    local q = lutra.quantizer(R.nvfp4(), "input")
    local xq = q:quantize(x)
    assert.are.equal("e2m1", xq:dtype_name())
    assert.are.equal("nvfp4", xq:scaling_name())
    local codes, scales, dec = ref.copy(ref.rows_of(v, rows, cols))
    check_copy(xq, false, ref.rows_of(v, rows, cols), cols, codes, scales, dec, "rowwise")
    local cl = ref.rht_lines(ref.cols_of(v, rows, cols), C.LUTRA_NVFP4_TE_SIGNS)
    codes, scales, dec = ref.copy(cl)
    check_copy(xq, true, cl, rows, codes, scales, dec, "columnwise (RHT)")
    -- without the RHT the columnwise copy quantizes x's columns as they are
    local plain = lutra.quantizer(R.nvfp4 { disable_rht = true }, "input"):quantize(x)
    local pl = ref.cols_of(v, rows, cols)
    codes, scales, dec = ref.copy(pl)
    check_copy(plain, true, pl, rows, codes, scales, dec, "columnwise")
    -- bf16 input: the same as its values in f32
    local xb = lutra.tensor({ rows, cols }, "bf16"):copy(x)
    local vb = xb:to_table()
    codes, scales, dec = ref.copy(ref.rows_of(vb, rows, cols))
    check_copy(q:quantize(xb), false, ref.rows_of(vb, rows, cols), cols, codes, scales, dec, "bf16")
  end)

  it("gives 2D (weight) tiles one scale per 16x16 tile; the columnwise copy is the transpose",
     function()
    local rows, cols = 32, 48
    local x, v = spread(rows, cols, 12)
    local wq = lutra.quantizer(R.nvfp4(), "weight"):quantize(x)
    local lines = ref.rows_of(v, rows, cols)
    local codes, scales, dec = ref.copy(lines, { tiles = true })
    check_copy(wq, false, lines, cols, codes, scales, dec, "tiles")
    local sc = ref.read_scales(wq.scale_inv, rows, cols)
    local csc = ref.read_scales(wq.col_scale_inv, cols, rows)
    local distinct = {}
    for r = 0, rows - 1 do
      for b = 0, cols / 16 - 1 do
        local tile = sc[math.floor(r / 16) * 16 * (cols / 16) + b]
        assert.are.equal(tile, sc[r * (cols / 16) + b], "row " .. r .. " block " .. b)
        distinct[tile] = true
        for c = b * 16, b * 16 + 15 do
          assert.are.equal(tile, csc[c * (rows / 16) + math.floor(r / 16)], "column scale")
        end
      end
    end
    assert.is_true(next(distinct, next(distinct)) ~= nil, "the tiles should differ in scale")
    local t = {}
    for c = 0, cols - 1 do for r = 0, rows - 1 do t[c * rows + r] = codes[r * cols + c] end end
    assert.are.equal(ref.pack(t, rows * cols), wq:bytes(true))
  end)

  it("dequantizes within the format's bound: |x - x'| <= max(|x|, block scale) / 4", function()
    -- E2M1's gaps are 0.5 below 2, 1 to 4 and 2 to 6: half a gap is at most |v| / 4 for |v| >= 1
    -- and 0.25 below; a block scale that rounds down may saturate its largest value by 1/16
    local rows, cols = 64, 64
    local x, v = spread(rows, cols, 13)
    local xq = lutra.quantizer(R.nvfp4(), "input"):quantize(x)
    local d = lutra.tensor({ rows, cols })
    lutra.dequantize(xq, d)
    local sc, dec = ref.read_scales(xq.scale_inv, rows, cols)
    local worst = 0
    for i, got in ipairs(d:to_table()) do
      local bs = C.lutra_decode(C.LUTRA_E4M3, sc[math.floor((i - 1) / 16)]) * dec
      local bound = math.max(math.abs(v[i]), bs) / 4 * (1 + 1e-6)
      local err = math.abs(got - v[i])
      assert.is_true(err <= bound, string.format("element %d: %g vs %g (bound %g)", i, got, v[i], bound))
      worst = math.max(worst, err / bound)
    end
    assert.is_true(worst > 0.5, "the bound should be nearly reached somewhere (worst " .. worst .. ")")
  end)

  it("rounds stochastically: the reference's codes, unbiased, reproducible for a seed", function()
    local rows, cols = 16, 32
    local x, v = spread(rows, cols, 14)
    local recipe = R.nvfp4 { seed = 77 }
    local q = lutra.quantizer(recipe, "grad_output")
    local lines = ref.rows_of(v, rows, cols)
    local sums, draws = {}, 400
    for i = 1, rows * cols do sums[i] = 0 end
    local first
    local d = lutra.tensor({ rows, cols })
    for n = 0, draws - 1 do
      local xq = q:quantize(x)
      if n < 3 then
        local codes, scales, dec = ref.copy(lines, { sr = ref.call_seed(77, n) })
        check_copy(xq, false, lines, cols, codes, scales, dec, "SR call " .. n)
      end
      if n == 0 then first = xq:bytes(false) end
      lutra.dequantize(xq, d)
      for i, got in ipairs(d:to_table()) do sums[i] = sums[i] + got end
    end
    -- a fresh quantizer of the same recipe repeats the sequence; another seed does not
    assert.are.equal(first, lutra.quantizer(recipe, "grad_output"):quantize(x):bytes(false))
    assert.are_not.equal(first, lutra.quantizer(R.nvfp4 { seed = 78 }, "grad_output")
                                  :quantize(x):bytes(false))
    -- unbiased: each mean within 5 sigma of x (sigma <= gap / 2 per draw, gap <= 2 block scales)
    local xq = q:quantize(x)
    local sc, dec = ref.read_scales(xq.scale_inv, rows, cols)
    local rne = lutra.tensor({ rows, cols })
    lutra.dequantize(lutra.quantizer(R.nvfp4 { disable_stochastic_rounding = true }, "grad_output")
                       :quantize(x), rne)
    local rv, biased = rne:to_table(), 0
    for i = 1, rows * cols do
      local bs = C.lutra_decode(C.LUTRA_E4M3, sc[math.floor((i - 1) / 16)]) * dec
      local sigma = bs * 1.0
      local mean = sums[i] / draws
      -- a block scale rounded down to E4M3 can put a block's largest value up to 6 * 17/16:
      -- saturated at 6, biased low by design (as in TE); every other value is unbiased
      if math.abs(v[i]) <= 6 * bs then
        assert.is_true(math.abs(mean - v[i]) <= 5 * sigma / math.sqrt(draws) + 1e-30,
                       string.format("element %d: mean %g, x %g", i, mean, v[i]))
      end
      if math.abs(rv[i] - v[i]) > 5 * sigma / math.sqrt(draws) then biased = biased + 1 end
    end
    assert.is_true(biased > rows * cols / 4, "RNE should be biased where SR is not: " .. biased)
  end)

  it("has an orthogonal RHT that leaves the wgrad GEMM unchanged", function()
    local x = lutra.tensor({ 8, 64 }):randn(21, 0, 3)
    local y = lutra.nvfp4.rht(x)
    local back = lutra.nvfp4.rht(y, nil, true)
    local xv, yv, bv = x:to_table(), y:to_table(), back:to_table()
    local nx, ny = 0, 0
    for i = 1, #xv do
      -- 16 f32 additions of values up to |x|: a few ulps of the block's largest value
      assert.is_true(math.abs(bv[i] - xv[i]) <= 1e-5 * 3 * 6, "element " .. i)
      nx, ny = nx + xv[i] ^ 2, ny + yv[i] ^ 2
    end
    assert.is_true(math.abs(nx - ny) <= 1e-5 * nx, "norms " .. nx .. " " .. ny)
    -- the transform of each unit vector is a row of diag(s) H / 4
    local e = {}
    for i = 1, 16 * 16 do e[i] = 0 end
    for i = 0, 15 do e[i * 16 + i + 1] = 1 end
    local h = lutra.nvfp4.rht(lutra.from_table(e, { 16, 16 })):to_table()
    local s = C.LUTRA_NVFP4_TE_SIGNS
    for i = 0, 15 do
      for j = 0, 15 do
        local want = (bit.band(bit.rshift(s, i), 1) == 1 and -1 or 1) *
                     (ref.popcount(bit.band(i, j)) % 2 == 1 and -1 or 1) / 4
        assert.are.equal(want, h[i * 16 + j + 1])
      end
    end
    -- wgrad: sum_t dy[o, t] x[i, t] (the columnwise copies, t along rows) with both transformed
    local T, O, I = 64, 8, 12
    local dyt, xt = lutra.tensor({ O, T }):randn(22), lutra.tensor({ I, T }):randn(23)
    local a, b = dyt:to_table(), xt:to_table()
    local ar, br = lutra.nvfp4.rht(dyt):to_table(), lutra.nvfp4.rht(xt):to_table()
    for o = 0, O - 1 do
      for i = 0, I - 1 do
        local exact, got, mag = 0, 0, 0
        for t = 1, T do
          exact = exact + a[o * T + t] * b[i * T + t]
          got = got + ar[o * T + t] * br[i * T + t]
          mag = mag + math.abs(a[o * T + t] * b[i * T + t])
        end
        assert.is_true(math.abs(got - exact) <= 1e-5 * mag, "dW[" .. o .. "," .. i .. "]")
      end
    end
  end)

  it("stores 0.5 byte per code, and the decode scale after the block scales", function()
    local x = lutra.tensor({ 64, 128 }):randn(1)
    local xq = lutra.quantizer(R.nvfp4 { disable_rht = true }, "input"):quantize(x)
    assert.are.equal(64 * 128 / 2, #xq:bytes(false))
    assert.are.equal(64 * 128 / 2, #xq:bytes(true))
    local amax = x:absmax()
    local _, dec = ref.read_scales(xq.scale_inv, 64, 128)
    local _, cdec = ref.read_scales(xq.col_scale_inv, 128, 64)
    assert.are.equal(ref.r32(1 / ref.r32(2688 / amax)), dec)
    assert.are.equal(dec, cdec)
  end)
end)
