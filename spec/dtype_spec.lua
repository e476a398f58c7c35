-- Scalar conversions (lutra_encode / lutra_decode): the bit-exact reference every backend
-- follows. The FP8 codes are checked against a decoder written here from the format
-- definitions, bit for bit.
local ffi = require("ffi")
local bit = require("bit")
local lutra = require("lutra")
local C = lutra.C

local E4M3, E5M2, E8M0 = C.LUTRA_E4M3, C.LUTRA_E5M2, C.LUTRA_E8M0
local BF16, F16, F32 = C.LUTRA_BF16, C.LUTRA_F16, C.LUTRA_F32

local pun = ffi.new("union { uint32_t u; float f; }")

-- The f32 with the given bit pattern, as a Lua number (exact: every f32 is a double).
local function f32(u)
  pun.u = u
  return pun.f
end

-- The bit pattern of a number rounded to f32.
local function bits(x)
  pun.f = x
  return tonumber(pun.u)
end

local function encode(dtype, x) return tonumber(C.lutra_encode(dtype, x)) end
local function decode(dtype, u) return C.lutra_decode(dtype, u) end
local function isnan(x) return x ~= x end

-- Independent decoder from the format definitions.
local formats = {
  [E4M3] = { name = "e4m3", ebits = 4, mbits = 3, bias = 7, max_code = 0x7E, max = 448 },
  [E5M2] = { name = "e5m2", ebits = 5, mbits = 2, bias = 15, max_code = 0x7B, max = 57344 },
}

local function ref_decode(dtype, code)
  local f = formats[dtype]
  local sign = bit.band(code, 0x80) ~= 0 and -1 or 1
  local e = bit.band(bit.rshift(code, f.mbits), bit.lshift(1, f.ebits) - 1)
  local m = bit.band(code, bit.lshift(1, f.mbits) - 1)
  local emax = bit.lshift(1, f.ebits) - 1
  if dtype == E4M3 then
    if e == emax and m == bit.lshift(1, f.mbits) - 1 then return 0 / 0 end -- S.1111.111
  elseif e == emax then
    if m == 0 then return sign * math.huge end
    return 0 / 0
  end
  if e == 0 then return sign * math.ldexp(m, 1 - f.bias - f.mbits) end -- subnormal (and +-0)
  return sign * math.ldexp(1 + m / bit.lshift(1, f.mbits), e - f.bias)
end

