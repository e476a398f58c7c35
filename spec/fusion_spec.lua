-- Sequential's Linear+GELU fusion (GELU in the forward GEMM's epilogue, gelu' in the next
-- Linear's dgrad GEMM, FP8 with per-tensor scaling or not; on CUDA, where cuBLASLt has no FP8
-- DGELU, in the FP8 grad_output cast of the Linear before the GELU) against the same modules
-- run one by one, on the CPU backend (the reference): f32 results within 1e-6 relative (the
-- same f32 operations in another order of calls), bf16 within 2^-7 (one rounding instead of
-- two). Fresh random inputs each run.
local lutra = require("lutra")
local nn, R = lutra.nn, lutra.recipe

local function max_rel_diff(a, b)
  local x, y = a:to_table(), b:to_table()
  assert.are.equal(#y, #x)
  local worst, scale = 0, 0
  for i = 1, #y do scale = math.max(scale, math.abs(y[i])) end
  for i = 1, #y do worst = math.max(worst, math.abs(x[i] - y[i])) end
  return worst / math.max(scale, 1e-30)
end

-- two identical MLPs (same seeds): one in a Sequential, one as separate modules
local function pair(dtype, IN, H, OUT)
  local function mods()
    return nn.Linear(IN, H, { dtype = dtype, seed = 5 }), nn.GELU(),
           nn.Linear(H, OUT, { dtype = dtype, seed = 6 })
  end
  local a1, a2, a3 = mods()
  local b1, b2, b3 = mods()
  return nn.Sequential(a1, a2, a3), { b1, b2, b3 }, { a1, a2, a3 }
end

local function run_chain(chain, x, dy)
  local h = x
  for i = 1, #chain do h = chain[i]:forward(h) end
  local y = h
  local g = dy
  for i = #chain, 1, -1 do g = chain[i]:backward(g) end
  return y, g
end

describe("Sequential Linear+GELU fusion", function()
  for _, dt in ipairs { "f32", "bf16" } do
    it("matches the modules run one by one (" .. dt .. ")", function()
      local N, IN, H, OUT = 32, 48, 64, 16
      local seq, chain, parts = pair(dt, IN, H, OUT)
      local seed = math.random(1, 2 ^ 30)
      local x = lutra.tensor({ N, IN }, dt):randn(seed)
      local dy = lutra.tensor({ N, OUT }, dt):randn(seed + 1)
      local y1 = seq:forward(x)
      local dx1 = seq:backward(dy)
      assert.are.same({ 1, 1 }, { seq:fusions() })
      local y2, dx2 = run_chain(chain, x, dy)
      local tol = dt == "f32" and 1e-6 or 2 ^ -7
      assert.is_true(max_rel_diff(y1, y2) <= tol, "forward output")
      assert.is_true(max_rel_diff(dx1, dx2) <= tol, "input gradient")
      for i, m in ipairs { 1, 3 } do
        local pa, pb = parts[m]:parameters(), chain[m]:parameters()
        for j = 1, 2 do
          local d = max_rel_diff(pa[j].grad, pb[j].grad)
          assert.is_true(d <= tol, string.format("linear %d param %d grad: %.3g", i, j, d))
        end
      end
    end)
  end

  it("keeps the GELU's own backward where the dgrad GEMM is block-scaled FP8 (no gelu' in the cast)",
     function()
    -- (per-tensor scaling puts gelu' into the FP8 dgrad GEMM's epilogue: MXFP8's does not)
    local seq = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
    local x = lutra.tensor({ 32, 32 }, "f32"):randn(3)
    local dy = lutra.tensor({ 32, 32 }, "f32"):randn(4)
    local scope = lutra.autocast { recipe = R.mxfp8 {} }
    scope:run(function() seq:forward(x) end)
    seq:backward(dy)
    assert.are.same({ 1, 0 }, { seq:fusions() })
  end)

  for _, case in ipairs { { "delayed", R.delayed }, { "current", R.current } } do
    it("puts gelu' into the FP8 dgrad GEMM's epilogue under " .. case[1]
       .. " scaling, as the modules one by one", function()
      -- f32: the epilogue multiplies the same f32 products the GELU's backward would read
      local recipe = case[2]
      local N, IN, H, OUT = 32, 64, 96, 32
      local seq, chain, parts = pair("f32", IN, H, OUT)
      local seed = math.random(1, 2 ^ 30)
      local x = lutra.tensor({ N, IN }, "f32"):randn(seed)
      local dy = lutra.tensor({ N, OUT }, "f32"):randn(seed + 1)
      local y1, y2, dx1, dx2
      lutra.autocast { recipe = recipe {} }:run(function() y1 = seq:forward(x) end)
      dx1 = seq:backward(dy)
      assert.are.same({ 1, 1 }, { seq:fusions() })
      lutra.autocast { recipe = recipe {} }:run(function()
        local h = x
        for i = 1, #chain do h = chain[i]:forward(h) end
        y2 = h
      end)
      dx2 = dy
      for i = #chain, 1, -1 do dx2 = chain[i]:backward(dx2) end
      assert.is_true(max_rel_diff(y1, y2) <= 1e-6, "forward output")
      assert.is_true(max_rel_diff(dx1, dx2) <= 1e-6, "input gradient")
      for _, m in ipairs { 1, 3 } do
        local pa, pb = parts[m]:parameters(), chain[m]:parameters()
        for j = 1, 2 do
          local d = max_rel_diff(pa[j].grad, pb[j].grad)
          assert.is_true(d <= 1e-6, string.format("module %d param %d grad: %.3g", m, j, d))
        end
      end
    end)
  end

  it("fuses only Linear directly followed by GELU, and refuses fusions() on other modules", function()
    local seq = nn.Sequential(nn.GELU(), nn.Linear(16, 16), nn.Linear(16, 16), nn.GELU())
    local x = lutra.tensor({ 16, 16 }, "f32"):randn(5)
    seq:forward(x)
    seq:backward(lutra.tensor({ 16, 16 }, "f32"):randn(6))
    assert.are.same({ 1, 0 }, { seq:fusions() })
    local ok, err = pcall(function() return nn.GELU():fusions() end)
    assert.is_false(ok)
    assert.matches("GELU has no method 'fusions'", err, 1, true)
    -- the C call refuses it too, for a host that calls C directly
    assert.are_not.equal(0, lutra.C.lutra_sequential_fusions(nn.GELU(), lutra.ffi.new("int[2]"),
                                                             lutra.ffi.new("int[2]")))
    assert.matches("lutra_sequential_fusions: module is a gelu, not a sequential",
                   lutra.ffi.string(lutra.C.lutra_last_error()), 1, true)
  end)
end)
