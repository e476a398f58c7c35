-- Every activation kind fused into its FP8 neighbours' casts by Sequential(Linear, act, Linear),
-- on the CPU backend (the reference), against the same modules run one by one:
--   forward   act inside the cast of the second Linear's FP8 input (quantize(act(x)) in one pass)
--   backward  act' (+ the bias gradient) inside the first Linear's grad_output cast (per-tensor
--             scaling puts the tanh GELU's in the second Linear's dgrad GEMM epilogue instead)
-- The fused casts form each value with the activation's own formula and round it into the
-- module's dtype as the activation's kernel stores it, so every result is bit for bit the
-- unfused composition's, for f32 and bf16 and every recipe (the per-tensor recipes fuse; MXFP8 and
-- the block recipes run the activation's kernel instead, which is the composition itself). The
-- tanh GELU keeps running in the first Linear's GEMM epilogue (cuBLASLt has it), whose f32
-- operations come in another order than the GELU module's: bounded instead (see below).
-- Fresh random inputs each run.
local lutra = require("lutra")
local nn, R = lutra.nn, lutra.recipe

local KINDS = {
  { name = "relu", make = nn.ReLU },
  { name = "silu", make = nn.SiLU },
  { name = "qgelu", make = nn.QuickGELU },
  { name = "srelu", make = nn.SquaredReLU },
  { name = "tanh", make = nn.Tanh },
  { name = "gelu_erf", make = function() return nn.GELU { approximate = "none" } end },
  { name = "swiglu", make = nn.SwiGLU, gated = true },
  { name = "geglu", make = nn.GeGLU, gated = true },
  { name = "reglu", make = nn.ReGLU, gated = true },
  { name = "gelu_tanh", make = nn.GELU, epilogue = true },
}

local RECIPES = require("spec.support.fusion_recipes")

