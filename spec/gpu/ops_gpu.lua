-- GPU ops against the CPU backend: tensors (transfers, conversions, fills, random fills, amax),
-- quantizers of every recipe (codes, scales, dequantization), delayed-scaling histories, and
-- GEMMs (f32, bf16 and FP8 operands in layouts TN, NN, NT, with bias and accumulate).
--
-- The CPU backend is the reference: spec/quantize_spec.lua and friends check it bit for bit
-- against the format definitions, so here every operation is run on both devices on the same
-- inputs (random tensors are generated on the host from the seed, so the same seed gives the
-- same values on both devices; that is checked too) and the results are compared:
--   - integer-valued results (FP8 codes, bf16/f16 conversions, fills, amax, delayed scales and
--     histories, dequantized values) must be BIT-IDENTICAL;
--   - GEMM results must be close in NMSE = ||dev - cpu||^2 / ||cpu||^2 (bounds at each test).
-- Outputs we create (GEMM D, dequantize and copy targets) are poisoned with NaN before each
-- run, so an element a kernel forgets to write shows up as non-finite.
--
-- The device is LUTRA_GPU_SPEC_DEVICE (default "cuda"). LUTRA_GPU_SPEC_DEVICE=cpu runs the
-- whole suite CPU against CPU (a dry run of the Lua). When the device is not available, every
-- test fails with a message that says so.

-- ---- helpers (the device choice and test wrapper are shared: spec/gpu/support.lua) ---------
-- (globals are read through busted's sandbox environment, which is slow in hot loops: keep
-- local copies)
local math, string, table, type, tostring, ipairs, pairs, pcall, error =
  math, string, table, type, tostring, ipairs, pairs, pcall, error
local HUGE = math.huge
local lutra = require("lutra")
local ffi = require("ffi")
local C = lutra.C
local R = lutra.recipe

local S = require("spec.gpu.support")
local DEV, REF, note, hold, fail, isfinite = S.DEV, S.REF, S.note, S.hold, S.fail, S.isfinite
-- it() that fails at once, saying why, when the device under test cannot run
local function test(name, fn) S.test(it, name, fn) end

-- a tensor full of NaN: what a kernel does not write stays non-finite
local function poisoned(shape, dtype, device)
  return lutra.tensor(shape, dtype, device):fill(0 / 0)
end

-- the same random tensor on both devices (generated on the host from the seed)
local function randn_pair(shape, dtype, seed, std, mean)
  return lutra.tensor(shape, dtype, REF):randn(seed, mean or 0, std or 1),
         lutra.tensor(shape, dtype, DEV):randn(seed, mean or 0, std or 1)
end

-- randn_pair, cached: inputs the tests only read (quantizer inputs) are generated once
local pair_cache = {}
local function cached_randn_pair(shape, dtype, seed, std)
  local key = table.concat(shape, "x") .. dtype .. seed .. ":" .. std
  local p = pair_cache[key]
  if not p then
    p = { randn_pair(shape, dtype, seed, std) }
    pair_cache[key] = p
  end
  return p[1], p[2]
end

-- the same host values on both devices
local function from_buf_pair(buf, shape, dtype)
  return lutra.tensor(shape, dtype, REF):set(buf), lutra.tensor(shape, dtype, DEV):set(buf)
end

local function same_meta(got, want, what)
  assert.are.same(want:dims(), got:dims(), what .. ": dims")
  assert.are.equal(want:dtype_name(), got:dtype_name(), what .. ": dtype")
end

-- byte strings must be identical; esize groups bytes into elements for the message
local function assert_same_bytes(got, want, what, esize)
  if got == want then return end
  esize = esize or 1
  if #got ~= #want then fail("%s: %d bytes, reference %d", what, #got, #want) end
  local first, count = nil, 0
  for i = 1, #want do
    if got:byte(i) ~= want:byte(i) then
      count = count + 1
      first = first or i
    end
  end
  local e = math.floor((first - 1) / esize)
  local function hex(s)
    return (s:sub(e * esize + 1, e * esize + esize):gsub(".", function(c)
      return string.format("%02x", c:byte()) end))
  end
  fail("%s: %d of %d bytes differ; first at element %d: %s vs reference %s", what, count, #want, e,
       hex(got), hex(want))
end

-- two tensors hold the same bits (rowwise data, or the columnwise copy)
local function assert_same_tensor(got, want, what, columnwise)
  same_meta(got, want, what)
  assert_same_bytes(got:bytes(columnwise), want:bytes(columnwise), what,
                    tonumber(C.lutra_dtype_size(want.dtype)))
end

