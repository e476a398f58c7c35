-- GEMM epilogues (lutra.gemm_ex) on the GPU against the CPU backend: GELU, GELU_AUX, DGELU,
-- DGELU_BGRAD and BGRADB, with and without bias / accumulate where they apply, in layouts TN, NN
-- and NT, for f32 and bf16 (and mixed) operands and outputs, and FP8 operands with GELU_AUX and
-- a bias (TransformerEngine's FP8 fprop), GELU, DGELU and DGELU_BGRAD (the FP8 MLP's dgrad).
-- The CPU backend is the reference
-- (spec/gemm_epilogue_spec.lua checks it against double); both devices get the same inputs
-- (random tensors are generated on the host from the seed) and every output we create (D, aux,
-- dbias) is poisoned with NaN first, so an element nobody writes shows up as non-finite.
--
-- cuBLASLt runs an epilogue itself where its heuristic has an algorithm and its documented
-- limits allow (aux leading dimension n a multiple of 8; a bias gradient of D's dtype); otherwise
-- the plan runs the plain GEMM and lutra's kernels (src/backend/cuda/gemm_cuda.c). The shapes below
-- exercise both: n = 45 and a bias gradient of another dtype than D always take the kernels;
-- f32 operands into bf16 D stage D in f32; aligned shapes with matching dtypes are cuBLASLt's.
-- Either way the results must be within these NMSE bounds (NMSE = ||dev - cpu||^2 / ||cpu||^2):
--   aux (the pre-activation) and the D of BGRADB: the plain GEMM's bounds (spec/gpu/ops_gpu.lua):
--     f32 1e-10, bf16 2e-5 (one-ulp rounding flips).
--   GELU / DGELU outputs (D, DGELU_BGRAD's dbias): f32 1e-6, bf16 2e-5. cuBLASLt's GELU is the
--     same tanh formula, but may evaluate tanh with the hardware approximation (~2^-11
--     relative), which costs f32 outputs up to ~(2^-11)^2 ~ 2.4e-7 in NMSE; lutra's kernels
--     match the CPU to a few ulps. bf16 outputs hide it under their rounding.
--   BGRADB's dbias (k-sums of op(B), exact inputs, f32 vs double summation): f32 1e-9, bf16 2e-5.
--   FP8 operands (per-tensor scaling): D 2e-6 for f32 (the FP8 GEMM's 1e-6 plus the GELU
--     above), aux 1e-6, bf16 2e-5 (see ops_gpu.lua's FP8 bounds).
-- LUTRA_GPU_SPEC_VERBOSE=1 prints each measured NMSE. LUTRA_TEST_DEVICE=cpu dry-runs the
-- suite CPU against CPU.
local string, ipairs, error = string, ipairs, error
local lutra = require("lutra")
local R = lutra.recipe

local S = require("spec.gpu.support")
local DEV, REF, hold, assert_nmse = S.DEV, S.REF, S.hold, S.assert_nmse
local poisoned, randn_pair = S.poisoned, S.randn_pair
local function test(name, fn) S.test(it, name, fn) end

-- stored shapes for D [m, n] = op(B) [m, k] op(A) [k, n]
local GL = require("spec.support.gemm_layouts")
local LAYOUTS, LAYOUT_ORDER = GL.LAYOUTS, GL.ORDER

-- the epilogue configurations; dbias = "other" picks the dtype that is not D's (always kernels)
local CASES = {
  { kind = "gelu" }, { kind = "gelu", bias = true },
  { kind = "gelu_aux" }, { kind = "gelu_aux", bias = true },
  { kind = "dgelu" },
  { kind = "dgelu_bgrad" }, { kind = "dgelu_bgrad", dbias = "other" },
  { kind = "bgradb" }, { kind = "bgradb", dbias = "other" }, { kind = "bgradb", acc = true },
}

local function other(dt) return dt == "f32" and "bf16" or "f32" end

local function case_name(c)
  return c.kind .. (c.bias and "+bias" or "") .. (c.acc and "+accumulate" or "")
         .. (c.dbias == "other" and " (dbias of another dtype)" or "")
end

-- runs one epilogue on one device (A, B are that device's tensors); returns D, aux, dbias
local function epilogue_on(device, A, ta, B, tb, m, n, ddt, c, seed)
  local D = c.acc and lutra.tensor({ m, n }, ddt, device):randn(seed + 1, 0, 2)
            or poisoned({ m, n }, ddt, device)
  local opts = { epilogue = c.kind, accumulate = c.acc }
  if c.bias then opts.bias = lutra.tensor({ n }, c.bias_dtype or ddt, device):randn(seed + 2, 0.5, 1) end
  if c.kind == "gelu_aux" then
    opts.aux = poisoned({ m, n }, ddt, device)
  elseif c.kind == "dgelu" or c.kind == "dgelu_bgrad" then
    opts.aux = lutra.tensor({ m, n }, ddt, device):randn(seed + 3, 0, 2)
  end
  local dbias_dtype = c.dbias == "other" and other(ddt) or ddt
  if c.kind == "dgelu_bgrad" then
    opts.dbias = poisoned({ n }, dbias_dtype, device)
  elseif c.kind == "bgradb" then
    opts.dbias = poisoned({ m }, dbias_dtype, device)
  end
  lutra.gemm_ex(A, ta, B, tb, D, opts)
  return D, (c.kind == "gelu_aux") and opts.aux or nil, opts.dbias
end

local function bound_of(what, dtype)
  if what == "gemm" then return dtype == "f32" and 1e-10 or 2e-5 end
  if what == "gelu" then return dtype == "f32" and 1e-6 or 2e-5 end
  if what == "bgradb" then return dtype == "f32" and 1e-9 or 2e-5 end
  error("bound " .. what)
end

-- both devices, all outputs compared
local function compare_case(L, lname, Aa, Ab, Ba, Bb, m, n, k, ddt, c, seed, label)
  local Da, auxa, dba = epilogue_on(REF, Aa, L.ta, Ba, L.tb, m, n, ddt, c, seed)
  local Db, auxb, dbb = epilogue_on(DEV, Ab, L.ta, Bb, L.tb, m, n, ddt, c, seed)
  local what = string.format("%s %s %dx%dx%d %s: %s", lname, label, m, n, k, ddt, case_name(c))
  local gelu = c.kind ~= "bgradb"
  assert_nmse(Db, Da, bound_of(gelu and "gelu" or "gemm", ddt), what .. " D")
  if auxa then assert_nmse(auxb, auxa, bound_of("gemm", ddt), what .. " aux") end
  if dba then
    assert_nmse(dbb, dba, bound_of(gelu and "gelu" or "bgradb", dba:dtype_name()), what .. " dbias")
  end
end

describe("GEMM epilogues on " .. DEV .. " (high precision)", function()
  -- (m, n, k): aligned; n = 45 (no cuBLASLt aux: the kernels); a larger k
  local SHAPES = { { 128, 96, 160 }, { 33, 45, 71 }, { 64, 256, 1024 } }
  -- operand and D dtypes: same dtype, bf16 operands into f32 D, f32 operands into bf16 D
  local DTYPES = { { "f32", "f32" }, { "bf16", "bf16" }, { "bf16", "f32" }, { "f32", "bf16" } }
  for _, lname in ipairs(LAYOUT_ORDER) do
    local L = LAYOUTS[lname]
    for _, dts in ipairs(DTYPES) do
      local odt, ddt = dts[1], dts[2]
      test(string.format("%s, %s operands, %s D: every epilogue", lname, odt, ddt), function()
        for si, s in ipairs(SHAPES) do
          local m, n, k = s[1], s[2], s[3]
          local seed = 12000 + 100 * si
          local Aa, Ab = randn_pair(L.a(m, n, k), odt, seed, 1)
          local Ba, Bb = randn_pair(L.b(m, n, k), odt, seed + 10, 1)
          for ci, c in ipairs(CASES) do
            compare_case(L, lname, Aa, Ab, Ba, Bb, m, n, k, ddt, c, seed + 20 + ci,
                         odt .. " operands")
          end
        end
      end)
    end
  end

  test("GELU_AUX with a bias of another dtype than D (bf16 bias, f32 D; f32 bias, bf16 D)", function()
    local m, n, k = 64, 96, 128
    local Aa, Ab = randn_pair({ n, k }, "bf16", 12501, 1)
    local Ba, Bb = randn_pair({ m, k }, "bf16", 12502, 1)
    for _, c in ipairs { { ddt = "f32", bdt = "bf16" }, { ddt = "bf16", bdt = "f32" } } do
      compare_case(LAYOUTS.TN, "TN", Aa, Ab, Ba, Bb, m, n, k, c.ddt,
                   { kind = "gelu_aux", bias = true, bias_dtype = c.bdt }, 12503, c.bdt .. " bias")
    end
  end)

  test("a cached plan takes each call's aux and dbias pointers", function()
    -- the same shape and epilogue twice with different outputs: the second call must write
    -- its own aux / dbias (and leave the first call's alone)
    local m, n, k = 128, 96, 160
    local Ab = lutra.tensor({ n, k }, "bf16", DEV):randn(12601)
    local Bb = lutra.tensor({ m, k }, "bf16", DEV):randn(12602)
    local D1, D2 = poisoned({ m, n }, "bf16", DEV), poisoned({ m, n }, "bf16", DEV)
    local x1, x2 = poisoned({ m, n }, "bf16", DEV), poisoned({ m, n }, "bf16", DEV)
    lutra.gemm_ex(Ab, true, Bb, false, D1, { epilogue = "gelu_aux", aux = x1 })
    local x1_bytes = x1:bytes()
    lutra.gemm_ex(Ab, true, Bb, false, D2, { epilogue = "gelu_aux", aux = x2 })
    assert.are.equal(x1_bytes, x1:bytes(), "the second call wrote the first call's aux")
    assert_nmse(x2, x1, 0, "aux of the second call")
    assert_nmse(D2, D1, 0, "D of the second call")
    local g1, g2 = poisoned({ n }, "bf16", DEV), poisoned({ n }, "bf16", DEV)
    local E1, E2 = poisoned({ m, n }, "bf16", DEV), poisoned({ m, n }, "bf16", DEV)
    lutra.gemm_ex(Ab, true, Bb, false, E1, { epilogue = "dgelu_bgrad", aux = x1, dbias = g1 })
    local g1_bytes = g1:bytes()
    lutra.gemm_ex(Ab, true, Bb, false, E2, { epilogue = "dgelu_bgrad", aux = x2, dbias = g2 })
    assert.are.equal(g1_bytes, g1:bytes(), "the second call wrote the first call's dbias")
    assert_nmse(g2, g1, 0, "dbias of the second call")
    assert_nmse(E2, E1, 0, "D of the second DGELU_BGRAD")
  end)
end)

describe("GEMM epilogue refusals on " .. DEV, function()
  test("aux or dbias on another device than D is refused, nothing written", function()
    if DEV == REF then return end -- (a dry run has one device)
    local m, n, k = 32, 48, 64
    local A = lutra.tensor({ n, k }, "bf16", DEV):randn(12701)
    local B = lutra.tensor({ m, k }, "bf16", DEV):randn(12702)
    local D = poisoned({ m, n }, "bf16", DEV)
    local before = D:bytes()
    local function refused(opts, reason)
      local ok, err = pcall(lutra.gemm_ex, A, true, B, false, D, opts)
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find("lutra_gemm_ex: " .. reason, 1, true), tostring(err))
      assert.are.equal(before, D:bytes(), reason .. ": D was written")
    end
    refused({ epilogue = "gelu_aux", aux = poisoned({ m, n }, "bf16", REF) },
            "aux is on another device than D")
    refused({ epilogue = "dgelu_bgrad", aux = lutra.tensor({ m, n }, "bf16", DEV),
              dbias = poisoned({ n }, "bf16", REF) }, "dbias is on another device than D")
  end)
end)

describe("GEMM epilogues on " .. DEV .. " (FP8 operands)", function()
  -- TE's FP8 fprop: GELU_AUX with a bf16 bias, and the FP8 MLP's dgrad: DGELU (+ BGRAD); the
  -- operands are quantized on both devices (the codes are checked bit-identical by ops_gpu.lua),
  -- NN and NT through the columnwise copies. The dbias of DGELU_BGRAD: D's bounds (its sums of
  -- the same values, f32 against double).
  local KINDS = {
    { name = "current (per-tensor)", make = function() return R.current() end },
    { name = "mxfp8 (dequantized to bf16)", make = function() return R.mxfp8 { fp8_format = "hybrid" } end },
  }
  local SHAPES = { { 64, 96, 160 }, { 256, 384, 512 } }
  for _, kind in ipairs(KINDS) do
    for _, lname in ipairs(LAYOUT_ORDER) do
      local L = LAYOUTS[lname]
      test(string.format("%s, %s: GELU_AUX + bias, GELU, DGELU(_BGRAD), f32 and bf16 D",
                         kind.name, lname),
           function()
        local r = kind.make()
        for si, s in ipairs(SHAPES) do
          local m, n, k = s[1], s[2], s[3]
          local seed = 13000 + 100 * si
          local Aa, Ab = randn_pair(L.a(m, n, k), "f32", seed, 1)
          local Ba, Bb = randn_pair(L.b(m, n, k), "f32", seed + 10, 0.5)
          local qAa = hold(lutra.quantizer(r, L.roles[1], { device = REF }))
          local qAb = hold(lutra.quantizer(r, L.roles[1], { device = DEV }))
          local qBa = hold(lutra.quantizer(r, L.roles[2], { device = REF }))
          local qBb = hold(lutra.quantizer(r, L.roles[2], { device = DEV }))
          local fa, fb = qAa:quantize(Aa), qAb:quantize(Ab)
          local ga, gb = qBa:quantize(Ba), qBb:quantize(Bb)
          for _, ddt in ipairs { "f32", "bf16" } do
            for _, c in ipairs { { kind = "gelu_aux", bias = true, bias_dtype = "bf16" },
                                 { kind = "gelu" }, { kind = "dgelu" },
                                 { kind = "dgelu_bgrad" } } do
              local Da, auxa, dba = epilogue_on(REF, fa, L.ta, ga, L.tb, m, n, ddt, c, seed + 20)
              local Db, auxb, dbb = epilogue_on(DEV, fb, L.ta, gb, L.tb, m, n, ddt, c, seed + 20)
              local what = string.format("%s %s %dx%dx%d %s D: %s", kind.name, lname, m, n, k,
                                         ddt, case_name(c))
              assert_nmse(Db, Da, ddt == "f32" and 2e-6 or 2e-5, what .. " D")
              if auxa then assert_nmse(auxb, auxa, ddt == "f32" and 1e-6 or 2e-5, what .. " aux") end
              if dba then assert_nmse(dbb, dba, ddt == "f32" and 2e-6 or 2e-5, what .. " dbias") end
            end
          end
        end
      end)
    end
  end
end)
