-- Quantization: delayed-scaling updates against a Lua model and hand-computed values, saturation,
-- and argument errors (the other recipes: spec/quantize_spec.lua; the reference helpers:
-- spec/support/quantize_ref.lua).
local lutra = require("lutra")
local ffi = require("ffi")
local C = lutra.C
local R = lutra.recipe
local ref = require("spec.support.quantize_ref")
local FLT_MAX, E4M3, E5M2, FMT, f32 = ref.FLT_MAX, ref.E4M3, ref.E5M2, ref.FMT, ref.f32
local encode, check_both, amax_of, CASES, randn = ref.encode, ref.check_both, ref.amax_of,
  ref.CASES, ref.randn

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
