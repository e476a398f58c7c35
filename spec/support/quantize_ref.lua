-- The quantization specs' reference (spec/quantize_spec.lua, spec/quantize_delayed_spec.lua):
-- scales and FP8 codes recomputed in Lua from TransformerEngine's definitions, the bit-level and
-- round-trip check of a quantized output, and fresh random inputs. Not a spec itself.
local assert = require("luassert")
local lutra = require("lutra")
local ffi = require("ffi")
local C = lutra.C

local FLT_MAX = 3.4028234663852886e38
local E4M3, E5M2 = C.LUTRA_E4M3, C.LUTRA_E5M2
local FMT = {
  -- mbits: mantissa bits; half_sub: half the smallest subnormal (the largest absolute rounding
  -- error below the normal range); max: largest finite value
  e4m3 = { code = E4M3, mbits = 3, half_sub = 2 ^ -10, max = 448 },
  e5m2 = { code = E5M2, mbits = 2, half_sub = 2 ^ -17, max = 57344 },
}

local fbox = ffi.new("float[1]")
local function f32(x) fbox[0] = x return fbox[0] end

-- 2^floor(log2(v)) for v > 0 (the power-of-2 scale keeps only the exponent bits)
local function pow2floor(v)
  local p = 2 ^ math.floor(math.log(v) / math.log(2))
  while p > v do p = p / 2 end
  while p * 2 <= v do p = p * 2 end
  return p
end

-- TransformerEngine's compute_scale_from_amax, written from its definition.
local function scale_rule(amax, fmax, p2, eps)
  local a = math.max(amax, eps or 0)
  if a == 0 or a == math.huge then return 1 end
  local s = f32(fmax / a)
  if s == math.huge then s = FLT_MAX end
  if p2 then s = pow2floor(s) end
  return s
end

-- The MXFP8 E8M0 exponent, rounded up: the smallest biased k with 2^(k-127) >= t, where
-- t = f32(amax * f32(1 / fp8_max)) (TE multiplies by max_norm_rcp). 0 for t <= 2^-127.
local function e8m0_up(amax, fmax)
  local t = f32(amax * f32(1 / fmax))
  if t <= 2 ^ -127 then return 0 end
  local m, ex = math.frexp(t) -- t = m * 2^ex, m in [0.5, 1)
  local k = (m == 0.5) and (ex - 1) or ex
  return k + 127
end

local function encode(fmt, v) return tonumber(C.lutra_encode(FMT[fmt].code, v)) end

local function round4(n) return math.ceil(n / 4) * 4 end

-- A matrix view: the rowwise data is x itself, the columnwise copy is x^T.
local function view(x, rows, cols, transposed)
  if not transposed then
    return function(r, c) return x[r * cols + c + 1] end, rows, cols
  end
  return function(r, c) return x[c * cols + r + 1] end, cols, rows
end

-- Expected multiplier s (code = encode(x * s)) and dequant factor si for every element of a
-- view, plus the expected stored scale array (storage order), for one quantizer kind.
--   spec = {kind="tensor", scale=s} | {kind="mxfp8"} | {kind="block", dim=1|2, p2=, eps=}
local function expected_scales(spec, get, vr, vc, fmax)
  local s_of, si_of, stored = {}, {}, {}
  if spec.kind == "tensor" then
    local s = spec.scale
    local si = f32(1 / s)
    for i = 0, vr * vc - 1 do s_of[i], si_of[i] = s, si end
    stored[1] = si
  elseif spec.kind == "mxfp8" then
    local nb = vc / 32
    for r = 0, vr - 1 do
      for b = 0, nb - 1 do
        local amax = 0
        for c = b * 32, b * 32 + 31 do amax = math.max(amax, math.abs(get(r, c))) end
        local e = e8m0_up(amax, fmax)
        local s = (e == 0) and 1 or 2 ^ (127 - e) -- TE's exp2f_rcp: 1 for e = 0
        for c = b * 32, b * 32 + 31 do s_of[r * vc + c], si_of[r * vc + c] = s, 2 ^ (e - 127) end
        stored[r * nb + b + 1] = e
      end
    end
  else -- block: cuBLASLt's layout (lutra.h), padding entries 0
    local nb = math.ceil(vc / 128)
    local r4, nb4 = round4(vr), round4(nb)
    local count = spec.dim == 1 and nb * r4 or math.ceil(vr / 128) * nb4
    for i = 1, count do stored[i] = 0 end
    if spec.dim == 1 then
      for r = 0, vr - 1 do
        for b = 0, nb - 1 do
          local c1 = math.min(vc, (b + 1) * 128) - 1
          local amax = 0
          for c = b * 128, c1 do amax = math.max(amax, math.abs(get(r, c))) end
          local s = scale_rule(amax, fmax, spec.p2, spec.eps)
          local si = f32(1 / s)
          for c = b * 128, c1 do s_of[r * vc + c], si_of[r * vc + c] = s, si end
          stored[b * r4 + r + 1] = si -- [nb][roundup(rows, 4)]: the row is the fast index
        end
      end
    else -- 128x128 tiles; the columnwise copy's tiles are the transposed grid
      local rb = math.ceil(vr / 128)
      for tr = 0, rb - 1 do
        for tc = 0, nb - 1 do
          local r1, c1 = math.min(vr, (tr + 1) * 128) - 1, math.min(vc, (tc + 1) * 128) - 1
          local amax = 0
          for r = tr * 128, r1 do
            for c = tc * 128, c1 do amax = math.max(amax, math.abs(get(r, c))) end
          end
          local s = scale_rule(amax, fmax, spec.p2, spec.eps)
          local si = f32(1 / s)
          for r = tr * 128, r1 do
            for c = tc * 128, c1 do s_of[r * vc + c], si_of[r * vc + c] = s, si end
          end
          stored[tr * nb4 + tc + 1] = si -- [ceil(rows/128)][roundup(nb, 4)]
        end
      end
    end
  end
  return s_of, si_of, stored
