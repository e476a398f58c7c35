-- NVFP4 in GEMMs and training (lutra/nvfp4.h): the CPU's NVFP4 GEMM is a GEMM of the operands
-- dequantized and rounded to BF16 (the Hopper path), a Linear and an MLP train under
-- lutra.recipe.nvfp4 and a factory recipe choosing NVFP4 per role, and bad inputs are refused
-- with the call and the reason, changing nothing.
--
-- Training bands (measured on this MLP: f32 ends at ~1e-4x its first loss, FP8 current scaling
-- at ~2e-3x, NVFP4 at ~1.3e-2x): an NVFP4 run must end below 0.1x its first loss and within
-- f32's final + 0.05x the first loss. E2M1 has one mantissa bit, so its noise floor sits about
-- 7x FP8's; 0.05x leaves a 4x margin and still fails a run whose scales or layout are wrong
-- (the loss then stalls near the start or diverges).
local lutra = require("lutra")
local E = require("spec.support.errors")
local dequant_linear = require("spec.support.dequant_linear")
local nn, R, C, ffi = lutra.nn, lutra.recipe, lutra.C, lutra.ffi

local function mlp(seed)
  return nn.Sequential(nn.Linear(32, 64, { seed = seed }), nn.GELU(),
                       nn.Linear(64, 32, { seed = seed + 1 }))
end

local function train(net, x, target, steps, recipe)
  local loss = nn.MSELoss()
  local opt = lutra.optim.AdamW(net, { lr = 1e-2, weight_decay = 0 })
  local scope = recipe and lutra.autocast { recipe = recipe } or nil
  local losses = {}
  for step = 1, steps do
    if scope then scope:enter() end
    loss:forward(net:forward(x), target)
    net:backward(loss:backward())
    if scope then scope:exit() end
    opt:step()
    losses[step] = loss:value()
  end
  return losses
end

-- x's values rounded to bf16, in an f32 tensor
local function bf16_round(t)
  local b = lutra.tensor(t:dims(), "bf16"):copy(t)
  return lutra.tensor(t:dims()):copy(b)
end

