-- Quantization: per-tensor current scaling, MXFP8, block scaling and custom recipes; round trips
-- within the format's error bound and bit-level checks of scales and FP8 codes against values
-- recomputed in Lua (spec/support/quantize_ref.lua, from TransformerEngine's definitions; the only
-- library helper used for expected values is the scalar codec lutra_encode, the bit-exact
-- reference every backend is specified against). Delayed scaling, saturation and argument errors:
-- spec/quantize_delayed_spec.lua.
local lutra = require("lutra")
local ffi = require("ffi")
local R = lutra.recipe
local ref = require("spec.support.quantize_ref")
local FLT_MAX, FMT, f32, pow2floor, scale_rule = ref.FLT_MAX, ref.FMT, ref.f32, ref.pow2floor,
  ref.scale_rule
local round4, view, stored_scales, check_output = ref.round4, ref.view, ref.stored_scales,
  ref.check_output
local check_both, amax_of, CASES, randn = ref.check_both, ref.amax_of, ref.CASES, ref.randn

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