end

local function stored_scales(qt, columnwise, n, kind)
  local p = columnwise and qt.col_scale_inv or qt.scale_inv
  assert.is_truthy(p ~= nil, "scale_inv pointer is NULL")
  local out = {}
  if kind == "mxfp8" then
    local b = ffi.cast("const uint8_t*", p)
    for i = 1, n do out[i] = b[i - 1] end
  else
    local f = ffi.cast("const float*", p)
    for i = 1, n do out[i] = f[i - 1] end
  end
  return out
end

-- Checks one output (rowwise or columnwise) of a quantized tensor qt against x:
--  1. bit level: stored scales equal the recomputed ones, and every FP8 code equals
--     lutra_encode(f32(x * s)) for its block's multiplier s;
--  2. round trip: lutra.dequantize gives y with, elementwise,
--       |y - x| <= (2^-(mbits+1) + 2^-22) * |x| + half_sub * si * (1 + 2^-22)
--     i.e. relative error <= 2^-4 (e4m3) / 2^-3 (e5m2) in the normal range, plus half the
--     smallest subnormal in the block's scaled units (si = the block's scale_inv), plus f32
--     rounding of the two multiplications (2^-22 covers both). Since |x| <= block amax, this
--     also bounds each error by 2^-4 (2^-3) of the block amax, which is asserted too.
local function check_output(qt, x, rows, cols, fmt, spec, columnwise)
  local F = FMT[fmt]
  local get, vr, vc = view(x, rows, cols, columnwise)
  local s_of, si_of, stored = expected_scales(spec, get, vr, vc, F.max)
  -- scales
  local got = stored_scales(qt, columnwise, #stored, spec.kind)
  for i = 1, #stored do
    if got[i] ~= stored[i] then
      error(string.format("%s scale %d: got %.9g, expected %.9g", columnwise and "columnwise"
                          or "rowwise", i - 1, got[i], stored[i]))
    end
  end
  -- codes
  local bytes = qt:bytes(columnwise)
  assert.are.equal(vr * vc, #bytes)
  for r = 0, vr - 1 do
    for c = 0, vc - 1 do
      local i = r * vc + c
      local want = encode(fmt, f32(get(r, c) * s_of[i]))
      local have = bytes:byte(i + 1)
      if want ~= have then
        error(string.format("%s code [%d,%d]: got 0x%02x, expected 0x%02x (x=%.9g, s=%.9g)",
                            columnwise and "columnwise" or "rowwise", r, c, have, want,
                            get(r, c), s_of[i]))
      end
    end
  end
  -- round trip
  local out = lutra.tensor({ vr, vc }, "f32")
  lutra.dequantize(qt, out, columnwise)
  local y = out:read()
  local rel = 2 ^ -(F.mbits + 1)
  for r = 0, vr - 1 do
    for c = 0, vc - 1 do
      local i = r * vc + c
      local xv, yv = get(r, c), y[i]
      local bound = (rel + 2 ^ -22) * math.abs(xv) + F.half_sub * si_of[i] * (1 + 2 ^ -22)
      if not (math.abs(yv - xv) <= bound) then
        error(string.format("%s [%d,%d]: dequantized %.9g, x %.9g, |err| %.3g > bound %.3g",
                            columnwise and "columnwise" or "rowwise", r, c, yv, xv,
                            math.abs(yv - xv), bound))
      end
    end
  end
end

-- qt is owned by its quantizer q: q is passed along so that it stays alive (not collected)
-- while qt is read.
local function check_both(q, qt, x, rows, cols, fmt, spec)
  check_output(qt, x, rows, cols, fmt, spec, false)
  check_output(qt, x, rows, cols, fmt, spec, true)
  assert.is_truthy(q ~= nil)
end

local function amax_of(x)
  local m = 0
  for i = 1, #x do m = math.max(m, math.abs(x[i])) end
  return m
end

-- fresh random inputs: (seed, std) pairs across three magnitudes
local CASES = {
  { seed = 11, std = 1e-3 }, { seed = 12, std = 1 }, { seed = 13, std = 300 },
  { seed = 1701, std = 1 }, { seed = 90210, std = 1e-3 },
}

local function randn(rows, cols, seed, std, dtype)
  local t = lutra.tensor({ rows, cols }, dtype or "f32"):randn(seed, 0, std)
  return t, t:to_table()
end

return {
  FLT_MAX = FLT_MAX, E4M3 = E4M3, E5M2 = E5M2, FMT = FMT, f32 = f32, pow2floor = pow2floor,
  scale_rule = scale_rule, e8m0_up = e8m0_up, encode = encode, round4 = round4, view = view,
  expected_scales = expected_scales, stored_scales = stored_scales, check_output = check_output,
  check_both = check_both, amax_of = amax_of, CASES = CASES, randn = randn,
}
