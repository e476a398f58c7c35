-- NVFP4 on the device against the CPU backend (lutra/nvfp4.h; kernels/quantize/quantize_nvfp4.cu):
-- the codes of both copies, the raw scale arrays (E4M3 block scales, the decode scale and the amax
-- behind them) and the dequantized values bit for bit, for every role option (1x16, 16x16 tiles,
-- stochastic rounding over successive calls, the RHT), input dtype and one-sided quantizers; the
-- skip flag; the GEMM (both operands dequantized to BF16 on Hopper, f32 accumulation: only the
-- order differs, NMSE 1e-9) and a Linear's training step under lutra.recipe.nvfp4 (NMSE 1e-4:
-- a GEMM result a rounding apart can flip a downstream E2M1 code, as for FP8).
local lutra = require("lutra")
local R = lutra.recipe
local S = require("spec.gpu.support")
local DEV, REF, hold = S.DEV, S.REF, S.hold
local function test(name, fn) S.test(it, name, fn) end

-- everything one quantization shows, as byte strings
local outputs = S.outputs_of("nvfp4", "scales")

local cases = {
  { name = "input (1x16, RHT columnwise)", recipe = {}, role = "input" },
  { name = "weight (16x16 tiles)", recipe = {}, role = "weight" },
  { name = "grad_output (SR, RHT)", recipe = { seed = 9 }, role = "grad_output" },
  { name = "grad_output without RHT (SR)", recipe = { seed = 3, disable_rht = true }, role = "grad_output" },
  { name = "input without RHT", recipe = { disable_rht = true }, role = "input" },
  { name = "weight 1x16", recipe = { disable_2d_quantization = true }, role = "weight" },
}

describe("NVFP4 on " .. DEV, function()
  for _, c in ipairs(cases) do
    for _, dt in ipairs { "f32", "bf16", "f16" } do
      for _, parts in ipairs { { true, true }, { true, false }, { false, true } } do
        local what = string.format("%s, %s, rowwise %s columnwise %s", c.name, dt,
                                   tostring(parts[1]), tostring(parts[2]))
        test(what .. ": codes, scale arrays and dequantized values as the CPU's", function()
          local recipe = R.nvfp4(c.recipe)
          local qr = hold(lutra.quantizer(recipe, c.role, { rowwise = parts[1], columnwise = parts[2], device = REF }))
          local qd = hold(lutra.quantizer(recipe, c.role, { rowwise = parts[1], columnwise = parts[2], device = DEV }))
          for call = 1, 3 do -- successive calls: the stochastic rounding's seeds advance alike
            local xr, xd = S.randn_pair({ 96, 160 }, dt, 40 + call, 2 ^ (call * 3 - 6))
            local want = outputs(qr:quantize(xr), parts[1], parts[2])
            local got = outputs(qd:quantize(xd), parts[1], parts[2])
            for k, v in pairs(want) do
              S.assert_same_bytes(got[k], v, what .. " call " .. call .. ": " .. k)
            end
          end
        end)
      end
    end
  end

  test("special values: zero blocks, NaN, infinities, subnormals", function()
    local xr, xd = S.special_values_pair()
    for _, role in ipairs { "input", "weight", "grad_output" } do
      local r = R.nvfp4 { seed = 1 }
      local want = outputs(hold(lutra.quantizer(r, role, { device = REF })):quantize(xr), true, true)
      local got = outputs(hold(lutra.quantizer(r, role, { device = DEV })):quantize(xd), true, true)
      for k, b in pairs(want) do S.assert_same_bytes(got[k], b, role .. ": " .. k) end
    end
  end)

  test("a set skip flag leaves every output as it was", function()
    local q = hold(lutra.quantizer(R.nvfp4(), "grad_output", { device = DEV }))
    local _, x1 = S.randn_pair({ 32, 64 }, "f32", 1)
    local _, x2 = S.randn_pair({ 32, 64 }, "f32", 2)
    local t = q:quantize(x1)
    local before = outputs(t, true, true)
    local skip = lutra.from_table({ 1 }, { 1 }, "i32", DEV)
    q:quantize_skip(x2, skip)
    local after = outputs(t, true, true)
    for k, b in pairs(before) do S.assert_same_bytes(after[k], b, "skipped: " .. k) end
  end)

  test("the GEMM of NVFP4 operands: the CPU's BF16 products up to accumulation order", function()
    S.assert_quantized_gemm(function() return R.nvfp4 { disable_rht = true } end, 1e-9,
                            "nvfp4 gemm")
  end)

  test("a Linear's training step under lutra.recipe.nvfp4 as on the CPU", function()
    local want, got = S.linear_step_pair(function() return R.nvfp4 { seed = 4 } end, 64)
    for _, k in ipairs { "y", "dx", "dw" } do S.assert_nmse(got[k], want[k], 1e-4, k) end
  end)
end)
