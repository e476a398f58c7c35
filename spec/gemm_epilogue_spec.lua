-- GEMM epilogues (lutra.gemm_ex, lutra_gemm_ex in lutra.h) on the CPU backend against references
-- computed in double on the Lua side, from fresh random inputs (f32 and bf16 values are exact in
-- double, FP8 operands are read back dequantized):
--   P = op(B) op(A) (+ bias)                   per element, s = sum_k |op(B)[i,k] op(A)[k,j]| + |bias|
--   GELU      D = gelu(P)                      gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
--   GELU_AUX  D = gelu(P), aux = P
--   DGELU     D = P * gelu'(aux)
--   DGELU_BGRAD  and dbias[j] = sum_i D[i,j] (of the f32 values, before D's rounding)
--   BGRADB    D = P (+ D_old), dbias[i] = sum_k op(B)[i,k]
--
-- Tolerances, elementwise (the f32 GEMM is within 1e-5 * s, as spec/linear_spec.lua states):
--   aux / plain D:  |got - ref| <= 1e-5 s + 1e-6
--   GELU D:         |got - ref| <= 2e-5 s + 1e-5 |ref| + 1e-6   (|gelu'| <= 1.13 carries the GEMM
--                   error; the f32 formula adds ~2^-24 |2u| relative through exp(-2u))
--   DGELU D:        |got - ref| <= 1e-5 (s |gelu'(aux)| + |P|) + 1e-6   (GEMM error scaled by
--                   gelu', and gelu' evaluated in f32)
--   plus, for a bf16 output, 2^-8 |ref| (one rounding: 2^-9 relative, doubled).
--   DGELU_BGRAD dbias: the sum over the column of the f32 parts of D's tolerances (the sums are
--                   taken in double from the f32 values), plus one rounding of dbias.
--   BGRADB dbias:   summed in double from B's exact values and rounded once: 2^-24 |ref| (f32),
--                   2^-8 |ref| (bf16), plus 1e-12 sum |B|.
local lutra = require("lutra")

local C0, A0 = math.sqrt(2 / math.pi), 0.044715
local function gelu(x) return 0.5 * x * (1 + math.tanh(C0 * (x + A0 * x ^ 3))) end
local function gelu_grad(x)
  local t = math.tanh(C0 * (x + A0 * x ^ 3))
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * C0 * (1 + 3 * A0 * x * x)
end

-- stored shapes for D [m, n] = op(B) [m, k] op(A) [k, n], TransformerEngine's layout names
local GL = require("spec.support.gemm_layouts")
local LAYOUTS, LAYOUT_ORDER = GL.LAYOUTS, GL.ORDER

-- op(X)[i][j] (0-based) of a flat row-major table of a matrix stored [rows, cols]
local function op_get(v, cols, trans)
  if trans then return function(i, j) return v[j * cols + i + 1] end end
  return function(i, j) return v[i * cols + j + 1] end
end

-- P [m, n] in double and the per-element scale s; A, B are the values as flat tables
local function ref_gemm(av, bv, L, m, n, k, bias)
  local ashape, bshape = L.a(m, n, k), L.b(m, n, k)
  local opa, opb = op_get(av, ashape[2], L.ta), op_get(bv, bshape[2], L.tb)
  local p, s = {}, {}
  for i = 0, m - 1 do
    for j = 0, n - 1 do
      local acc, mag = 0, 0
      for kk = 0, k - 1 do
        local t = opb(i, kk) * opa(kk, j)
        acc, mag = acc + t, mag + math.abs(t)
      end
      if bias then acc, mag = acc + bias[j + 1], mag + math.abs(bias[j + 1]) end
      p[i * n + j + 1], s[i * n + j + 1] = acc, mag
    end
  end
  return p, s, opb
end