-- NaN inputs of either sign, with payloads. (A negative NaN with a payload is left out: as a
-- Lua number it would collide with LuaJIT's tagged values; make check-codecs covers every one.)
local nans = { 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0x7FA12345 }

local function same_bits(a, b)
  if isnan(a) or isnan(b) then return isnan(a) and isnan(b) end
  return bits(a) == bits(b)
end

describe("dtype", function()
  it("names, sizes and maxima", function()
    assert.are.equal("f32", ffi.string(C.lutra_dtype_name(F32)))
    assert.are.equal("bf16", ffi.string(C.lutra_dtype_name(BF16)))
    assert.are.equal("f16", ffi.string(C.lutra_dtype_name(F16)))
    assert.are.equal("e4m3", ffi.string(C.lutra_dtype_name(E4M3)))
    assert.are.equal("e5m2", ffi.string(C.lutra_dtype_name(E5M2)))
    assert.are.equal("e8m0", ffi.string(C.lutra_dtype_name(E8M0)))
    assert.are.equal("i32", ffi.string(C.lutra_dtype_name(C.LUTRA_I32)))
    assert.are.equal("?", ffi.string(C.lutra_dtype_name(99)))
    assert.are.equal(4, tonumber(C.lutra_dtype_size(F32)))
    assert.are.equal(2, tonumber(C.lutra_dtype_size(BF16)))
    assert.are.equal(2, tonumber(C.lutra_dtype_size(F16)))
    assert.are.equal(1, tonumber(C.lutra_dtype_size(E4M3)))
    assert.are.equal(1, tonumber(C.lutra_dtype_size(E5M2)))
    assert.are.equal(1, tonumber(C.lutra_dtype_size(E8M0)))
    assert.are.equal(4, tonumber(C.lutra_dtype_size(C.LUTRA_I32)))
    assert.are.equal(0, tonumber(C.lutra_dtype_size(99)))
    assert.are.equal(448, C.lutra_dtype_max(E4M3))
    assert.are.equal(57344, C.lutra_dtype_max(E5M2))
    assert.are.equal(65504, C.lutra_dtype_max(F16))
    assert.are.equal(f32(0x7F7F0000), C.lutra_dtype_max(BF16))
    assert.are.equal(f32(0x7F7FFFFF), C.lutra_dtype_max(F32))
    assert.are.equal(math.ldexp(1, 127), C.lutra_dtype_max(E8M0))
    assert.are.equal(0, C.lutra_dtype_max(99))
  end)

  it("unknown dtypes decode to NaN and encode to 0", function()
    assert.is_true(isnan(decode(99, 0)))
    assert.are.equal(0, encode(99, 1.5))
  end)

  it("f32 is the identity on the bit pattern", function()
    assert.are.equal(0xC0200000, encode(F32, -2.5))
    assert.are.equal(3, decode(F32, 0x40400000))
  end)

  for _, dtype in ipairs({ E4M3, E5M2 }) do
    local f = formats[dtype]
    describe(f.name, function()
      it("decodes all 256 codes as the format defines", function()
        for code = 0, 255 do
          local got, want = decode(dtype, code), ref_decode(dtype, code)
          assert.is_true(same_bits(got, want),
            string.format("%s code 0x%02X: got %.9g, want %.9g", f.name, code, got, want))
        end
      end)

      it("re-encodes every code to itself (NaN codes to a NaN code)", function()
        for code = 0, 255 do
          local v = decode(dtype, code)
          local back = encode(dtype, v)
          if isnan(v) then
            assert.is_true(isnan(ref_decode(dtype, back)),
              string.format("%s NaN code 0x%02X re-encoded to 0x%02X", f.name, code, back))
          elseif v == math.huge or v == -math.huge then
            -- E5M2 infinities saturate to the largest finite value
            assert.are.equal(bit.bor(bit.band(code, 0x80), f.max_code), back)
          else
            assert.are.equal(code, back)
          end
        end
      end)

      it("rounds to nearest with ties to the even code", function()
        for code = 0, f.max_code - 1 do
          local lo, hi = ref_decode(dtype, code), ref_decode(dtype, code + 1)
          local mid = (lo + hi) / 2 -- exact in f32
          local even = (code % 2 == 0) and code or code + 1
          assert.are.equal(even, encode(dtype, mid),
            string.format("%s tie %.9g between 0x%02X and 0x%02X", f.name, mid, code, code + 1))
          assert.are.equal(bit.bor(0x80, even), encode(dtype, -mid))
          -- one f32 ulp either side of the tie decides it
          assert.are.equal(code + 1, encode(dtype, f32(bits(mid) + 1)))
          assert.are.equal(code, encode(dtype, f32(bits(mid) - 1)))
          -- values just off a code go to that code
          assert.are.equal(code + 1, encode(dtype, f32(bits(hi) - 1)))
        end
      end)

      it("saturates instead of overflowing", function()
        assert.are.equal(f.max_code, encode(dtype, f.max))
        assert.are.equal(f.max_code, encode(dtype, f.max * 1.1))
        assert.are.equal(f.max_code, encode(dtype, math.huge))
        assert.are.equal(0x80 + f.max_code, encode(dtype, -math.huge))
        assert.are.equal(0x80 + f.max_code, encode(dtype, -1e9))
        assert.are.equal(f.max_code, encode(dtype, f32(0x7F7FFFFF)))
      end)

      -- as cvt.rn.satfinite.e4m3x2/e5m2x2.f32 and __nv_cvt_float_to_fp8 give it: one positive
      -- NaN code whatever the NaN's sign and payload
      it("encodes every NaN to 0x7F", function()
        for _, u in ipairs(nans) do
          local code = encode(dtype, f32(u))
          assert.are.equal(0x7F, code, string.format("%s NaN 0x%08X", f.name, u))
          assert.is_true(isnan(ref_decode(dtype, code)))
        end
      end)

      it("handles zeros and subnormals exactly", function()
        local tiny = math.ldexp(1, 1 - f.bias - f.mbits) -- smallest subnormal
        assert.are.equal(0x00, encode(dtype, 0))
        assert.are.equal(0x80, encode(dtype, f32(0x80000000))) -- -0 keeps its sign
        assert.are.equal(0x01, encode(dtype, tiny))
        assert.are.equal(0x81, encode(dtype, -tiny))
        assert.are.equal(0x00, encode(dtype, tiny / 2)) -- tie with 0 goes to 0 (even)
        assert.are.equal(0x80, encode(dtype, -tiny / 2))
        assert.are.equal(0x01, encode(dtype, f32(bits(tiny / 2) + 1)))
        assert.are.equal(0x02, encode(dtype, tiny * 1.5)) -- tie between 1 and 2 goes to 2
        assert.are.equal(0x00, encode(dtype, tiny / 4))
        assert.are.equal(0x00, encode(dtype, f32(0x00000001))) -- f32 subnormal
        assert.are.equal(tiny, decode(dtype, 0x01))
        -- largest subnormal and smallest normal
        local top = bit.lshift(1, f.mbits) - 1
        assert.are.equal(top * tiny, decode(dtype, top))
        assert.are.equal(math.ldexp(1, 1 - f.bias), decode(dtype, top + 1))
        assert.are.equal(top + 1, encode(dtype, (top + 0.5) * tiny)) -- tie into the normals
      end)
    end)
  end

  it("e4m3 examples", function()
    assert.are.equal(0x7E, encode(E4M3, 500))
    assert.are.equal(0x7E, encode(E4M3, 464)) -- past the would-be next code: still 448
    assert.are.equal(0x38, encode(E4M3, 1))
    assert.are.equal(0x3C, encode(E4M3, 1.5))
    assert.are.equal(0x38, encode(E4M3, 1.0625)) -- halfway 1 and 1.125: even (1)
    assert.are.equal(0x3A, encode(E4M3, 1.1875)) -- halfway 1.125 and 1.25: even (1.25)
    assert.are.equal(320, decode(E4M3, encode(E4M3, 336))) -- halfway 320 and 352
    assert.is_true(isnan(decode(E4M3, 0x7F)))
    assert.is_true(isnan(decode(E4M3, 0xFF)))
    assert.are.equal(448, decode(E4M3, 0x7E))
    assert.are.equal(-448, decode(E4M3, 0xFE))
  end)

  it("e5m2 examples", function()
    assert.are.equal(0x7B, encode(E5M2, 60000))
    assert.are.equal(0x7B, encode(E5M2, math.huge))
    assert.are.equal(0x3C, encode(E5M2, 1))
    assert.are.equal(0x3C, encode(E5M2, 1.125)) -- halfway 1 and 1.25: even (1)
    assert.are.equal(0x3E, encode(E5M2, 1.375)) -- halfway 1.25 and 1.5: even (1.5)
    assert.are.equal(math.huge, decode(E5M2, 0x7C))
    assert.are.equal(-math.huge, decode(E5M2, 0xFC))
    for code = 0x7D, 0x7F do
      assert.is_true(isnan(decode(E5M2, code)))
      assert.is_true(isnan(decode(E5M2, code + 0x80)))
    end
    assert.are.equal(57344, decode(E5M2, 0x7B))
  end)

  it("e8m0 rounds up to a power of two", function()
    assert.are.equal(127, encode(E8M0, 1.0))
    assert.are.equal(128, encode(E8M0, 1.5))
    assert.are.equal(128, encode(E8M0, 2.0))
    assert.are.equal(128, encode(E8M0, -1.5)) -- the magnitude counts
    assert.are.equal(127, encode(E8M0, f32(0x3F7FFFFF))) -- just below 1
    assert.are.equal(128, encode(E8M0, f32(0x3F800001))) -- just above 1
    assert.are.equal(0x00, encode(E8M0, 0))
    assert.are.equal(0xFE, encode(E8M0, math.huge))
    assert.are.equal(0xFE, encode(E8M0, -math.huge))
    assert.are.equal(0xFE, encode(E8M0, f32(0x7F7FFFFF))) -- no round-up past 254
    assert.are.equal(0xFF, encode(E8M0, f32(0x7FC00000)))
    assert.are.equal(0x00, encode(E8M0, math.ldexp(1, -127)))
    assert.are.equal(0x00, encode(E8M0, math.ldexp(1, -140)))
    assert.are.equal(0x01, encode(E8M0, f32(0x00400001))) -- just above 2^-127
    assert.are.equal(0x01, encode(E8M0, math.ldexp(1, -126)))
  end)

  it("e8m0 decodes 2^(e-127), 255 as NaN", function()
    assert.are.equal(math.ldexp(1, -127), decode(E8M0, 0))
    assert.are.equal(0x00400000, bits(decode(E8M0, 0)))
    assert.are.equal(1, decode(E8M0, 127))
    assert.are.equal(math.ldexp(1, 127), decode(E8M0, 254))
    assert.is_true(isnan(decode(E8M0, 255)))
    for e = 0, 254 do
      assert.are.equal(math.ldexp(1, e - 127), decode(E8M0, e))
      assert.are.equal(e, encode(E8M0, decode(E8M0, e)))
    end
  end)

  it("bf16 rounds to nearest even, NaN to 0x7FFF", function()
    assert.are.equal(0x3F80, encode(BF16, 1))
    assert.are.equal(0x3F80, encode(BF16, f32(0x3F808000))) -- tie, even below
    assert.are.equal(0x3F82, encode(BF16, f32(0x3F818000))) -- tie, even above
    assert.are.equal(0x3F81, encode(BF16, f32(0x3F808001)))
    assert.are.equal(0x3F81, encode(BF16, f32(0x3F817FFF)))
    assert.are.equal(0xBF82, encode(BF16, f32(0xBF818000)))
    assert.are.equal(0x7F80, encode(BF16, f32(0x7F7FFFFF))) -- rounds up to inf
    assert.are.equal(0x7F80, encode(BF16, math.huge))
    -- every NaN (a signalling one, a negative one) gives cvt.rn.bf16.f32's 0x7FFF
    for _, u in ipairs(nans) do
      assert.are.equal(0x7FFF, encode(BF16, f32(u)), string.format("NaN 0x%08X", u))
    end
    assert.is_true(isnan(decode(BF16, 0x7FFF)))
    assert.is_true(isnan(decode(BF16, 0xFF81)))
    assert.are.equal(1, decode(BF16, 0x3F80))
    assert.are.equal(f32(0x3F810000), decode(BF16, 0x3F81))
    assert.are.equal(f32(0x00010000), decode(BF16, 0x0001)) -- subnormal
  end)

  it("f16 rounds to nearest even, overflows to inf, NaN to 0x7FFF", function()
    assert.are.equal(0x3C00, encode(F16, 1))
    assert.are.equal(0x3C00, encode(F16, 1 + math.ldexp(1, -11))) -- tie, even below
    assert.are.equal(0x3C02, encode(F16, 1 + 3 * math.ldexp(1, -11))) -- tie, even above
    assert.are.equal(0x7BFF, encode(F16, 65504))
    assert.are.equal(0x7BFF, encode(F16, 65519))
    assert.are.equal(0x7C00, encode(F16, 65520))
    assert.are.equal(0xFC00, encode(F16, -math.huge))
    assert.are.equal(0x0001, encode(F16, math.ldexp(1, -24)))
    assert.are.equal(0x0000, encode(F16, math.ldexp(1, -25))) -- tie with 0
    assert.are.equal(0x0002, encode(F16, 3 * math.ldexp(1, -25)))
    assert.are.equal(0x8000, encode(F16, f32(0x80000000)))
    for _, u in ipairs(nans) do
      assert.are.equal(0x7FFF, encode(F16, f32(u)), string.format("NaN 0x%08X", u))
    end
    assert.is_true(isnan(decode(F16, 0x7FFF)))
    assert.is_true(isnan(decode(F16, 0xFC01)))
    assert.are.equal(math.huge, decode(F16, 0x7C00))
    assert.are.equal(math.ldexp(1, -24), decode(F16, 0x0001))
    assert.are.equal(65504, decode(F16, 0x7BFF))
    for h = 0, 0x7BFF, 7 do -- finite codes round-trip
      assert.are.equal(h, encode(F16, decode(F16, h)))
    end
  end)
end)
