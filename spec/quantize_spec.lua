-- Quantization: round trips within the format's error bound, bit-level checks of scales and
-- FP8 codes against values recomputed here in Lua, delayed-scaling updates against a Lua model
-- and hand-computed values, saturation, and argument errors.
--
-- Everything "expected" is computed in this file from the definitions (TransformerEngine's):
-- the only library helper used for expected values is the scalar codec lutra_encode, which is
-- the bit-exact reference every backend is specified against.
local lutra = require("lutra")
local ffi = require("ffi")
local C = lutra.C
local R = lutra.recipe

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

describe("current scaling", function()
  for _, case in ipairs(CASES) do
    for _, role in ipairs { "input", "grad_output" } do
      local fmt = role == "input" and "e4m3" or "e5m2"
      it(string.format("%s (%s) round trip and bits, seed %d std %g", role, fmt, case.seed,
                       case.std), function()
        local rows, cols = 48, 80
        local x, xv = randn(rows, cols, case.seed + (role == "input" and 0 or 7), case.std)
        local q = lutra.quantizer(R.current(), role)
        local qt = q:quantize(x)
        assert.are.equal("tensor", qt:scaling_name())
        assert.are.equal(fmt, qt:dtype_name())
        -- scale = fp8_max / amax, exactly (f32 division)
        local amax = amax_of(xv)
        local scale = q:scale()
        assert.are.equal(f32(FMT[fmt].max / amax), scale)
        check_both(q, qt, xv, rows, cols, fmt, { kind = "tensor", scale = scale })
      end)
    end
  end

  it("q:scale() returns scale_inv = 1/scale (the one the cast stored), not a stale value", function()
    for _, case in ipairs(CASES) do
      local x, xv = randn(16, 32, case.seed + 50, case.std)
      local q = lutra.quantizer(R.current(), "input")
      local qt = q:quantize(x)
      local want = f32(448 / amax_of(xv))
      local scale, scale_inv = q:scale()
      assert.are.equal(want, scale)
      assert.are.equal(f32(1 / want), ffi.cast("float*", qt.scale_inv)[0])
      assert.are.equal(f32(1 / want), scale_inv)
    end
  end)

  it("power_2_scale keeps only the exponent bits of fp8_max / amax", function()
    for _, case in ipairs(CASES) do
      local x, xv = randn(32, 64, case.seed + 100, case.std)
      local q = lutra.quantizer(R.current { power_2_scale = true }, "input")
      local qt = q:quantize(x)
      local scale = q:scale()
      local want = pow2floor(f32(448 / amax_of(xv)))
      assert.are.equal(want, scale)
      check_both(q, qt, xv, 32, 64, "e4m3", { kind = "tensor", scale = want })
    end
  end)

  it("bf16 inputs quantize from their bf16 values", function()
    local x, xv = randn(32, 48, 4242, 3, "bf16")
    local q = lutra.quantizer(R.current(), "weight")
    local qt = q:quantize(x)
    assert.are.equal(f32(448 / amax_of(xv)), (q:scale()))
    check_both(q, qt, xv, 32, 48, "e4m3", { kind = "tensor", scale = f32(448 / amax_of(xv)) })
  end)

  it("amax_epsilon clamps a small amax", function()
    local x, xv = randn(16, 32, 77, 1e-3)
    assert.is_true(amax_of(xv) < 0.5)
    local q = lutra.quantizer(R.current { amax_epsilon = 0.5 }, "input")
    local qt = q:quantize(x)
    assert.are.equal(896, (q:scale())) -- 448 / 0.5
    check_both(q, qt, xv, 16, 32, "e4m3", { kind = "tensor", scale = 896 })
  end)

  it("an all-zero tensor gets scale 1 and zero codes", function()
    local x = lutra.tensor({ 16, 16 })
    local q = lutra.quantizer(R.current(), "input")
    local qt = q:quantize(x)
    assert.are.same({ 1, 1 }, { q:scale() })
    assert.are.equal(string.rep("\0", 256), qt:bytes(false))
    assert.are.equal(string.rep("\0", 256), qt:bytes(true))
  end)

  it("a tiny amax giving an infinite scale uses FLT_MAX (2^127 with power_2_scale)", function()
    local vals = {}
    for i = 1, 256 do vals[i] = 0 end
    vals[5] = 1e-40 -- an f32 subnormal: 448 / 1e-40 overflows f32
    local x = lutra.from_table(vals, { 16, 16 })
    local q = lutra.quantizer(R.current(), "input")
    q:quantize(x)
    assert.are.equal(FLT_MAX, (q:scale()))
    local q2 = lutra.quantizer(R.current { power_2_scale = true }, "input")
    local qt = q2:quantize(x)
    assert.are.equal(2 ^ 127, (q2:scale()))
    assert.are.equal(2 ^ -127, ffi.cast("float*", qt.scale_inv)[0])
  end)
end)

describe("MXFP8", function()
  for _, case in ipairs(CASES) do
    it(string.format("e4m3 rowwise and columnwise, seed %d std %g", case.seed, case.std), function()
      local rows, cols = 64, 96
      local x, xv = randn(rows, cols, case.seed + 200, case.std)
      local q = lutra.quantizer(R.mxfp8(), "input")
      local qt = q:quantize(x)
      assert.are.equal("mxfp8", qt:scaling_name())
      check_both(q, qt, xv, rows, cols, "e4m3", { kind = "mxfp8" })
    end)
  end

  it("hybrid grad_output is e5m2 with E8M0 scales", function()
    for _, case in ipairs(CASES) do
      local x, xv = randn(32, 128, case.seed + 300, case.std)
      local q = lutra.quantizer(R.mxfp8 { fp8_format = "hybrid" }, "grad_output")
      local qt = q:quantize(x)
      assert.are.equal("e5m2", qt:dtype_name())
      check_both(q, qt, xv, 32, 128, "e5m2", { kind = "mxfp8" })
    end
  end)

  it("rounds the scale up: a block with amax 448 * 2^k + a bit gets exponent k + 128", function()
    -- block 0 amax exactly 448 (scale 2^0), block 1 amax 449 (scale 2^1), block 2 amax 3.5
    -- (3.5/448 = 2^-7 exactly: scale 2^-7), block 3 all zero (E8M0 byte 0, codes 0)
    local vals = {}
    for r = 0, 31 do
      for c = 0, 127 do vals[r * 128 + c + 1] = 0 end
      vals[r * 128 + 1] = (r % 2 == 0) and 448 or -448
      vals[r * 128 + 2] = 1.25
      vals[r * 128 + 33] = 449
      vals[r * 128 + 34] = -7
      vals[r * 128 + 65] = 3.5
      vals[r * 128 + 66] = 0.001
    end
    local x = lutra.from_table(vals, { 32, 128 })
    local q = lutra.quantizer(R.mxfp8(), "input", { columnwise = false })
    local qt = q:quantize(x)
    local sc = stored_scales(qt, false, 32 * 4, "mxfp8")
    for r = 0, 31 do
      assert.are.same({ 127, 128, 120, 0 },
                      { sc[r * 4 + 1], sc[r * 4 + 2], sc[r * 4 + 3], sc[r * 4 + 4] })
    end
    check_output(qt, vals, 32, 128, "e4m3", { kind = "mxfp8" }, false)
  end)
end)

describe("block scaling", function()
  for _, case in ipairs(CASES) do
    it(string.format("1x128 blocks (input) with a partial block, seed %d std %g", case.seed,
                     case.std), function()
      local rows, cols = 48, 272 -- 272 = 2 * 128 + 16
      local x, xv = randn(rows, cols, case.seed + 400, case.std)
      local q = lutra.quantizer(R.block(), "input")
      local qt = q:quantize(x)
      assert.are.equal("block_1d", qt:scaling_name())
      check_both(q, qt, xv, rows, cols, "e4m3", { kind = "block", dim = 1, p2 = true })
    end)

    it(string.format("128x128 tiles (weight) with partial tiles, seed %d std %g", case.seed,
                     case.std), function()
      local rows, cols = 144, 160
      local x, xv = randn(rows, cols, case.seed + 500, case.std)
      local q = lutra.quantizer(R.block(), "weight")
      local qt = q:quantize(x)
      assert.are.equal("block_2d", qt:scaling_name())
      check_both(q, qt, xv, rows, cols, "e4m3", { kind = "block", dim = 2, p2 = true })
    end)
  end

  it("without power_2_scale the scale is fp8_max / block amax", function()
    local x, xv = randn(32, 256, 606, 5)
    local r = R.block { power_2_scale = false, fp8_format = "hybrid" }
    for role, want in pairs { input = { "e4m3", 1 }, grad_output = { "e5m2", 1 },
                              weight = { "e4m3", 2 } } do
      local q = lutra.quantizer(r, role)
      check_both(q, q:quantize(x), xv, 32, 256, want[1], { kind = "block", dim = want[2], p2 = false })
    end
  end)

  it("amax_epsilon applies per block", function()
    local x, xv = randn(16, 128, 607, 1e-3)
    local q = lutra.quantizer(R.block { amax_epsilon = 0.25 }, "input")
    local qt = q:quantize(x)
    local sc = stored_scales(qt, false, 16, "block")
    for i = 1, 16 do assert.are.equal(f32(1 / pow2floor(448 / 0.25)), sc[i]) end
    check_both(q, qt, xv, 16, 128, "e4m3", { kind = "block", dim = 1, p2 = true, eps = 0.25 })
  end)

  -- The scale layout cuBLASLt's VEC128_32F / BLK128x128_32F modes read (lutra.h), pinned with
  -- its index formulas written out here: for a stored matrix of R rows x C cols (the columnwise
  -- copy: R = cols, C = rows), NB = ceil(C/128),
  --   1x128:   scale of row r, block j at j * roundup(R, 4) + r; NB * roundup(R, 4) entries
  --   128x128: tile (i, j) at i * roundup(NB, 4) + j; ceil(R/128) * roundup(NB, 4) entries
  -- and every other entry (padding) is 0. The quantizer takes only dims that are multiples of
  -- 16, so R is always a multiple of 4 here and 1x128 arrays have no row padding; NB is not.
  it("scales sit in cuBLASLt's layout (VEC128 / BLK128x128), padding entries 0", function()
    local function block_amax(get, r0, r1, c0, c1)
      local m = 0
      for r = r0, r1 do
        for c = c0, c1 do m = math.max(m, math.abs(get(r, c))) end
      end
      return m
    end
    local cases = {
      { rows = 48, cols = 304, dim = 1, role = "input" },   -- NB 3 | columnwise R 304, NB 1
      { rows = 144, cols = 304, dim = 2, role = "weight" }, -- tiles 2x3 (pad 1) | 3x2 (pad 2)
      { rows = 272, cols = 656, dim = 2, role = "weight" }, -- tiles 3x6 (pad 2) | 6x3 (pad 1)
      { rows = 32, cols = 656, dim = 1, role = "grad_output" }, -- NB 6 | columnwise NB 1
    }
    for ci, cs in ipairs(cases) do
      for _, opts in ipairs { { p2 = true, eps = 0 }, { p2 = false, eps = 0 },
                              { p2 = false, eps = 0.5 } } do
        local fmt = cs.role == "grad_output" and "e5m2" or "e4m3"
        local fmax = FMT[fmt].max
        local x, xv = randn(cs.rows, cs.cols, 3100 + 10 * ci + (opts.p2 and 1 or 0) + 4 * opts.eps, 2)
        local r = R.block { fp8_format = "hybrid", power_2_scale = opts.p2,
                            amax_epsilon = opts.eps }
        for _, columnwise in ipairs { false, true } do
          local q = lutra.quantizer(r, cs.role, { rowwise = not columnwise, columnwise = columnwise })
          local qt = q:quantize(x)
          assert.are.equal(cs.dim == 1 and "block_1d" or "block_2d", qt:scaling_name())
          local get, vr, vc = view(xv, cs.rows, cs.cols, columnwise)
          local nb = math.ceil(vc / 128)
          local want, count = {}, nil
          if cs.dim == 1 then
            count = nb * round4(vr)
            for i = 0, count - 1 do want[i] = 0 end
            for row = 0, vr - 1 do
              for j = 0, nb - 1 do
                local amax = block_amax(get, row, row, 128 * j, math.min(vc, 128 * j + 128) - 1)
                want[j * round4(vr) + row] = f32(1 / scale_rule(amax, fmax, opts.p2, opts.eps))
              end
            end
          else
            local mb = math.ceil(vr / 128)
            count = mb * round4(nb)
            for i = 0, count - 1 do want[i] = 0 end
            for i = 0, mb - 1 do
              for j = 0, nb - 1 do
                local amax = block_amax(get, 128 * i, math.min(vr, 128 * i + 128) - 1, 128 * j,
                                        math.min(vc, 128 * j + 128) - 1)
                want[i * round4(nb) + j] = f32(1 / scale_rule(amax, fmax, opts.p2, opts.eps))
              end
            end
          end
          local p = ffi.cast("const float*", columnwise and qt.col_scale_inv or qt.scale_inv)
          local pads = 0
          for i = 0, count - 1 do
            if want[i] == 0 then pads = pads + 1 end
            if p[i] ~= want[i] then
              error(string.format("%dx%d dim %d %s p2=%s eps=%g: scale entry %d is %.9g, "
                                  .. "expected %.9g%s", cs.rows, cs.cols, cs.dim,
                                  columnwise and "columnwise" or "rowwise", tostring(opts.p2),
                                  opts.eps, i, p[i], want[i], want[i] == 0 and " (padding)" or ""))
            end
          end
          -- the 128x128 cases were chosen so that both copies have padding to check
          if cs.dim == 2 then assert.is_true(pads > 0) end
          check_output(qt, xv, cs.rows, cs.cols, fmt,
                       { kind = "block", dim = cs.dim, p2 = opts.p2, eps = opts.eps }, columnwise)
        end
      end
    end
  end)
end)

describe("custom recipe", function()
  local r = R.custom { input = { kind = "current", format = "e5m2" },
                       weight = { kind = "block_2d", format = "e4m3" },
                       -- e4m3: e5m2 would pair with the e5m2 input in wgrad (refused)
                       grad_output = { kind = "mxfp8", format = "e4m3" } }
  for _, case in ipairs(CASES) do
    it(string.format("each role uses its own kind and format, seed %d std %g", case.seed,
                     case.std), function()
      local rows, cols = 64, 160
      local x, xv = randn(rows, cols, case.seed + 600, case.std)
      local qi = lutra.quantizer(r, "input")
      local qt = qi:quantize(x)
      assert.are.equal("e5m2", qt:dtype_name())
      local s = qi:scale()
      assert.are.equal(f32(57344 / amax_of(xv)), s)
      check_both(qi, qt, xv, rows, cols, "e5m2", { kind = "tensor", scale = s })
      local qw = lutra.quantizer(r, "weight")
      qt = qw:quantize(x)
      assert.are.equal("block_2d", qt:scaling_name())
      check_both(qw, qt, xv, rows, cols, "e4m3", { kind = "block", dim = 2, p2 = false })
      local qg = lutra.quantizer(r, "grad_output")
      qt = qg:quantize(x)
      assert.are.equal("mxfp8", qt:scaling_name())
      check_both(qg, qt, xv, rows, cols, "e4m3", { kind = "mxfp8" })
    end)
  end

  it("a role kept in high precision has no quantizer", function()
    local hp = R.custom { input = { kind = "none" }, weight = { kind = "none" } }
    local ok, msg = pcall(lutra.quantizer, hp, "input")
    assert.is_false(ok)
    assert.is_truthy(tostring(msg):find("lutra_quantizer_new: this role is kept in high precision",
                                        1, true))
  end)
end)

-- A Lua model of one delayed-scaling update (TransformerEngine's): last = h[0]; roll so that
-- new[i] = h[i+1] (i < L-1), new[L-1] = last, then new[0] = 0; amax = max over the whole old
-- history ("max") or last ("most_recent"); if amax is finite and > 0,
-- scale = (fp8_max / 2^margin) / amax (f32, TE's order), else the old scale; inf -> FLT_MAX.
local function model_update(st, algo, margin, fmax)
  local h, L = st.h, #st.h
  local last = h[1]
  local amax = 0
  for i = 1, L do amax = math.max(amax, h[i]) end -- max over the whole old history
  if algo == "most_recent" then amax = last end
  local new = {}
  for i = 1, L - 1 do new[i] = h[i + 1] end
  new[L] = last
  new[1] = 0
  st.h = new
  local scale = st.scale
  if amax > 0 and amax < math.huge then scale = f32(f32(fmax / 2 ^ margin) / amax) end
  if scale == math.huge then scale = FLT_MAX end
  st.scale = scale
  st.scale_inv = f32(1 / scale)
end

describe("delayed scaling", function()
  for _, case in ipairs(CASES) do
    it(string.format("quantizes with the scale of the last update, seed %d std %g", case.seed,
                     case.std), function()
      local rows, cols = 32, 96
      local x, xv = randn(rows, cols, case.seed + 700, case.std)
      local amax = amax_of(xv)
      for _, role in ipairs { "input", "grad_output" } do
        local fmt = role == "input" and "e4m3" or "e5m2"
        local q = lutra.quantizer(R.delayed(), role)
        -- first cast: initial scale 1, records max|x| into history[0]
        local qt = q:quantize(x)
        assert.are.equal(1, ffi.cast("float*", qt.scale_inv)[0])
        local b = qt:bytes(false)
        for i = 1, rows * cols do assert.are.equal(encode(fmt, xv[i]), b:byte(i)) end
        assert.are.equal(amax, q:history(1)[1])
        q:update()
        local s, si = q:scale()
        assert.are.equal(f32(FMT[fmt].max / amax), s)
        assert.are.equal(f32(1 / s), si)
        qt = q:quantize(x)
        check_both(q, qt, xv, rows, cols, fmt, { kind = "tensor", scale = s })
      end
    end)
  end

  it("quantizing max-accumulates max|x| into history[0] without changing the scale", function()
    local q = lutra.quantizer(R.delayed { amax_history_len = 8 }, "input")
    local _, a1 = randn(16, 32, 801, 2)
    local x1 = lutra.from_table(a1, { 16, 32 })
    local x2, a2 = randn(16, 32, 802, 0.5)
    local x3, a3 = randn(16, 32, 803, 9)
    q:quantize(x1)
    assert.are.equal(amax_of(a1), q:history(1)[1])
    q:quantize(x2) -- smaller: history[0] keeps the max
    assert.are.equal(math.max(amax_of(a1), amax_of(a2)), q:history(1)[1])
    q:quantize(x3)
    assert.are.equal(math.max(amax_of(a1), amax_of(a2), amax_of(a3)), q:history(1)[1])
    assert.are.same({ 0, 0, 0, 0, 0, 0, 0 }, { select(2, unpack(q:history(8))) })
    assert.are.same({ 1, 1 }, { q:scale() })
  end)

  it("history rolls and scales follow hand-computed values (L=4, max, most_recent, margin)", function()
    local seq = { 2, 8, 1, 0.5, 0.25, 0.25 }
    local want_h = { { 0, 0, 0, 2 }, { 0, 0, 2, 8 }, { 0, 2, 8, 1 }, { 0, 8, 1, 0.5 },
                     { 0, 1, 0.5, 0.25 }, { 0, 0.5, 0.25, 0.25 } }
    local want = {
      max = { 224, 56, 56, 56, 56, 448 },
      most_recent = { 224, 56, 448, 896, 1792, 1792 },
      max_margin1 = { 112, 28, 28, 28, 28, 224 },
    }
    local qs = {
      max = lutra.quantizer(R.delayed { amax_history_len = 4 }, "input"),
      most_recent = lutra.quantizer(R.delayed { amax_history_len = 4,
                                                amax_compute_algo = "most_recent" }, "input"),
      max_margin1 = lutra.quantizer(R.delayed { amax_history_len = 4, margin = 1 }, "weight"),
    }
    for step, a in ipairs(seq) do
      for name, q in pairs(qs) do
        q:record_amax(a)
        assert.are.equal(a, q:history(1)[1])
        q:update()
        assert.are.same(want_h[step], q:history(4), name .. " history at step " .. step)
        local s, si = q:scale()
        assert.are.equal(want[name][step], s, name .. " scale at step " .. step)
        assert.are.equal(f32(1 / want[name][step]), si)
      end
    end
  end)

  it("matches a Lua model over random amax sequences (several lengths, algos, margins)", function()
    local rng = 12345
    local function rand() -- small LCG, so the sequence is fresh but reproducible
      rng = (rng * 1103515245 + 12345) % 2147483648
      return rng / 2147483648
    end
    for _, cfg in ipairs { { L = 1, algo = "max", margin = 0 }, { L = 3, algo = "max", margin = 2 },
                           { L = 5, algo = "most_recent", margin = 0 },
                           { L = 16, algo = "max", margin = 3 },
                           { L = 7, algo = "most_recent", margin = 1 } } do
      for _, role in ipairs { "input", "grad_output" } do
        local fmax = role == "input" and 448 or 57344
        local q = lutra.quantizer(R.delayed { amax_history_len = cfg.L, amax_compute_algo = cfg.algo,
                                              margin = cfg.margin }, role)
        local st = { h = {}, scale = 1, scale_inv = 1 }
        for i = 1, cfg.L do st.h[i] = 0 end
        for step = 1, 25 do
          local a = f32(10 ^ (rand() * 8 - 4)) -- 1e-4 .. 1e4
          if step % 6 == 0 then a = 0 end
          q:record_amax(a)
          st.h[1] = a
          q:update()
          model_update(st, cfg.algo, cfg.margin, fmax)
          assert.are.same(st.h, q:history(cfg.L))
          local s, si = q:scale()
          assert.are.equal(st.scale, s)
          assert.are.equal(st.scale_inv, si)
        end
      end
    end
  end)

  it("amax 0, inf or NaN keeps the old scale; a tiny amax gives FLT_MAX", function()
    local q = lutra.quantizer(R.delayed { amax_history_len = 1 }, "input")
    q:record_amax(2)
    q:update()
    assert.are.same({ 224, f32(1 / 224) }, { q:scale() })
    q:record_amax(0)
    q:update()
    assert.are.same({ 224, f32(1 / 224) }, { q:scale() })
    q:record_amax(math.huge)
    q:update()
    assert.are.same({ 224, f32(1 / 224) }, { q:scale() })
    q:record_amax(0 / 0)
    q:update()
    assert.are.same({ 224, f32(1 / 224) }, { q:scale() })
    q:record_amax(1e-39) -- 448 / 1e-39 overflows f32
    q:update()
    local s, si = q:scale()
    assert.are.equal(FLT_MAX, s)
    assert.are.equal(f32(1 / FLT_MAX), si)
    -- with a longer history, an inf anywhere in it also keeps the scale under "max"
    local q2 = lutra.quantizer(R.delayed { amax_history_len = 3 }, "input")
    q2:record_amax(4)
    q2:update() -- 112
    q2:record_amax(math.huge)
    q2:update()
    assert.are.equal(112, (q2:scale()))
  end)

  it("applies the margin before dividing by amax, as TE does", function()
    -- amax = 1e-36: 448 / amax overflows f32 but (448 / 2) / amax = 2.24e38 does not
    local q = lutra.quantizer(R.delayed { amax_history_len = 1, margin = 1 }, "input")
    q:record_amax(1e-36)
    q:update()
    local expected = f32(224 / f32(1e-36))
    assert.is_true(expected < FLT_MAX)
    assert.are.equal(expected, (q:scale()))
  end)

  it("update is refused for quantizers that are not delayed", function()
    local q = lutra.quantizer(R.current(), "input")
    assert.has_error(function() q:update() end,
                     "lutra_quantizer_update: quantizer does not use delayed scaling")
    assert.has_error(function() q:record_amax(1) end,
                     "lutra_quantizer_record_amax: quantizer does not use delayed scaling")
    local qm = lutra.quantizer(R.mxfp8(), "input")
    assert.has_error(function() qm:scale() end,
                     "lutra_quantizer_scale: quantizer has per-block scales, not one scale")
  end)
end)

describe("saturation", function()
  it("values above the scaled max give the max code, never inf or NaN", function()
    local vals = {}
    for i = 1, 256 do vals[i] = 0 end
    local big = { 448, 449, 464, 1000, -1e6, 3e38, -math.huge, math.huge, 57344, 60000, -1e5 }
    for i, v in ipairs(big) do vals[i] = v end
    local x = lutra.from_table(vals, { 16, 16 })
    -- delayed quantizers start at scale 1: x is cast as it is
    for _, role in ipairs { "input", "grad_output" } do
      local fmt = role == "input" and "e4m3" or "e5m2"
      local F = FMT[fmt]
      local maxcode = fmt == "e4m3" and 0x7E or 0x7B
      local q = lutra.quantizer(R.delayed(), role)
      local qt = q:quantize(x)
      local b = qt:bytes(false)
      for i, v in ipairs(big) do
        local code = b:byte(i)
        if math.abs(v) > F.max then
          assert.are.equal(v < 0 and (0x80 + maxcode) or maxcode, code,
                           string.format("%s %g", fmt, v))
        end
        local d = C.lutra_decode(F.code, code)
        assert.is_true(d == d and math.abs(d) <= F.max, string.format("%s %g -> %g", fmt, v, d))
      end
      local out = lutra.dequantize(qt, lutra.tensor({ 16, 16 }), false):to_table()
      assert.is_truthy(q ~= nil) -- (keeps q, the owner of qt, alive until here)
      for i = 1, 256 do
        assert.is_true(out[i] == out[i] and math.abs(out[i]) <= F.max)
      end
    end
    assert.are.equal(0x7E, tonumber(C.lutra_encode(E4M3, 449)))
    assert.are.equal(448, C.lutra_dtype_max(E4M3))
    assert.are.equal(57344, C.lutra_dtype_max(E5M2))
  end)

  it("the amax element of current scaling lands exactly on the max code", function()
    local x, xv = randn(16, 64, 901, 7)
    local amax, at = 0, 1
    for i = 1, #xv do if math.abs(xv[i]) > amax then amax, at = math.abs(xv[i]), i end end
    local q = lutra.quantizer(R.current(), "input")
    local code = q:quantize(x):bytes(false):byte(at)
    assert.are.equal(0x7E, code % 0x80)
  end)
end)

describe("quantize errors", function()
  local function msg_of(fn)
    local ok, msg = pcall(fn)
    assert.is_false(ok, "expected an error")
    return tostring(msg)
  end

  it("dims that are not multiples of 16", function()
    local q = lutra.quantizer(R.delayed(), "input")
    q:record_amax(3)
    local m = msg_of(function() q:quantize(lutra.tensor({ 20, 32 })) end)
    assert.is_truthy(m:find("lutra_quantize: FP8 needs both matrix dims to be multiples of 16 (got 20x32)",
                            1, true), m)
    m = msg_of(function() q:quantize(lutra.tensor({ 32, 24 })) end)
    assert.is_truthy(m:find("multiples of 16 (got 32x24)", 1, true), m)
    -- the failed calls left the quantizer as it was
    assert.are.equal(3, q:history(1)[1])
    for _, r in ipairs { R.current(), R.block() } do
      local mm = msg_of(function() lutra.quantizer(r, "input"):quantize(lutra.tensor({ 16, 40 })) end)
      assert.is_truthy(mm:find("multiples of 16", 1, true), mm)
    end
  end)

  it("MXFP8 dims that are not multiples of 32", function()
    local q = lutra.quantizer(R.mxfp8(), "input")
    local m = msg_of(function() q:quantize(lutra.tensor({ 48, 64 })) end)
    assert.is_truthy(m:find("lutra_quantize: FP8 needs both matrix dims to be multiples of 32 (got 48x64)",
                            1, true), m)
    m = msg_of(function() q:quantize(lutra.tensor({ 64, 16 })) end)
    assert.is_truthy(m:find("multiples of 32 (got 64x16)", 1, true), m)
  end)

  it("an i32 tensor cannot be quantized", function()
    for _, r in ipairs { R.delayed(), R.current(), R.mxfp8(), R.block() } do
      local m = msg_of(function() lutra.quantizer(r, "input"):quantize(lutra.tensor({ 32, 32 }, "i32")) end)
      assert.is_truthy(m:find("lutra_quantize: input dtype i32 is not f32, bf16 or f16", 1, true), m)
    end
  end)

  it("dequantize checks its arguments", function()
    local x = randn(32, 32, 5, 1)
    local q = lutra.quantizer(R.current(), "input", { rowwise = true, columnwise = false })
    local qt = q:quantize(x)
    local m = msg_of(function() lutra.dequantize(qt, lutra.tensor({ 32, 32 }), true) end)
    assert.is_truthy(m:find("lutra_dequantize: q has no columnwise data", 1, true), m)
    m = msg_of(function() lutra.dequantize(qt, lutra.tensor({ 32, 16 }), false) end)
    assert.is_truthy(m:find("lutra_dequantize: out has 512 elements, q 1024", 1, true), m)
    m = msg_of(function() lutra.dequantize(x, lutra.tensor({ 32, 32 }), false) end)
    assert.is_truthy(m:find("lutra_dequantize: q is not an FP8 tensor", 1, true), m)
    m = msg_of(function() lutra.quantizer(R.current(), "input", { rowwise = false, columnwise = false }) end)
    assert.is_truthy(m:find("at least one of rowwise and columnwise", 1, true), m)
  end)
end)