local function check_close(got, ref, tol, what)
  assert.are.equal(#ref, #got, what .. ": element count")
  for i = 1, #ref do
    if not (math.abs(got[i] - ref[i]) <= tol[i]) then
      error(string.format("%s: element %d is %.9g, reference %.9g (tolerance %.3g)", what, i,
                          got[i], ref[i], tol[i]), 2)
    end
  end
end

local BF16_REL = 2 ^ -8
local function round_rel(dt) return dt == "bf16" and BF16_REL or 0 end

-- one epilogue on fresh inputs; returns nothing, fails on a mismatch
local function run_case(kind, lname, odt, ddt, m, n, k, seed, opts)
  opts = opts or {}
  local L = LAYOUTS[lname]
  local A = lutra.tensor(L.a(m, n, k), odt):randn(seed)
  local B = lutra.tensor(L.b(m, n, k), odt):randn(seed + 1, 0, 0.5)
  local av, bv = A:to_table(), B:to_table()
  local what = string.format("%s %s %dx%dx%d %s operands, %s D", kind, lname, m, n, k, odt, ddt)
  local D = lutra.tensor({ m, n }, ddt):fill(0 / 0)
  local bias, biasv
  if opts.bias then
    bias = lutra.tensor({ n }, opts.bias):randn(seed + 2, 0.25, 1)
    biasv = bias:to_table()
  end
  local rel = round_rel(ddt)

  if kind == "gelu" or kind == "gelu_aux" then
    local aux = kind == "gelu_aux" and lutra.tensor({ m, n }, ddt):fill(0 / 0) or nil
    local ret = lutra.gemm_ex(A, L.ta, B, L.tb, D, { epilogue = kind, bias = bias, aux = aux })
    assert.are.equal(D, ret)
    local p, s = ref_gemm(av, bv, L, m, n, k, biasv)
    local ref, tol = {}, {}
    for i = 1, #p do
      ref[i] = gelu(p[i])
      tol[i] = 2e-5 * s[i] + 1e-5 * math.abs(ref[i]) + 1e-6 + rel * math.abs(ref[i])
    end
    check_close(D:to_table(), ref, tol, what .. " D")
    if aux then
      local atol = {}
      for i = 1, #p do atol[i] = 1e-5 * s[i] + 1e-6 + rel * math.abs(p[i]) end
      check_close(aux:to_table(), p, atol, what .. " aux")
    end
  elseif kind == "dgelu" or kind == "dgelu_bgrad" then
    local aux = lutra.tensor({ m, n }, ddt):randn(seed + 3, 0, 2)
    local auxv = aux:to_table()
    local dbias = kind == "dgelu_bgrad" and lutra.tensor({ n }, opts.dbias or ddt):fill(0 / 0) or nil
    lutra.gemm_ex(A, L.ta, B, L.tb, D, { epilogue = kind, aux = aux, dbias = dbias })
    local p, s = ref_gemm(av, bv, L, m, n, k)
    local ref, tol, ftol = {}, {}, {}
    for i = 1, #p do
      local g = gelu_grad(auxv[i])
      ref[i] = p[i] * g
      ftol[i] = 1e-5 * (s[i] * math.abs(g) + math.abs(p[i])) + 1e-6
      tol[i] = ftol[i] + rel * math.abs(ref[i])
    end
    check_close(D:to_table(), ref, tol, what .. " D")
    assert.are.same(auxv, aux:to_table(), what .. ": aux (an input) was changed")
    if dbias then
      local dref, dtol = {}, {}
      local drel = dbias:dtype_name() == "bf16" and BF16_REL or 2 ^ -23
      for j = 1, n do
        local acc, t = 0, 0
        for i = 0, m - 1 do acc, t = acc + ref[i * n + j], t + ftol[i * n + j] end
        dref[j], dtol[j] = acc, t + drel * math.abs(acc)
      end
      check_close(dbias:to_table(), dref, dtol, what .. " dbias")
    end
  elseif kind == "bgradb" then
    local dold
    if opts.accumulate then
      D = lutra.tensor({ m, n }, ddt):randn(seed + 4)
      dold = D:to_table()
    end
    local dbias = lutra.tensor({ m }, opts.dbias or ddt):fill(0 / 0)
    lutra.gemm_ex(A, L.ta, B, L.tb, D, { epilogue = "bgradb", dbias = dbias,
                                         accumulate = opts.accumulate })
    local p, s, opb = ref_gemm(av, bv, L, m, n, k)
    local tol = {}
    for i = 1, #p do
      if dold then p[i], s[i] = p[i] + dold[i], s[i] + math.abs(dold[i]) end
      tol[i] = 1e-5 * s[i] + 1e-6 + rel * math.abs(p[i])
    end
    check_close(D:to_table(), p, tol, what .. " D")
    local dref, dtol = {}, {}
    local drel = dbias:dtype_name() == "bf16" and BF16_REL or 2 ^ -24
    for i = 0, m - 1 do
      local acc, mag = 0, 0
      for kk = 0, k - 1 do acc, mag = acc + opb(i, kk), mag + math.abs(opb(i, kk)) end
      dref[i + 1], dtol[i + 1] = acc, drel * math.abs(acc) + 1e-12 * mag
    end
    check_close(dbias:to_table(), dref, dtol, what .. " dbias")
  else
    error("unknown kind " .. kind)
  end
end

local SHAPES = { { 9, 13, 17 }, { 32, 40, 64 } }

describe("lutra.gemm_ex epilogues (CPU, against double references)", function()
  local seed = 9100
  for _, lname in ipairs(LAYOUT_ORDER) do
    for _, dt in ipairs { "f32", "bf16" } do
      it(string.format("GELU and GELU_AUX, %s, %s, with and without bias", lname, dt), function()
        for _, s in ipairs(SHAPES) do
          for _, kind in ipairs { "gelu", "gelu_aux" } do
            seed = seed + 10
            run_case(kind, lname, dt, dt, s[1], s[2], s[3], seed)
            run_case(kind, lname, dt, dt, s[1], s[2], s[3], seed + 5, { bias = dt })
          end
        end
      end)

      it(string.format("DGELU and DGELU_BGRAD (f32 and bf16 dbias), %s, %s", lname, dt), function()
        for _, s in ipairs(SHAPES) do
          seed = seed + 10
          run_case("dgelu", lname, dt, dt, s[1], s[2], s[3], seed)
          run_case("dgelu_bgrad", lname, dt, dt, s[1], s[2], s[3], seed + 5)
          run_case("dgelu_bgrad", lname, dt, dt, s[1], s[2], s[3], seed + 7,
                   { dbias = dt == "f32" and "bf16" or "f32" })
        end
      end)

      it(string.format("BGRADB (f32 and bf16 dbias, with accumulate), %s, %s", lname, dt), function()
        for _, s in ipairs(SHAPES) do
          seed = seed + 10
          run_case("bgradb", lname, dt, dt, s[1], s[2], s[3], seed)
          run_case("bgradb", lname, dt, dt, s[1], s[2], s[3], seed + 5,
                   { accumulate = true, dbias = dt == "f32" and "bf16" or "f32" })
        end
      end)
    end
  end

  it("bf16 operands into f32 D with a bf16 bias (GELU_AUX); f32 operands into bf16 D", function()
    run_case("gelu_aux", "TN", "bf16", "f32", 24, 40, 48, 9501, { bias = "bf16" })
    run_case("gelu_aux", "NT", "f32", "bf16", 24, 40, 48, 9502, { bias = "f32" })
    run_case("dgelu_bgrad", "NN", "bf16", "f32", 24, 40, 48, 9503)
  end)

  it("wgrad layout NT: BGRADB's dbias is the column sums of dY (the bias gradient)", function()
    local N, IN, OUT = 12, 20, 7
    local x = lutra.tensor({ N, IN }):randn(9601)
    local dy = lutra.tensor({ N, OUT }):randn(9602)
    local dw, db = lutra.tensor({ OUT, IN }), lutra.tensor({ OUT })
    lutra.gemm_ex(x, false, dy, true, dw, { epilogue = "bgradb", dbias = db })
    local g = dy:to_table()
    local want = {}
    for o = 1, OUT do
      local acc = 0
      for r = 0, N - 1 do acc = acc + g[r * OUT + o] end
      want[o] = acc
    end
    local got = db:to_table()
    for o = 1, OUT do assert.is_true(math.abs(got[o] - want[o]) <= 1e-6 * (1 + math.abs(want[o]))) end
    -- and dW is the plain wgrad GEMM
    local plain = lutra.tensor({ OUT, IN })
    lutra.gemm(x, false, dy, true, plain)
    assert.are.equal(plain:bytes(), dw:bytes())
  end)

  it("GELU_AUX then DGELU round trip: backward reads the saved pre-activation", function()
    -- forward: h = gelu(x W^T + b) with aux = pre; backward: dpre = (dh_in W2 ...) stand-in:
    -- dX-like GEMM NN with DGELU on the saved aux gives dy' * gelu'(pre)
    local N, IN, HID = 16, 24, 32
    local x = lutra.tensor({ N, IN }):randn(9701)
    local w = lutra.tensor({ HID, IN }):randn(9702, 0, 0.3)
    local b = lutra.tensor({ HID }):randn(9703)
    local h, pre = lutra.tensor({ N, HID }), lutra.tensor({ N, HID })
    lutra.gemm_ex(w, true, x, false, h, { epilogue = "gelu_aux", bias = b, aux = pre })
    -- the same through lutra.gemm + the GELU module: bit-identical on the CPU
    local pre2 = lutra.tensor({ N, HID })
    lutra.gemm(w, true, x, false, pre2, b)
    assert.are.equal(pre2:bytes(), pre:bytes())
    local g = lutra.nn.GELU()
    assert.are.equal(g:forward(pre2):bytes(), h:bytes())
    -- backward through W2 [OUT, HID]: dh = dy W2 (NN), then * gelu'(pre)
    local OUT = 8
    local w2 = lutra.tensor({ OUT, HID }):randn(9704, 0, 0.3)
    local dy = lutra.tensor({ N, OUT }):randn(9705)
    local dpre, db = lutra.tensor({ N, HID }), lutra.tensor({ HID })
    lutra.gemm_ex(w2, false, dy, false, dpre, { epilogue = "dgelu_bgrad", aux = pre, dbias = db })
    local dh = lutra.tensor({ N, HID })
    lutra.gemm(w2, false, dy, false, dh)
    assert.are.equal(g:backward(dh):bytes(), dpre:bytes())
    -- dbias: the column sums (in double, of the same f32 values)
    local dv, dbv = dpre:to_table(), db:to_table()
    for j = 1, HID do
      local acc = 0
      for i = 0, N - 1 do acc = acc + dv[i * HID + j] end
      assert.is_true(math.abs(dbv[j] - acc) <= 2 ^ -23 * math.abs(acc) + 1e-30)
    end
  end)

  it("FP8 (per-tensor E4M3/E5M2) operands with GELU_AUX and bias, TN, NN and NT", function()
    local m, n, k = 32, 48, 64
    local r = lutra.recipe.current()
    for li, lname in ipairs(LAYOUT_ORDER) do
      local L = LAYOUTS[lname]
      local A = lutra.tensor(L.a(m, n, k)):randn(9800 + li)
      local B = lutra.tensor(L.b(m, n, k)):randn(9810 + li, 0, 0.5)
      local qa, qb = lutra.quantizer(r, L.roles[1]), lutra.quantizer(r, L.roles[2])
      local fa, fb = qa:quantize(A), qb:quantize(B)
      local av, bv = fa:to_table(), fb:to_table() -- dequantized: what the GEMM multiplies
      local bias = lutra.tensor({ n }, "bf16"):randn(9820 + li)
      for _, ddt in ipairs { "f32", "bf16" } do
        local D, aux = lutra.tensor({ m, n }, ddt):fill(0 / 0), lutra.tensor({ m, n }, ddt):fill(0 / 0)
        lutra.gemm_ex(fa, L.ta, fb, L.tb, D, { epilogue = "gelu_aux", bias = bias, aux = aux })
        local p, s = ref_gemm(av, bv, L, m, n, k, bias:to_table())
        local rel = round_rel(ddt)
        local ref, tol, atol = {}, {}, {}
        for i = 1, #p do
          ref[i] = gelu(p[i])
          tol[i] = 2e-5 * s[i] + 1e-5 * math.abs(ref[i]) + 1e-6 + rel * math.abs(ref[i])
          atol[i] = 1e-5 * s[i] + 1e-6 + rel * math.abs(p[i])
        end
        local what = string.format("FP8 %s %s D", lname, ddt)
        check_close(D:to_table(), ref, tol, what .. " D")
        check_close(aux:to_table(), p, atol, what .. " aux")
      end
    end
  end)

  it("FP8 (per-tensor E4M3 x E5M2) operands with DGELU and DGELU_BGRAD, TN, NN and NT", function()
    -- an FP8 MLP's dgrad: D = op(B) op(A) * gelu'(aux), the bias gradient D's column sums
    local m, n, k = 32, 48, 64
    local r = lutra.recipe.delayed { fp8_format = "hybrid" }
    for li, lname in ipairs(LAYOUT_ORDER) do
      local L = LAYOUTS[lname]
      local seed = math.random(1, 2 ^ 30)
      local A = lutra.tensor(L.a(m, n, k)):randn(seed)
      local B = lutra.tensor(L.b(m, n, k)):randn(seed + 1, 0, 0.5)
      local qa, qb = lutra.quantizer(r, L.roles[1]), lutra.quantizer(r, L.roles[2])
      local fa, fb = qa:quantize(A), qb:quantize(B)
      local av, bv = fa:to_table(), fb:to_table() -- dequantized: what the GEMM multiplies
      for _, ddt in ipairs { "f32", "bf16" } do
        local pre = lutra.tensor({ m, n }, ddt):randn(seed + 2, 0, 2)
        local prev = pre:to_table()
        local D, db = lutra.tensor({ m, n }, ddt):fill(0 / 0), lutra.tensor({ n }, ddt):fill(0 / 0)
        lutra.gemm_ex(fa, L.ta, fb, L.tb, D, { epilogue = "dgelu_bgrad", aux = pre, dbias = db })
        local D2 = lutra.tensor({ m, n }, ddt):fill(0 / 0)
        lutra.gemm_ex(fa, L.ta, fb, L.tb, D2, { epilogue = "dgelu", aux = pre })
        assert.are.equal(D:bytes(), D2:bytes(),
                         lname .. " " .. ddt .. ": DGELU and DGELU_BGRAD's D")
        local p, s = ref_gemm(av, bv, L, m, n, k)
        local rel = round_rel(ddt)
        local ref, tol, col, col_tol = {}, {}, {}, {}
        for j = 1, n do col[j], col_tol[j] = 0, 0 end
        for i = 1, #p do
          local g = gelu_grad(prev[i])
          ref[i] = p[i] * g
          -- run_case's DGELU bound: f32 products and gelu' (1e-5 of the magnitudes involved)
          local ftol = 1e-5 * (s[i] * math.abs(g) + math.abs(p[i])) + 1e-6
          tol[i] = ftol + rel * math.abs(ref[i])
          local j = (i - 1) % n + 1
          col[j] = col[j] + ref[i]
          col_tol[j] = col_tol[j] + ftol
        end
        local drel = ddt == "bf16" and BF16_REL or 2 ^ -23
        for j = 1, n do col_tol[j] = col_tol[j] + drel * math.abs(col[j]) end
        local what = string.format("FP8 %s %s", lname, ddt)
        check_close(D:to_table(), ref, tol, what .. " D")
        check_close(db:to_table(), col, col_tol, what .. " dbias")
      end
    end
  end)

  it("epilogue none is lutra.gemm; each epilogue has its own plan", function()
    local a = lutra.tensor({ 24, 40 }):randn(9901)
    local b = lutra.tensor({ 16, 40 }):randn(9902)
    local bias = lutra.tensor({ 24 }):randn(9903)
    local d1, d2 = lutra.tensor({ 16, 24 }):randn(9904), lutra.tensor({ 16, 24 }):randn(9904)
    lutra.gemm(a, true, b, false, d1, bias, true)
    lutra.gemm_ex(a, true, b, false, d2, { bias = bias, accumulate = true })
    assert.are.equal(d1:bytes(), d2:bytes())
    lutra.gemm_ex(a, true, b, false, d2, { epilogue = "none" })
    lutra.gemm(a, true, b, false, d1)
    assert.are.equal(d1:bytes(), d2:bytes())
    -- a new epilogue on a cached shape makes a new plan; repeating it does not
    local p0 = lutra.gemm_cache_stats()
    lutra.gemm_ex(a, true, b, false, d2, { epilogue = "gelu" })
    local p1 = lutra.gemm_cache_stats()
    assert.are.equal(p0 + 1, p1)
    lutra.gemm_ex(a, true, b, false, d2, { epilogue = "gelu" })
    assert.are.equal(p1, (lutra.gemm_cache_stats()))
    local aux = lutra.tensor({ 16, 24 })
    lutra.gemm_ex(a, true, b, false, d2, { epilogue = "gelu_aux", aux = aux })
    assert.are.equal(p1 + 1, (lutra.gemm_cache_stats()))
  end)
end)

-- ---- errors: refused calls name lutra_gemm_ex and change nothing -----------------------------

local E = require("spec.support.errors")
local expect_error = E.expect_error

describe("lutra.gemm_ex refusals", function()
  local m, n, k = 6, 10, 12
  local A, B, Af, Bf, D, aux, dbias_n, dbias_m, snapshot

  -- fresh poisoned outputs, and the bytes of every tensor a refused call could touch
  before_each(function()
    A = lutra.tensor({ n, k }):randn(9951)
    B = lutra.tensor({ m, k }):randn(9952)
    D = lutra.tensor({ m, n }):fill(0 / 0)
    aux = lutra.tensor({ m, n }):fill(0 / 0)
    dbias_n = lutra.tensor({ n }):fill(0 / 0)
    dbias_m = lutra.tensor({ m }):fill(0 / 0)
    snapshot = {}
    for _, t in ipairs { A, B, D, aux, dbias_n, dbias_m } do snapshot[#snapshot + 1] = { t, t:bytes() } end
  end)

  local function unchanged(what)
    for i, e in ipairs(snapshot) do
      assert.are.equal(e[2], e[1]:bytes(), string.format("%s: tensor %d was written", what, i))
    end
  end

  local function refused(opts, reason, call)
    expect_error(function() lutra.gemm_ex(A, true, B, false, D, opts) end, call or "lutra_gemm_ex",
                 reason)
    unchanged(reason)
  end

  it("aux of the wrong shape, dtype, or aliasing D", function()
    refused({ epilogue = "gelu_aux", aux = lutra.tensor({ m, n + 1 }) },
            "aux is 6x11, expected 6x10 (the shape of D)")
    refused({ epilogue = "dgelu", aux = lutra.tensor({ m + 1, n }) },
            "aux is 7x10, expected 6x10 (the shape of D)")
    refused({ epilogue = "gelu_aux", aux = lutra.tensor({ m, n }, "bf16") },
            "aux dtype bf16 differs from D's f32")
    refused({ epilogue = "gelu_aux", aux = D }, "aux must not be D itself")
    -- GELU_AUX writes aux: it must not be an operand (B here has D's shape)
    local A2, B2 = lutra.tensor({ n, n }):randn(9953), lutra.tensor({ m, n }):randn(9954)
    local b2 = B2:bytes()
    expect_error(function()
      lutra.gemm_ex(A2, true, B2, false, D, { epilogue = "gelu_aux", aux = B2 })
    end, "lutra_gemm_ex", "aux (an output of GELU_AUX) must not be operand A or B")
    assert.are.equal(b2, B2:bytes())
    unchanged("aux aliasing B")
  end)

  it("missing or unexpected aux and dbias", function()
    refused({ epilogue = "gelu_aux" }, "epilogue GELU_AUX needs an aux tensor [6, 10]")
    refused({ epilogue = "dgelu" }, "epilogue DGELU needs an aux tensor [6, 10]")
    refused({ epilogue = "gelu", aux = aux }, "epilogue GELU takes no aux tensor")
    refused({ aux = aux }, "epilogue NONE takes no aux tensor")
    refused({ epilogue = "gelu_aux", aux = aux, dbias = dbias_n },
            "epilogue GELU_AUX takes no dbias tensor")
    refused({ epilogue = "dgelu_bgrad", aux = aux }, "epilogue DGELU_BGRAD needs a dbias tensor of 10 elements")
    refused({ epilogue = "bgradb" }, "epilogue BGRADB needs a dbias tensor of 6 elements")
    refused({ epilogue = "bgradb", dbias = dbias_m, aux = aux }, "epilogue BGRADB takes no aux tensor")
  end)

  it("dbias of the wrong length, dtype or aliasing an operand", function()
    refused({ epilogue = "dgelu_bgrad", aux = aux, dbias = dbias_m },
            "dbias has 6 elements, expected 10 (D's columns)")
    refused({ epilogue = "bgradb", dbias = dbias_n },
            "dbias has 10 elements, expected 6 (D's rows: op(B) summed over k)")
    refused({ epilogue = "bgradb", dbias = lutra.tensor({ m }, "i32") },
            "dbias dtype i32 is not f32, bf16 or f16")
    refused({ epilogue = "bgradb", dbias = D }, "dbias has 60 elements, expected 6")
    -- BGRADB writes dbias [m]: with k = 1, B [m, 1] has m elements but must not be dbias
    local A1, B1 = lutra.tensor({ n, 1 }):randn(9955), lutra.tensor({ m, 1 }):randn(9956)
    local b1 = B1:bytes()
    expect_error(function()
      lutra.gemm_ex(A1, true, B1, false, D, { epilogue = "bgradb", dbias = B1 })
    end, "lutra_gemm_ex", "dbias must not be operand A or B")
    assert.are.equal(b1, B1:bytes())
    unchanged("dbias aliasing B")
  end)

  it("combinations cuBLASLt's epilogues do not define", function()
    local bias = lutra.tensor({ n }):randn(9961)
    refused({ epilogue = "gelu", accumulate = true }, "epilogue GELU cannot accumulate into D")
    refused({ epilogue = "gelu_aux", aux = aux, accumulate = true },
            "epilogue GELU_AUX cannot accumulate into D")
    refused({ epilogue = "dgelu", aux = aux, accumulate = true },
            "epilogue DGELU cannot accumulate into D")
    refused({ epilogue = "dgelu", aux = aux, bias = bias }, "epilogue DGELU takes no bias")
    refused({ epilogue = "dgelu_bgrad", aux = aux, dbias = dbias_n, bias = bias },
            "epilogue DGELU_BGRAD takes no bias")
    refused({ epilogue = "bgradb", dbias = dbias_m, bias = bias }, "epilogue BGRADB takes no bias")
  end)

  it("FP8 operands with every epilogue but BGRADB", function()
    local r = lutra.recipe.current()
    local qa, qb = lutra.quantizer(r, "weight"), lutra.quantizer(r, "input")
    local a16, b16 = lutra.tensor({ 16, 32 }):randn(9971), lutra.tensor({ 32, 32 }):randn(9972)
    local fa, fb = qa:quantize(a16), qb:quantize(b16)
    local d = lutra.tensor({ 32, 16 }):fill(0 / 0)
    local before = d:bytes()
    expect_error(function()
      lutra.gemm_ex(fa, true, fb, false, d, { epilogue = "bgradb", dbias = lutra.tensor({ 32 }) })
    end, "lutra_gemm_ex",
       "epilogue BGRADB needs f32, bf16 or f16 operands (its bias gradient sums op(B))")
    assert.are.equal(before, d:bytes())
    -- GELU with FP8 operands runs
    lutra.gemm_ex(fa, true, fb, false, d, { epilogue = "gelu" })
    for _, v in ipairs(d:to_table()) do assert.is_true(v == v) end
  end)

  it("bad Lua arguments and freed tensors name the call", function()
    refused({ epilogue = "relu" }, "unknown epilogue 'relu'", "lutra.gemm_ex")
    refused({ epilogue = "gelu", dbais = dbias_n }, "unknown option 'dbais'", "lutra.gemm_ex")
    refused({ epilogue = "gelu_aux", aux = 3 }, "aux must be a tensor", "lutra.gemm_ex")
    local gone = lutra.tensor({ m, n })
    gone:destroy()
    refused({ epilogue = "gelu_aux", aux = gone }, "aux was freed")
    local gone_db = lutra.tensor({ n })
    gone_db:destroy()
    refused({ epilogue = "dgelu_bgrad", aux = aux, dbias = gone_db }, "dbias was freed")
    -- after all the refusals, the same call with valid arguments works
    lutra.gemm_ex(A, true, B, false, D, { epilogue = "gelu_aux", aux = aux })
    for _, v in ipairs(D:to_table()) do assert.is_true(v == v) end
  end)

  it("a 3-D aux whose matrix view is D's shape is accepted", function()
    local aux3 = lutra.tensor({ 2, 3, n }):fill(0 / 0)
    lutra.gemm_ex(A, true, B, false, D, { epilogue = "gelu_aux", aux = aux3 })
    local pre = lutra.tensor({ m, n })
    lutra.gemm(A, true, B, false, pre)
    assert.are.equal(pre:bytes(), aux3:bytes())
  end)
end)