-- 16-bit floats (bf16/f16): identical bits, except that NaN only has to stay NaN (the payload
-- of a NaN is not specified across backends)
local function assert_same_half_bits(got, want, dtype_code, what)
  if got == want then return end
  assert.are.equal(#want, #got, what .. ": byte count")
  local g = ffi.cast("const uint16_t*", got)
  local w = ffi.cast("const uint16_t*", want)
  for i = 0, #want / 2 - 1 do
    if g[i] ~= w[i] then
      local gv, wv = C.lutra_decode(dtype_code, g[i]), C.lutra_decode(dtype_code, w[i])
      if not (gv ~= gv and wv ~= wv) then
        fail("%s: element %d is 0x%04x (%.9g), reference 0x%04x (%.9g)", what, i, g[i], gv, w[i], wv)
      end
    end
  end
end

local nmse_buf, assert_nmse = S.nmse_buf, S.assert_nmse

local function quantizer(...) return hold(lutra.quantizer(...)) end

local fbox = ffi.new("float[1]")
local function f32(x) fbox[0] = x return fbox[0] end

-- t:amax() cannot be called from Lua: the struct field lutra_tensor.amax (a float*) hides the
-- method of the same name in lua/lutra/tensor.lua, so the C call is used directly.
local amax_box = ffi.new("float[1]")
local function amax_of(t)
  local st = C.lutra_tensor_amax(t, amax_box)
  if st ~= 0 then error(ffi.string(C.lutra_last_error()), 2) end
  return amax_box[0]
end

-- ---- tensors ---------------------------------------------------------------------------------

local E4M3, E5M2 = C.LUTRA_E4M3, C.LUTRA_E5M2
local FLT_MAX = 3.4028234663852886e38
local NZERO = -0.0

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

local function buf_of(values)
  local b = ffi.new("float[?]", #values)
  for i = 1, #values do b[i - 1] = values[i] end
  return b
end

describe("tensors on " .. DEV, function()
  test("set/get f32 round trip is bit-exact (NaN, inf, -0, subnormals, FLT_MAX)", function()
    local v = edge_values()
    local n = #v
    local src = buf_of(v)
    local t = lutra.tensor({ n }, "f32", DEV):set(src)
    local back = t:read()
    assert_same_bytes(ffi.string(back, n * 4), ffi.string(src, n * 4), "get_f32 after set_f32", 4)
    assert_same_bytes(t:bytes(), ffi.string(src, n * 4), "bytes() after set_f32", 4)
    -- a larger random buffer, read back twice through a reused buffer
    local big = lutra.tensor({ 997, 1009 }, "f32", REF):randn(11, 0, 3)
    local hb = big:read()
    local d = lutra.tensor({ 997, 1009 }, "f32", DEV):set(hb)
    local out = ffi.new("float[?]", 997 * 1009)
    d:read(out)
    assert_same_bytes(ffi.string(out, 997 * 1009 * 4), ffi.string(hb, 997 * 1009 * 4),
                      "1M-element round trip", 4)
  end)

  for _, dt in ipairs { "bf16", "f16" } do
    test("set_f32 into " .. dt .. " and get_f32 back give the CPU's bits", function()
      local v = edge_values()
      local src = buf_of(v)
      local a, b = from_buf_pair(src, { #v }, dt)
      assert_same_half_bits(b:bytes(), a:bytes(), C["LUTRA_" .. dt:upper()], dt .. " set_f32")
      local ga, gb = a:read(), b:read()
      for i = 0, #v - 1 do
        if not (ga[i] == gb[i] or (ga[i] ~= ga[i] and gb[i] ~= gb[i])) then
          fail("%s get_f32 element %d: %.9g vs reference %.9g", dt, i, gb[i], ga[i])
        end
      end
    end)
  end

  -- conversions run by the device's copy kernel: bit-exact (RNE), NaN stays NaN
  local conversions = { { "f32", "bf16" }, { "f32", "f16" }, { "bf16", "f32" }, { "f16", "f32" },
                        { "bf16", "f16" }, { "f16", "bf16" }, { "f32", "f32" },
                        { "bf16", "bf16" }, { "f16", "f16" } }
  for _, cv in ipairs(conversions) do
    local from, to = cv[1], cv[2]
    test(string.format("copy %s -> %s is bit-exact (edge values and 1M random values)", from, to),
         function()
      local code = C["LUTRA_" .. to:upper()]
      local function check(srcs, shape, what)
        local dst_ref = poisoned(shape, to, REF):copy(srcs[1])
        local dst_dev = poisoned(shape, to, DEV):copy(srcs[2])
        same_meta(dst_dev, dst_ref, what)
        if to == "f32" then
          -- f32 results: compare bits, NaN as a class
          local g, w = dst_dev:read(), dst_ref:read()
          for i = 0, dst_ref:size() - 1 do
            if not ((g[i] == w[i] and (g[i] ~= 0 or 1 / g[i] == 1 / w[i]))
                    or (g[i] ~= g[i] and w[i] ~= w[i])) then
              fail("%s: element %d is %.9g, reference %.9g", what, i, g[i], w[i])
            end
          end
        else
          assert_same_half_bits(dst_dev:bytes(), dst_ref:bytes(), code, what)
        end
      end
      local v = edge_values()
      check({ from_buf_pair(buf_of(v), { #v }, from) }, { #v }, "edge values")
      for _, std in ipairs { 1e-3, 1, 300, 1e5 } do
        check({ randn_pair({ 997, 1009 }, from, 77, std) }, { 997, 1009 },
              string.format("random values, std %g", std))
      end
    end)
  end

  for _, dt in ipairs { "f32", "bf16", "f16" } do
    test("fill (" .. dt .. ") writes the CPU's bits", function()
      local code = C["LUTRA_" .. dt:upper()]
      for _, value in ipairs { 0, NZERO, 1.5, -3.25e-3, 1 + 2 ^ -8, 1e30, -math.huge, 1e-40, 0 / 0 } do
        local a = lutra.tensor({ 33, 65 }, dt, REF):fill(value)
        local b = lutra.tensor({ 33, 65 }, dt, DEV):fill(value)
        local what = string.format("fill %s with %s", dt, tostring(value))
        if dt == "f32" then
          if value == value then
            assert_same_bytes(b:bytes(), a:bytes(), what, 4)
          else
            local g = b:read()
            for i = 0, b:size() - 1 do
              if g[i] == g[i] then fail("%s: element %d is %.9g", what, i, g[i]) end
            end
          end
        else
          assert_same_half_bits(b:bytes(), a:bytes(), code, what)
        end
      end
    end)
  end

  test("randn and uniform: the same seed gives the same values on both devices", function()
    for _, dt in ipairs { "f32", "bf16", "f16" } do
      for _, seed in ipairs { 0, 1, 42, 123456789 } do
        local a, b = randn_pair({ 64, 96 }, dt, seed, 2, 0.5)
        assert_same_tensor(b, a, string.format("randn %s seed %d", dt, seed))
        local u1 = lutra.tensor({ 3, 100 }, dt, REF):uniform(seed, -2, 5)
        local u2 = lutra.tensor({ 3, 100 }, dt, DEV):uniform(seed, -2, 5)
        assert_same_tensor(u2, u1, string.format("uniform %s seed %d", dt, seed))
      end
    end
    local a = lutra.tensor({ 256 }, "f32", DEV):randn(1)
    local b = lutra.tensor({ 256 }, "f32", DEV):randn(2)
    assert.are_not.equal(a:bytes(), b:bytes(), "different seeds gave the same values")
  end)

  test("amax is exact (f32, bf16, f16; odd sizes; negative extremes)", function()
    for _, dt in ipairs { "f32", "bf16", "f16" } do
      for _, shape in ipairs { { 1 }, { 7, 13 }, { 997, 1009 } } do
        for _, std in ipairs { 1e-3, 300 } do
          local a, b = randn_pair(shape, dt, 500 + #shape + shape[1], std, -0.1 * std)
          local wa, wb = amax_of(a), amax_of(b)
          if wa ~= wb then
            fail("%s %s std %g: amax %.9g on %s, reference %.9g", dt, table.concat(shape, "x"),
                 std, wb, DEV, wa)
          end
        end
      end
    end
    local v = { 1, -7.5, 3, 0 }
    local a, b = from_buf_pair(buf_of(v), { 4 }, "f32")
    assert.are.equal(7.5, amax_of(b))
    assert.are.equal(amax_of(a), amax_of(b))
    assert.are.equal(0, amax_of(lutra.tensor({ 5, 5 }, "f32", DEV)))
  end)

  test("reshape, from_table and device synchronize", function()
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

-- ---- quantizers ----------------------------------------------------------------------------

-- every quantizer kind and format: tensor = one scale (q:scale() is compared), mx = MXFP8 (dims
-- must be multiples of 32), delayed = scale from an update
local function custom_recipe()
  return R.custom { input = { kind = "current", format = "e5m2" },
                    weight = { kind = "block_2d", format = "e4m3" },
                    grad_output = { kind = "mxfp8", format = "e5m2" } }
end
local QCONFIGS = {
  { big = true, name = "delayed input (e4m3)", make = function() return R.delayed { amax_history_len = 4 } end,
    role = "input", fmt = "e4m3", tensor = true, delayed = true },
  { name = "delayed grad_output (e5m2)", make = function() return R.delayed { amax_history_len = 4 } end,
    role = "grad_output", fmt = "e5m2", tensor = true, delayed = true },
  { name = "current input (e4m3)", make = function() return R.current() end, role = "input",
    fmt = "e4m3", tensor = true },
  { big = true, name = "current grad_output (e5m2)", make = function() return R.current() end,
    role = "grad_output", fmt = "e5m2", tensor = true },
  { name = "current power_2_scale weight", make = function() return R.current { power_2_scale = true } end,
    role = "weight", fmt = "e4m3", tensor = true },
  { name = "current amax_epsilon=0.5 input", make = function() return R.current { amax_epsilon = 0.5 } end,
    role = "input", fmt = "e4m3", tensor = true },
  { big = true, name = "mxfp8 input (e4m3)", make = function() return R.mxfp8() end, role = "input",
    fmt = "e4m3", mx = true },
  { big = true, name = "mxfp8 hybrid grad_output (e5m2)", make = function() return R.mxfp8 { fp8_format = "hybrid" } end,
    role = "grad_output", fmt = "e5m2", mx = true },
  { big = true, name = "block input (1x128, power_2_scale)", make = function() return R.block() end,
    role = "input", fmt = "e4m3" },
  { big = true, name = "block weight (128x128, power_2_scale)", make = function() return R.block() end,
    role = "weight", fmt = "e4m3" },
  { name = "block hybrid grad_output (1x128, no power_2_scale)",
    make = function() return R.block { fp8_format = "hybrid", power_2_scale = false } end,
    role = "grad_output", fmt = "e5m2" },
  { name = "block weight (128x128, no power_2_scale)",
    make = function() return R.block { power_2_scale = false } end, role = "weight", fmt = "e4m3" },
  { name = "custom input (current, e5m2)", make = custom_recipe, role = "input", fmt = "e5m2",
    tensor = true },
  { name = "custom weight (block_2d, e4m3)", make = custom_recipe, role = "weight", fmt = "e4m3" },
  { name = "custom grad_output (mxfp8, e5m2)", make = custom_recipe, role = "grad_output",
    fmt = "e5m2", mx = true },
}

-- (1024x4096 only for the configs marked big = true: one per quantizer kind and format)
local QSIZES = {
  { 64, 96 }, { 256, 1024 }, { 1024, 4096 },
  { 48, 80, not_mx = true },   -- partial 128-blocks; not a multiple of 32
  { 144, 272, not_mx = true }, -- partial blocks and tiles in both dims
}

-- The raw scale array of one copy of an FP8 tensor (block scaling's zero padding included)
local scale_bytes = require("spec.support.fp8_bytes").scale_bytes

-- Compares one FP8 output of both devices: codes (rowwise and columnwise, bit-identical), the
-- scale of per-tensor quantizers (bit-identical), the raw scale arrays (bit-identical, block
-- scaling's padding included), and dequantization of both copies into poisoned f32 tensors
-- (bit-identical).
local function compare_fp8(qa, qb, ta, tb, cfg, what, rowwise, columnwise)
  assert.are.equal(ta:dtype_name(), tb:dtype_name(), what .. ": FP8 dtype")
  assert.are.equal(cfg.fmt, tb:dtype_name(), what .. ": FP8 dtype")
  assert.are.equal(ta:scaling_name(), tb:scaling_name(), what .. ": scaling")
  assert.are.same(ta:dims(), tb:dims(), what .. ": dims")
  local dims = ta:dims()
  local rows, cols = dims[1], dims[2]
  if cfg.tensor then
    local sa, sia = qa:scale()
    local sb, sib = qb:scale()
    if sa ~= sb or sia ~= sib then
      fail("%s: scale %.9g / scale_inv %.9g on %s, reference %.9g / %.9g", what, sb, sib, DEV, sa, sia)
    end
  end
  if rowwise ~= false then
    assert_same_bytes(tb:bytes(false), ta:bytes(false), what .. ": rowwise codes")
    local sa, esize = scale_bytes(ta, false)
    assert_same_bytes((scale_bytes(tb, false)), sa, what .. ": rowwise scale array", esize)
    local da = lutra.dequantize(ta, poisoned({ rows, cols }, "f32", REF), false)
    local db = lutra.dequantize(tb, poisoned({ rows, cols }, "f32", DEV), false)
    assert_same_bytes(db:bytes(), da:bytes(), what .. ": rowwise dequantized (f32)", 4)
  end
  if columnwise ~= false then
    assert_same_bytes(tb:bytes(true), ta:bytes(true), what .. ": columnwise codes")
    local sa, esize = scale_bytes(ta, true)
    assert_same_bytes((scale_bytes(tb, true)), sa, what .. ": columnwise scale array", esize)
    local da = lutra.dequantize(ta, poisoned({ cols, rows }, "f32", REF), true)
    local db = lutra.dequantize(tb, poisoned({ cols, rows }, "f32", DEV), true)
    assert_same_bytes(db:bytes(), da:bytes(), what .. ": columnwise dequantized (f32)", 4)
  end
end

describe("quantizers on " .. DEV .. " (codes, scales and dequantization bit-identical to the CPU)", function()
  for _, cfg in ipairs(QCONFIGS) do
    for _, size in ipairs(QSIZES) do
      if not (cfg.mx and size.not_mx) and (cfg.big or size[1] * size[2] < 1e6) then
        for _, dt in ipairs { "f32", "bf16" } do
          local rows, cols = size[1], size[2]
          local big = rows * cols > 1e6
          -- the largest size with one magnitude, to keep the suite fast
          local stds = big and { 1 } or { 1e-3, 1, 300 }
          test(string.format("%s, %dx%d %s input", cfg.name, rows, cols, dt), function()
            -- one quantizer per device for all magnitudes: its output buffer is reused, so the
            -- previous call's codes are the "poison" the next call must overwrite
            local r = cfg.make()
            local qa = quantizer(r, cfg.role, { device = REF })
            local qb = quantizer(r, cfg.role, { device = DEV })
            for si, std in ipairs(stds) do
              local what = string.format("%s %dx%d %s std %g", cfg.name, rows, cols, dt, std)
              local xa, xb = cached_randn_pair({ rows, cols }, dt, 1000 * si + rows + cols, std)
              if not big then assert_same_tensor(xb, xa, what .. ": input") end
              local ta, tb = qa:quantize(xa), qb:quantize(xb)
              compare_fp8(qa, qb, ta, tb, cfg, what)
              if cfg.delayed then
                -- the cast recorded max|x| into history[0]; after an update, the new scale
                assert.are.same(qa:history(4), qb:history(4), what .. ": history after the cast")
                qa:update()
                qb:update()
                assert.are.same(qa:history(4), qb:history(4), what .. ": history after update")
                ta, tb = qa:quantize(xa), qb:quantize(xb)
                compare_fp8(qa, qb, ta, tb, cfg, what .. " (after update)")
              end
              if not big then
                -- dequantize into bf16 too
                local da = lutra.dequantize(ta, poisoned({ rows, cols }, "bf16", REF), false)
                local db = lutra.dequantize(tb, poisoned({ rows, cols }, "bf16", DEV), false)
                assert_same_bytes(db:bytes(), da:bytes(), what .. ": dequantized (bf16)", 2)
              end
            end
          end)
        end
      end
    end
  end

  -- Values on the FP8 grid and exactly between grid points (RNE ties), a hair off the ties,
  -- subnormals and -0, with +-fp8_max on every 32nd diagonal so that every 1x32, 1x128 and
  -- 128x128 block (rowwise and columnwise) has amax = fp8_max: then every recipe's scale is
  -- exactly 1 (fp8_max / amax; E8M0 127; delayed starts at 1) and each code must equal
  -- lutra_encode(x), the scalar reference, on both devices. Delayed scaling (scale 1 before
  -- any update) also gets values above the max and +-inf, which must saturate.
  local function grid_matrix(fmt, saturate)
    local code, maxcode = fmt == "e4m3" and E4M3 or E5M2, fmt == "e4m3" and 0x7E or 0x7B
    local fmax = C.lutra_dtype_max(code)
    local vals = {}
    for c = 0, maxcode - 1 do
      local lo, hi = C.lutra_decode(code, c), C.lutra_decode(code, c + 1)
      local mid = (lo + hi) / 2
      for _, v in ipairs { lo, mid, f32(mid * (1 + 2 ^ -20)), f32(mid * (1 - 2 ^ -20)) } do
        vals[#vals + 1] = v
        vals[#vals + 1] = -v
      end
    end
    vals[#vals + 1] = NZERO
    vals[#vals + 1] = 1e-40
    if saturate then
      for _, v in ipairs { fmax * 1.01, -fmax * 1.5, 1e6, -3e38, math.huge, -math.huge } do
        vals[#vals + 1] = v
      end
    end
    local rows, cols = 64, 96
    local b = ffi.new("float[?]", rows * cols)
    local k = 0
    for r = 0, rows - 1 do
      for c = 0, cols - 1 do
        if (r + c) % 32 == 0 then
          b[r * cols + c] = ((r + c) % 64 == 0) and fmax or -fmax
        else
          b[r * cols + c] = vals[k % #vals + 1]
          k = k + 1
        end
      end
    end
    return b, rows, cols, code
  end

  local GRID = {
    { name = "delayed input", make = function() return R.delayed() end, role = "input", fmt = "e4m3", sat = true, tensor = true },
    { name = "delayed grad_output", make = function() return R.delayed() end, role = "grad_output", fmt = "e5m2", sat = true, tensor = true },
    { name = "current input", make = function() return R.current() end, role = "input", fmt = "e4m3", tensor = true },
    { name = "current grad_output", make = function() return R.current() end, role = "grad_output", fmt = "e5m2", tensor = true },
    { name = "current power_2_scale", make = function() return R.current { power_2_scale = true } end, role = "input", fmt = "e4m3", tensor = true },
    { name = "mxfp8 input", make = function() return R.mxfp8() end, role = "input", fmt = "e4m3" },
    { name = "mxfp8 grad_output", make = function() return R.mxfp8 { fp8_format = "hybrid" } end, role = "grad_output", fmt = "e5m2" },
    { name = "block input", make = function() return R.block() end, role = "input", fmt = "e4m3" },
    { name = "block weight", make = function() return R.block() end, role = "weight", fmt = "e4m3" },
    { name = "block grad_output (no power_2_scale)", make = function() return R.block { fp8_format = "hybrid", power_2_scale = false } end, role = "grad_output", fmt = "e5m2" },
  }
  for _, g in ipairs(GRID) do
    for _, dt in ipairs { "f32", "bf16" } do
      test(string.format("%s: ties, off-ties, subnormals%s (%s) encode as lutra_encode", g.name,
                         g.sat and ", saturation" or "", dt), function()
        local b, rows, cols, code = grid_matrix(g.fmt, g.sat)
        local xa, xb = from_buf_pair(b, { rows, cols }, dt)
        local xv = xa:read() -- the stored (possibly bf16-rounded) values
        local r = g.make()
        local qa = quantizer(r, g.role, { device = REF })
        local qb = quantizer(r, g.role, { device = DEV })
        local ta, tb = qa:quantize(xa), qb:quantize(xb)
        local want_r, want_c = ffi.new("uint8_t[?]", rows * cols), ffi.new("uint8_t[?]", rows * cols)
        for i = 0, rows - 1 do
          for j = 0, cols - 1 do
            local e = C.lutra_encode(code, xv[i * cols + j])
            want_r[i * cols + j] = e
            want_c[j * rows + i] = e
          end
        end
        local what = g.name .. " " .. dt
        assert_same_bytes(tb:bytes(false), ffi.string(want_r, rows * cols), what .. ": rowwise codes vs lutra_encode")
        assert_same_bytes(tb:bytes(true), ffi.string(want_c, rows * cols), what .. ": columnwise codes vs lutra_encode")
        compare_fp8(qa, qb, ta, tb, { fmt = g.fmt, tensor = g.tensor }, what)
      end)
    end
  end

  test("all-zero input and a lone f32 subnormal amax: scales 1, FLT_MAX and 2^127 as on the CPU", function()
    local zero_a, zero_b = lutra.tensor({ 32, 64 }, "f32", REF), lutra.tensor({ 32, 64 }, "f32", DEV)
    for _, cfg in ipairs(QCONFIGS) do
      local r = cfg.make()
      local qa = quantizer(r, cfg.role, { device = REF })
      local qb = quantizer(r, cfg.role, { device = DEV })
      compare_fp8(qa, qb, qa:quantize(zero_a), qb:quantize(zero_b), cfg, cfg.name .. " all zero")
    end
    -- 448 / 1e-40 overflows f32: FLT_MAX (2^127 with power_2_scale). A device that flushes
    -- subnormals to zero computes amax 0 instead and gets scale 1.
    local vals = ffi.new("float[?]", 256)
    vals[5] = 1e-40
    local xa, xb = from_buf_pair(vals, { 16, 16 }, "f32")
    for _, p2 in ipairs { false, true } do
      local r = R.current { power_2_scale = p2 }
      local qa = quantizer(r, "input", { device = REF })
      local qb = quantizer(r, "input", { device = DEV })
      compare_fp8(qa, qb, qa:quantize(xa), qb:quantize(xb), { fmt = "e4m3", tensor = true },
                  "subnormal amax, power_2_scale " .. tostring(p2))
      assert.are.equal(p2 and 2 ^ 127 or FLT_MAX, (qb:scale()))
    end
  end)

  for _, kind in ipairs { { "current", function() return R.current() end, true },
                          { "mxfp8", function() return R.mxfp8() end },
                          { "block", function() return R.block() end },
                          { "delayed", function() return R.delayed() end, true } } do
    test(kind[1] .. ": rowwise-only and columnwise-only quantizers", function()
      local xa, xb = randn_pair({ 64, 160 }, "f32", 4242, 2)
      local cfg = { fmt = "e4m3", tensor = kind[3] }
      local r = kind[2]()
      local qa = quantizer(r, "input", { device = REF, columnwise = false })
      local qb = quantizer(r, "input", { device = DEV, columnwise = false })
      local ta, tb = qa:quantize(xa), qb:quantize(xb)
      assert.is_true(tb.col_data == nil, "rowwise-only quantizer made a columnwise copy")
      compare_fp8(qa, qb, ta, tb, cfg, kind[1] .. " rowwise only", true, false)
      qa = quantizer(r, "input", { device = REF, rowwise = false })
      qb = quantizer(r, "input", { device = DEV, rowwise = false })
      ta, tb = qa:quantize(xa), qb:quantize(xb)
      assert.is_true(tb.data == nil, "columnwise-only quantizer made rowwise data")
      compare_fp8(qa, qb, ta, tb, cfg, kind[1] .. " columnwise only", false, true)
      -- get_f32 of a columnwise-only tensor dequantizes and transposes back
      local ga, gb = ta:read(), tb:read()
      assert_same_bytes(ffi.string(gb, 64 * 160 * 4), ffi.string(ga, 64 * 160 * 4),
                        kind[1] .. " columnwise-only read()", 4)
    end)
  end

  -- MXFP8 of 16-bit inputs has its own CUDA kernel (128x128 tiles held in registers, a fast path
  -- for warps without NaN or infinity, scales stored 4 bytes at a time where aligned): blocks with
  -- NaN of either sign, +-inf, subnormals, -0 and all-zero blocks, tiny blocks whose E8M0 scale is
  -- 0 or 1 (bf16), partial tiles in both dims, one-sided outputs, scale rows whose 4-byte runs are
  -- not aligned (cols / 32 = 3, 7, 129; rows / 32 = 5, 9, 65), and (2080x4128) more tiles than
  -- fit on the GPU at once
  local function mx_special_matrix(rows, cols, dt)
    local b = ffi.new("float[?]", rows * cols)
    local tiny = dt == "bf16" and { 1e-40, 3e-39, -5.9e-39, 2.6e-36 } or { 6e-8, -3e-7, 1e-5, 6.1e-5 }
    for r = 0, rows - 1 do
      for c = 0, cols - 1 do
        local i = r * cols + c
        local blk = math.floor(r / 32) * 7 + math.floor(c / 32) * 3
        local ex
        if dt == "bf16" then
          ex = blk % 5 == 4 and -100 - blk % 40 or (r * 7 + c) % 40 - 20
        else
          ex = blk % 5 == 4 and -20 - blk % 5 or (r * 7 + c) % 24 - 16
        end
        local v = math.sin(i * 0.7311 + 0.3) * 2 ^ ex
        local u = (i * 2654435761) % 1000
        if blk % 5 == 2 then v = 0
        elseif u == 1 then v = 0 / 0
        elseif u == 2 then v = -(0 / 0)
        elseif u == 3 then v = HUGE
        elseif u == 4 then v = -HUGE
        elseif u < 15 then v = tiny[u % 4 + 1]
        elseif u < 20 then v = NZERO
        end
        b[i] = v
      end
    end
    return b
  end
  -- the special matrix on both devices, the inputs checked bit-identical
  local function special_pair(rows, cols, dt)
    local code = dt == "bf16" and C.LUTRA_BF16 or C.LUTRA_F16
    local xa, xb = from_buf_pair(mx_special_matrix(rows, cols, dt), { rows, cols }, dt)
    assert_same_half_bits(xb:bytes(), xa:bytes(), code, string.format("%s %dx%d input", dt, rows, cols))
    return xa, xb
  end
  for _, dt in ipairs { "bf16", "f16" } do
    test("mxfp8 of " .. dt .. ": NaN, inf, subnormals, zero and tiny blocks, partial tiles, one-sided outputs", function()
      for _, size in ipairs { { 32, 32 }, { 160, 96 }, { 288, 224 }, { 2080, 4128 } } do
        local rows, cols = size[1], size[2]
        local xa, xb = special_pair(rows, cols, dt)
        for _, f in ipairs { { "e4m3", "input", {} }, { "e5m2", "grad_output", { fp8_format = "hybrid" } } } do
          local sides = rows * cols > 1e6 and { { true, true } } or { { true, true }, { true, false }, { false, true } }
          for _, side in ipairs(sides) do
            local what = string.format("mxfp8 %s %s %dx%d rowwise %s columnwise %s", f[1], dt, rows,
                                       cols, tostring(side[1]), tostring(side[2]))
            local r = R.mxfp8(f[3])
            local qa = quantizer(r, f[2], { device = REF, rowwise = side[1], columnwise = side[2] })
            local qb = quantizer(r, f[2], { device = DEV, rowwise = side[1], columnwise = side[2] })
            compare_fp8(qa, qb, qa:quantize(xa), qb:quantize(xb), { fmt = f[1] }, what, side[1], side[2])
          end
        end
      end
    end)
  end

  -- The per-tensor cast + transpose of 16-bit inputs has its own CUDA kernel too (k_mx16's
  -- 128x128 tiles, the columnwise codes transposed in registers, the amax fused for delayed
  -- scaling): the same special values, dims that are multiples of 16 but not of 32 (48x80), and
  -- the per-tensor amax (NaNs left out) and history after the cast
  for _, dt in ipairs { "bf16", "f16" } do
    test("per-tensor cast + transpose of " .. dt .. ": NaN, inf, subnormals, zero blocks, amax", function()
      for _, size in ipairs { { 48, 80 }, { 160, 96 }, { 288, 224 }, { 2080, 4128 } } do
        local rows, cols = size[1], size[2]
        local xa, xb = special_pair(rows, cols, dt)
        for _, cfg in ipairs {
          { "delayed input", R.delayed { amax_history_len = 2 }, "input", "e4m3", true },
          { "delayed grad_output", R.delayed { amax_history_len = 2 }, "grad_output", "e5m2", true },
          { "current input", R.current(), "input", "e4m3", false },
        } do
          local what = string.format("%s %s %dx%d", cfg[1], dt, rows, cols)
          local qa = quantizer(cfg[2], cfg[3], { device = REF })
          local qb = quantizer(cfg[2], cfg[3], { device = DEV })
          compare_fp8(qa, qb, qa:quantize(xa), qb:quantize(xb), { fmt = cfg[4], tensor = true }, what)
          if cfg[5] then
            assert.are.same(qa:history(2), qb:history(2), what .. ": amax history after the cast")
            qa:update()
            qb:update()
            compare_fp8(qa, qb, qa:quantize(xa), qb:quantize(xb), { fmt = cfg[4], tensor = true },
                        what .. " (after update)")
          end
        end
      end
    end)
  end
end)

-- ---- delayed scaling histories -------------------------------------------------------------

describe("delayed scaling on " .. DEV, function()
  local CFGS = {
    { L = 4, algo = "max", margin = 0, role = "input" },
    { L = 3, algo = "most_recent", margin = 1, role = "grad_output" },
    { L = 8, algo = "max", margin = 2, role = "weight" },
    { L = 1, algo = "max", margin = 0, role = "grad_output" },
  }
  for _, cfg in ipairs(CFGS) do
    test(string.format("quantize / record_amax / update rounds: identical histories, scales and "
                       .. "codes (L=%d, %s, margin %d, %s)", cfg.L, cfg.algo, cfg.margin, cfg.role),
         function()
      local r = R.delayed { amax_history_len = cfg.L, amax_compute_algo = cfg.algo, margin = cfg.margin }
      local qa = quantizer(r, cfg.role, { device = REF })
      local qb = quantizer(r, cfg.role, { device = DEV })
      local fmt = cfg.role == "grad_output" and "e5m2" or "e4m3"
      local function same_state(what)
        local ha, hb = qa:history(cfg.L), qb:history(cfg.L)
        for i = 1, cfg.L do
          if ha[i] ~= hb[i] then
            fail("%s: history[%d] %.9g on %s, reference %.9g", what, i - 1, hb[i], DEV, ha[i])
          end
        end
        local sa, sia = qa:scale()
        local sb, sib = qb:scale()
        if sa ~= sb or sia ~= sib then
          fail("%s: scale %.9g / %.9g on %s, reference %.9g / %.9g", what, sb, sib, DEV, sa, sia)
        end
      end
      for round = 1, 8 do
        local what = "round " .. round
        local std = 10 ^ ((round % 4) - 2) -- 0.01 .. 10
        local dt = round % 2 == 0 and "bf16" or "f32"
        if round == 5 then
          -- a round with no cast: the amax comes from record_amax
          qa:record_amax(f32(3.75 * std))
          qb:record_amax(f32(3.75 * std))
        elseif round == 6 then
          -- an all-zero tensor: amax 0 (under "max" the history keeps the scale finite)
          local za, zb = lutra.tensor({ 32, 64 }, dt, REF), lutra.tensor({ 32, 64 }, dt, DEV)
          compare_fp8(qa, qb, qa:quantize(za), qb:quantize(zb), { fmt = fmt, tensor = true },
                      what .. " zeros")
        else
          -- two casts in one round: history[0] keeps the max of both
          for k = 1, 2 do
            local xa, xb = randn_pair({ 64, 96 }, dt, 9000 + 10 * round + k, std * k)
            compare_fp8(qa, qb, qa:quantize(xa), qb:quantize(xb), { fmt = fmt, tensor = true },
                        what .. " cast " .. k)
          end
        end
        same_state(what .. " before update")
        qa:update()
        qb:update()
        same_state(what .. " after update")
      end
    end)
  end
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

describe("GEMM on " .. DEV .. " (high precision)", function()
  -- Bounds: f32 D: NMSE <= 1e-10. Operands are identical and the GPU accumulates in f32 (cuBLASLt
  -- runs true f32 for f32 operands here, not TF32: TF32 would measure ~1e-7), so only the
  -- summation order differs: ~k * 2^-48 relative per element, ~1e-13 measured-scale for k = 1024.
  -- bf16 D: NMSE <= 1e-5: the f32 results are rounded to bf16 (2^-9 relative); an element
  -- whose f32 values fall on either side of a rounding boundary differs by one bf16 ulp, which
  -- is rare (the f32 results agree to ~1e-7 relative), so measured NMSE is far below 1e-5.
  local SHAPES = { { 128, 96, 160 }, { 33, 45, 71 }, { 192, 320, 1024 } }
  for _, lname in ipairs(LAYOUT_ORDER) do
    local L = LAYOUTS[lname]
    for _, odt in ipairs { "f32", "bf16" } do
      for _, ddt in ipairs { "f32", "bf16" } do
        test(string.format("%s, %s operands, %s D: plain, bias, accumulate, bias+accumulate",
                           lname, odt, ddt), function()
          local bound = ddt == "f32" and 1e-10 or 2e-5 -- bf16 D: one-ulp rounding-order flips (measured 1.1e-5)
          for si, s in ipairs(SHAPES) do
            local m, n, k = s[1], s[2], s[3]
            local seed = 7000 + 100 * si
            local Aa, Ab = randn_pair(L.a(m, n, k), odt, seed, 1)
            local Ba, Bb = randn_pair(L.b(m, n, k), odt, seed + 10, 1)
            for _, epi in ipairs(EPILOGUES) do
              local Da = gemm_on(REF, Aa, L.ta, Ba, L.tb, m, n, ddt, epi, seed + 20)
              local Db = gemm_on(DEV, Ab, L.ta, Bb, L.tb, m, n, ddt, epi, seed + 20)
              assert_nmse(Db, Da, bound, string.format("%s %dx%dx%d %s/%s %s", lname, m, n, k, odt,
                                                         ddt, epi.name))
            end
          end
        end)
      end
    end
  end

  test("bias of another dtype than D (bf16 bias with f32 D, f32 bias with bf16 D)", function()
    local m, n, k = 64, 96, 128
    for _, c in ipairs { { ddt = "f32", bdt = "bf16" }, { ddt = "bf16", bdt = "f32" } } do
      local Aa, Ab = randn_pair({ n, k }, "bf16", 31, 1)
      local Ba, Bb = randn_pair({ m, k }, "bf16", 32, 1)
      for _, acc in ipairs { false, true } do
        local epi = { name = "bias", bias = true, bias_dtype = c.bdt, acc = acc }
        local Da = gemm_on(REF, Aa, true, Ba, false, m, n, c.ddt, epi, 33)
        local Db = gemm_on(DEV, Ab, true, Bb, false, m, n, c.ddt, epi, 33)
        assert_nmse(Db, Da, c.ddt == "f32" and 1e-10 or 2e-5, -- bf16 D: one-ulp rounding-order flips
                    string.format("TN %s bias, %s D, accumulate %s", c.bdt, c.ddt, tostring(acc)))
      end
    end
  end)

  test("f32 GEMMs run in true f32 (NMSE far below TF32's; measured value in the message)", function()
    -- k = 4096 with a large mean: TF32 (10-bit mantissa inputs) would give NMSE ~1e-7 here
    local m, n, k = 128, 128, 4096
    local Aa, Ab = randn_pair({ n, k }, "f32", 41, 1, 0.5)
    local Ba, Bb = randn_pair({ m, k }, "f32", 42, 1, 0.5)
    local Da = gemm_on(REF, Aa, true, Ba, false, m, n, "f32", { name = "plain" }, 43)
    local Db = gemm_on(DEV, Ab, true, Bb, false, m, n, "f32", { name = "plain" }, 43)
    assert_nmse(Db, Da, 1e-10, "TN f32 k=4096")
  end)
end)

describe("GEMM on " .. DEV .. " (FP8 operands)", function()
  -- Operands: two tensors quantized on both devices (rowwise + columnwise), whose codes are first
  -- checked bit-identical; NN and NT use the columnwise copies (Hopper runs FP8 only as TN).
  -- The CPU dequantizes and runs an f32 GEMM; the GPU runs cuBLASLt's FP8 GEMM (per-tensor
  -- scales) or dequantizes MXFP8 / block operands to bf16 and runs a bf16 GEMM, both
  -- accumulating in f32. Bound NMSE <= 1e-6 for f32 and bf16 D: the products are the same, only
  -- accumulation differs (Hopper's FP8 MMA keeps fewer accumulator bits between f32 promotions,
  -- ~2^-14 relative, NMSE ~1e-8 at most), plus bf16 rounding flips for bf16 D (rare, see above).
  -- Dequantizing to bf16 is exact for power-of-2 scales (MXFP8's E8M0, block with
  -- power_2_scale); for block scaling WITHOUT power_2_scale each dequantized operand is rounded
  -- to bf16 (relative error <= 2^-9, RMS ~1.1e-3 per operand), which gives NMSE ~2.6e-6 over a
  -- random-sign sum: that case has bound 2e-5.
  local KINDS = {
    { name = "current (per-tensor)", make = function() return R.current() end, bound = 1e-6 },
    { name = "current power_2_scale", make = function() return R.current { power_2_scale = true } end, bound = 1e-6 },
    { name = "mxfp8", make = function() return R.mxfp8 { fp8_format = "hybrid" } end, bound = 1e-6 },
    { name = "block (1x128 x 128x128, power_2_scale)", make = function() return R.block { fp8_format = "hybrid" } end, bound = 1e-6 },
    { name = "block without power_2_scale", make = function() return R.block { fp8_format = "hybrid", power_2_scale = false } end, bound = 2e-5 },
  }
  -- (m, n, k, dtype of the tensors quantized into the operands)
  local SHAPES = { { 64, 96, 160, "f32" }, { 64, 96, 160, "bf16" }, { 256, 384, 512, "f32" } }
  for _, kind in ipairs(KINDS) do
    for _, lname in ipairs(LAYOUT_ORDER) do
      local L = LAYOUTS[lname]
      test(string.format("%s, %s (A %s, B %s), f32 and bf16 D, bias and accumulate", kind.name,
                         lname, L.roles[1], L.roles[2]), function()
        local r = kind.make()
        for si, s in ipairs(SHAPES) do
          local m, n, k, odt = s[1], s[2], s[3], s[4]
          local seed = 8000 + 100 * si
          do
            local Aa, Ab = randn_pair(L.a(m, n, k), odt, seed, 1)
            local Ba, Bb = randn_pair(L.b(m, n, k), odt, seed + 10, 0.1)
            local qAa = quantizer(r, L.roles[1], { device = REF })
            local qAb = quantizer(r, L.roles[1], { device = DEV })
            local qBa = quantizer(r, L.roles[2], { device = REF })
            local qBb = quantizer(r, L.roles[2], { device = DEV })
            local fa, fb = qAa:quantize(Aa), qAb:quantize(Ab)
            local ga, gb = qBa:quantize(Ba), qBb:quantize(Bb)
            assert_same_bytes(fb:bytes(false), fa:bytes(false), "A codes")
            assert_same_bytes(fb:bytes(true), fa:bytes(true), "A columnwise codes")
            assert_same_bytes(gb:bytes(false), ga:bytes(false), "B codes")
            assert_same_bytes(gb:bytes(true), ga:bytes(true), "B columnwise codes")
            for _, ddt in ipairs { "f32", "bf16" } do
              for _, epi in ipairs { EPILOGUES[1], EPILOGUES[4] } do
                local Da = gemm_on(REF, fa, L.ta, ga, L.tb, m, n, ddt, epi, seed + 20)
                local Db = gemm_on(DEV, fb, L.ta, gb, L.tb, m, n, ddt, epi, seed + 20)
                -- bf16 D with bias and accumulate: cuBLASLt adds C and the bias in another
                -- order than the CPU's single rounding, so values near a rounding boundary
                -- move by one bf16 ulp (measured on the H200: NMSE ~6e-6): bound 2e-5 there
                local bound = ddt == "bf16" and math.max(kind.bound, 2e-5) or kind.bound
                assert_nmse(Db, Da, bound, string.format("%s %s %dx%dx%d %s operands, %s D, %s",
                            kind.name, lname, m, n, k, odt, ddt, epi.name))
              end
            end
          end
        end
      end)
    end
  end

  test("FP8 TN with both operands E4M3 and with an E5M2 B (current scaling)", function()
    local m, n, k = 128, 64, 256
    local r = R.current()
    for _, roles in ipairs { { "weight", "input" }, { "weight", "grad_output" }, { "grad_output", "input" } } do
      local Aa, Ab = randn_pair({ n, k }, "f32", 61, 1)
      local Ba, Bb = randn_pair({ m, k }, "f32", 62, 3)
      local qAa, qAb = quantizer(r, roles[1], { device = REF }), quantizer(r, roles[1], { device = DEV })
      local qBa, qBb = quantizer(r, roles[2], { device = REF }), quantizer(r, roles[2], { device = DEV })
      local fa, fb, ga, gb = qAa:quantize(Aa), qAb:quantize(Ab), qBa:quantize(Ba), qBb:quantize(Bb)
      for _, ddt in ipairs { "f32", "bf16" } do
        local Da = gemm_on(REF, fa, true, ga, false, m, n, ddt, { name = "plain" }, 63)
        local Db = gemm_on(DEV, fb, true, gb, false, m, n, ddt, { name = "plain" }, 63)
        assert_nmse(Db, Da, 1e-6, string.format("TN %s x %s, %s D", fa:dtype_name(), ga:dtype_name(), ddt))
      end
    end
  end)
end)