describe("NVFP4 GEMMs and training", function()
  it("runs a Linear's forward as a BF16 GEMM of the dequantized operands (the Hopper path)",
     function()
    local nmse, err = dequant_linear(R.nvfp4(), bf16_round)
    -- dgrad lands near the f32 input gradient: two E2M1 operands (NMSE ~1e-2 each)
    assert.is_true(nmse < 0.05 and err > 0, "NMSE " .. nmse)
  end)

  it("trains a Linear and an MLP near f32 (bands in the header)", function()
    local x = lutra.tensor({ 64, 32 }):randn(3001)
    local target = lutra.tensor({ 64, 32 }):copy(mlp(3100):forward(x))
    local f = train(mlp(3200), x, target, 150)
    for _, opts in ipairs { {}, { disable_rht = true, disable_stochastic_rounding = true,
                                  disable_2d_quantization = true } } do
      local q = train(mlp(3200), x, target, 150, R.nvfp4(opts))
      assert.are_not.equal(f[1], q[1]) -- it quantized
      assert.is_true(q[150] < 0.1 * q[1], "final " .. q[150] .. " first " .. q[1])
      assert.is_true(q[150] <= f[150] + 0.05 * q[1], "final " .. q[150] .. " f32 " .. f[150])
    end
    -- one Linear learning a linear teacher
    local xl = lutra.tensor({ 64, 64 }):randn(11)
    local tl = lutra.tensor({ 64, 32 }):copy(nn.Linear(64, 32, { seed = 10 }):forward(xl))
    local lf = train(nn.Linear(64, 32, { seed = 9 }), xl, tl, 100)
    local lq = train(nn.Linear(64, 32, { seed = 9 }), xl, tl, 100, R.nvfp4())
    assert.is_true(lq[100] < 0.1 * lq[1] and lq[100] <= lf[100] + 0.05 * lq[1],
                   "Linear final " .. lq[100] .. " f32 " .. lf[100])
  end)

  it("is reproducible for a seed and chosen per role by a factory recipe", function()
    local x = lutra.tensor({ 64, 32 }):randn(1)
    local target = lutra.tensor({ 64, 32 }):randn(2)
    local a = train(mlp(7), x, target, 4, R.nvfp4 { seed = 5 })
    local b = train(mlp(7), x, target, 4, R.nvfp4 { seed = 5 })
    assert.are.same(a, b)
    -- the factory's choice of TE's options per role is the nvfp4 recipe, step for step
    local f = R.custom { nvfp4_seed = 5, factory = function(role)
      if role == "weight" then return { kind = "nvfp4", fp4_2d_quantization = true } end
      return { kind = "nvfp4", random_hadamard_transform = true,
               stochastic_rounding = role == "grad_output" }
    end }
    assert.are.same(a, train(mlp(7), x, target, 4, f))
    -- and the custom recipe with the same roles
    local c = R.custom { nvfp4_seed = 5,
      input = { kind = "nvfp4", random_hadamard_transform = true },
      weight = { kind = "nvfp4", format = "e2m1", fp4_2d_quantization = true },
      grad_output = { kind = "nvfp4", stochastic_rounding = true, random_hadamard_transform = true } }
    assert.are.same({ "nvfp4", "e2m1" }, { c:role("grad_output") })
    assert.are.same(a, train(mlp(7), x, target, 4, c))
    -- a different seed changes the stochastic rounding, hence the losses after the first step
    local d = train(mlp(7), x, target, 4, R.nvfp4 { seed = 6 })
    assert.are.equal(a[1], d[1])
    assert.are_not.same(a, d)
  end)

  it("refuses bad input with the call and the reason, changing nothing", function()
    local q = lutra.quantizer(R.nvfp4(), "input")
    local x = lutra.tensor({ 32, 48 }):randn(3)
    local xq = q:quantize(x)
    local before, cbefore = xq:bytes(false), xq:bytes(true)
    E.expect_error(function() q:quantize(lutra.tensor({ 32, 40 }):randn(1)) end, "lutra_quantize",
                   "NVFP4 needs both matrix dims to be multiples of 16 (got 32x40)")
    E.expect_error(function() q:quantize(lutra.tensor({ 24, 48 }):randn(1)) end, "lutra_quantize",
                   "multiples of 16 (got 24x48)")
    E.expect_error(function() q:quantize(lutra.tensor({ 32, 48 }, "i32")) end, "lutra_quantize",
                   "input dtype i32 is not f32, bf16 or f16")
    assert.are.equal(before, xq:bytes(false))
    assert.are.equal(cbefore, xq:bytes(true))
    assert.are.equal(before, q:quantize(x):bytes(false)) -- the quantizer still works
    local cases = {
      { function() R.custom { input = { kind = "nvfp4", format = "e4m3" }, weight = { kind = "nvfp4" } } end,
        "lutra_recipe_custom", "format for input must be e2m1 (kind nvfp4)" },
      { function() R.custom { input = { kind = "nvfp4" }, weight = { kind = "current" } } end,
        "lutra_recipe_custom", "the fprop GEMM would pair NVFP4 with FP8" },
      { function()
          R.custom { input = { kind = "nvfp4" }, weight = { kind = "nvfp4" },
                     grad_output = { kind = "current", format = "e5m2" } }
        end, "lutra_recipe_custom", "the dgrad GEMM would pair NVFP4 with FP8" },
      { function()
          R.custom { input = { kind = "nvfp4" },
                     weight = { kind = "nvfp4", fp4_2d_quantization = true, random_hadamard_transform = true } }
        end, "lutra_recipe_custom", "16x16 tiles and the RHT exclude each other" },
      { function()
          R.custom { input = { kind = "nvfp4", random_hadamard_transform = true },
                     weight = { kind = "nvfp4" }, grad_output = { kind = "nvfp4" } }
        end, "lutra_recipe_custom", "the RHT is on input but not on grad_output" },
      { function()
          R.custom { input = { kind = "nvfp4" }, weight = { kind = "nvfp4", random_hadamard_transform = true },
                     grad_output = { kind = "nvfp4" } }
        end, "lutra_recipe_custom", "weight: the RHT goes on the wgrad GEMM's operands" },
      { function()
          local d = ffi.new("lutra_custom_desc")
          C.lutra_custom_defaults(d)
          for i = 0, 2 do d.kind[i], d.format[i] = C.LUTRA_QUANT_NVFP4, C.LUTRA_E2M1 end
          d.nvfp4[1] = 8
          E.c_check(C.lutra_recipe_custom(d, ffi.new("lutra_recipe*[1]")))
        end, "lutra_recipe_custom", "unknown NVFP4 options 0x8 for weight" },
      { function() E.c_check(C.lutra_nvfp4_rht(nil, 0, 0, nil)) end, "lutra_nvfp4_rht", "x" },
      { function()
          local g = nn.GroupedLinear(2, 32, 32)
          lutra.autocast { recipe = R.nvfp4() }:run(function()
            return g:forward(lutra.tensor({ 64, 32 }):randn(1), { 32, 32 })
          end)
        end, "lutra_grouped_forward", "GroupedLinear has no NVFP4 quantization" },
      { function() R.custom { input = { kind = "current", stochastic_rounding = true } } end,
        "lutra.recipe.custom", "input has NVFP4 options but kind \"current\"" },
      { function() R.nvfp4 { rht_signs = 0x10000 } end, "lutra.recipe.custom",
        "rht_signs must be an integer in 0..65535" },
      { function() R.nvfp4 { seed = -1 } end, "lutra.recipe.custom", "nvfp4_seed must be" },
      { function() R.nvfp4 { disable_rht = 1 } end, "lutra.recipe.nvfp4", "disable_rht must be a boolean" },
      { function() R.nvfp4 { block = 1 } end, "lutra.recipe.nvfp4", "unknown option 'block'" },
      { function() lutra.nvfp4.rht(lutra.tensor({ 4, 24 })) end, "lutra_nvfp4_rht",
        "the last dim 24 is not a multiple of 16" },
      { function() lutra.nvfp4.rht(lutra.tensor({ 4, 16 }, "bf16")) end, "lutra_nvfp4_rht",
        "x and out must be f32 tensors" },
      { function() lutra.nvfp4.rht(lutra.tensor({ 4, 16 }), lutra.tensor({ 4, 32 })) end,
        "lutra_nvfp4_rht", "out's shape differs from x's" },
      { function()
          local w = lutra.quantizer(R.current { fp8_format = "e4m3" }, "weight"):quantize(x)
          lutra.gemm(w, true, xq, false, lutra.tensor({ 32, 32 }))
        end, "lutra_gemm", "an NVFP4 (e2m1) operand needs an NVFP4 partner" },
      { function()
          local f = R.custom { factory = function() return { kind = "nvfp4", format = "e4m3" } end }
          local s = lutra.autocast { recipe = f }
          s:run(function() return nn.Linear(16, 16):forward(lutra.tensor({ 16, 16 })) end)
        end, "lutra_factory_resolve", "format for input must be e2m1" },
    }
    for i, c in ipairs(cases) do
      local ok, err = pcall(E.expect_error, c[1], c[2], c[3])
      assert.is_true(ok, "case " .. i .. ": " .. tostring(err))
    end
    assert.are.equal(C.LUTRA_OK, C.lutra_factory_status())
  end)
end)