local function same_bits(a, b, what)
  local x, y = a:to_table(), b:to_table()
  assert.are.equal(#y, #x, what .. ": sizes")
  for i = 1, #x do
    if x[i] ~= y[i] then
      error(string.format("%s: element %d differs: %.9g vs %.9g", what, i, x[i], y[i]), 2)
    end
  end
end

local function max_rel_diff(a, b)
  local x, y = a:to_table(), b:to_table()
  local worst, scale = 0, 0
  for i = 1, #y do scale = math.max(scale, math.abs(y[i])) end
  for i = 1, #y do worst = math.max(worst, math.abs(x[i] - y[i])) end
  return worst / math.max(scale, 1e-30)
end

local N, IN, H, OUT = 32, 64, 64, 32

local function modules(kind, dtype, seed)
  local h_in = kind.gated and 2 * H or H
  return { nn.Linear(IN, h_in, { dtype = dtype, seed = seed }), kind.make(),
           nn.Linear(H, OUT, { dtype = dtype, seed = seed + 1 }) }
end

-- a forward under the recipe when one is given
local function step(run_forward, recipe, x)
  local y
  if recipe then
    lutra.autocast { recipe = recipe }:run(function() y = run_forward(x) end)
  else
    y = run_forward(x)
  end
  return y
end

local function compare(kind, rec, dtype)
  local seed = math.random(1, 2 ^ 30)
  local a = modules(kind, dtype, seed % 100000)
  local b = modules(kind, dtype, seed % 100000)
  local seq = nn.Sequential(a[1], a[2], a[3])
  local x = lutra.tensor({ N, IN }, dtype):randn(seed)
  local dy = lutra.tensor({ N, OUT }, dtype):randn(seed + 1)
  local recipe_a, recipe_b = rec.make and rec.make(), rec.make and rec.make()
  local y1 = step(function(v) return seq:forward(v) end, recipe_a, x)
  local dx1 = seq:backward(dy)
  local fwd, bwd = seq:fusions()
  local y2 = step(function(v)
    local h = v
    for i = 1, 3 do h = b[i]:forward(h) end
    return h
  end, recipe_b, x)
  local dx2 = dy
  for i = 3, 1, -1 do dx2 = b[i]:backward(dx2) end
  local tag = string.format("%s %s %s", kind.name, rec.name, dtype)
  if kind.epilogue then
    -- the GEMM's GELU epilogue evaluates the same formula in another order than the GELU
    -- module: f32 within 1e-6 relative, bf16 within 2^-7 (a rounding of the GEMM output
    -- before the GELU instead of after); under FP8 one code step of the second Linear's input
    -- (2^-3 relative for E4M3) can follow from such a last-bit difference: 2^-4 of the largest
    local tol = rec.make and 2 ^ -4 or (dtype == "f32" and 1e-6 or 2 ^ -7)
    assert.is_true(max_rel_diff(y1, y2) <= tol, tag .. ": forward output")
    assert.is_true(max_rel_diff(dx1, dx2) <= tol, tag .. ": input gradient")
  else
    same_bits(y1, y2, tag .. ": forward output")
    same_bits(dx1, dx2, tag .. ": input gradient")
    for _, m in ipairs { 1, 3 } do
      local pa, pb = a[m]:parameters(), b[m]:parameters()
      for j = 1, 2 do same_bits(pa[j].grad, pb[j].grad, string.format("%s: linear %d grad %d", tag, m, j)) end
    end
  end
  return fwd, bwd
end

describe("activation fusion into the FP8 casts (every kind, every recipe)", function()
  for _, kind in ipairs(KINDS) do
    for _, rec in ipairs(RECIPES) do
      for _, dtype in ipairs { "f32", "bf16" } do
        it(string.format("%s, %s, %s: fused equals the modules one by one", kind.name, rec.name, dtype), function()
          local fwd, bwd = compare(kind, rec, dtype)
          -- forward: the tanh GELU always runs in the GEMM's epilogue; the other kinds inside the
          -- second Linear's input cast where the recipe's input quantizer takes an activation
          local want_fwd = (kind.epilogue or rec.fuses or rec.fuses_forward_only) and 1 or 0
          -- backward: act' inside the first Linear's grad_output cast (the per-tensor recipes;
          -- the tanh GELU's in the second Linear's dgrad GEMM epilogue instead), or, for the tanh
          -- GELU without a grad_output quantizer, in that dgrad GEMM epilogue too
          local want_bwd = (rec.fuses or (kind.epilogue and rec.fuses_forward_only)) and 1 or 0
          assert.are.same({ want_fwd, want_bwd }, { fwd, bwd }, "fusions (forward, backward)")
        end)
      end
    end
  end

  it("in high precision the tanh GELU fuses both ways and the other kinds run their kernels", function()
    for _, kind in ipairs(KINDS) do
      local fwd, bwd = compare(kind, { name = "none" }, "f32")
      local want = kind.epilogue and 1 or 0
      assert.are.same({ want, want }, { fwd, bwd }, kind.name)
    end
  end)

  it("keeps the FP8 fusions through deeper stacks of mixed kinds", function()
    local function mlp(seed)
      return nn.Sequential(nn.Linear(32, 128, { seed = seed }), nn.SwiGLU(),
                           nn.Linear(64, 64, { seed = seed + 1 }), nn.SiLU(),
                           nn.Linear(64, 32, { seed = seed + 2 }), nn.GELU(),
                           nn.Linear(32, 16, { seed = seed + 3 }))
    end
    local seq = mlp(11)
    local x = lutra.tensor({ 32, 32 }, "f32"):randn(math.random(1, 2 ^ 30))
    local dy = lutra.tensor({ 32, 16 }, "f32"):randn(math.random(1, 2 ^ 30))
    lutra.autocast { recipe = R.delayed {} }:run(function() seq:forward(x) end)
    seq:backward(dy)
    -- forward: SwiGLU inside the second Linear's input cast and the GELU in the third Linear's
    -- epilogue; the SiLU runs its own kernel (the third Linear is the GELU's producer already: a
    -- module is in one forward pair at most). Backward: all three derivatives inside their
    -- producers' grad_output casts
    assert.are.same({ 2, 3 }, { seq:fusions() })
  end)
end)
