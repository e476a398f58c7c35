-- Per-GEMM options and the backward override of a recipe (lutra/recipe_options.h): TE's MMParams
-- defaults, the split-accumulator choice reaching the GEMM plans (a plan key field: a new plan
-- per setting), and the backward in high precision from the saved tensors or from the
-- dequantized FP8 ones, checked against a high-precision Linear fed the same tensors.
local lutra = require("lutra")
local ffi = require("ffi")
local nn = lutra.nn
local C = lutra.C

local function plans()
  local p, w = ffi.new("int[1]"), ffi.new("size_t[1]")
  assert(C.lutra_gemm_cache_stats(p, w) == 0)
  return p[0]
end

local function grads(lin)
  local ps = lin:parameters()
  return ps[1].grad:to_table(), ps[2].grad:to_table()
end

describe("recipe options", function()
  it("default to TE's MMParams (fprop fast accumulation, dgrad/wgrad split) and an FP8 backward", function()
    local o = lutra.recipe.delayed():options()
    assert.are.same({ gemm = { fprop = { use_split_accumulator = false },
                               dgrad = { use_split_accumulator = true },
                               wgrad = { use_split_accumulator = true } },
                      backward_override = "fp8" }, o)
    local r = lutra.recipe.current { gemm = { fprop = { use_split_accumulator = true } },
                                     backward_override = "dequantized" }
    assert.is_true(r:options().gemm.fprop.use_split_accumulator)
    assert.are.equal("dequantized", r:options().backward_override)
    assert.are_not.equal(lutra.recipe.current():key(), r:key())
  end)

  it("refuses unknown GEMMs, fields and overrides", function()
    assert.has_error(function() lutra.recipe.delayed { gemm = { xgrad = {} } } end,
                     "lutra.recipe.delayed: gemm has unknown GEMM 'xgrad' (expected fprop, dgrad or wgrad)")
    assert.has_error(function() lutra.recipe.delayed { gemm = { fprop = { split = true } } } end)
    assert.has_error(function() lutra.recipe.delayed { gemm = { fprop = { use_split_accumulator = 1 } } } end)
    assert.has_error(function() lutra.recipe.delayed { backward_override = "fast" } end)
    assert.has_error(function() lutra.recipe.delayed { gemm = 3 } end)
  end)

  it("give each split-accumulator setting its own GEMM plan", function()
    local x = lutra.tensor({ 32, 32 }):randn(1)
    local function fwd(recipe)
      local lin = nn.Linear(32, 48, { seed = 4 })
      lutra.autocast { recipe = recipe }:run(function() lin:forward(x) end)
    end
    fwd(lutra.recipe.current())
    local before = plans()
    fwd(lutra.recipe.current()) -- same key: the cached plan
    assert.are.equal(before, plans())
    fwd(lutra.recipe.current { gemm = { fprop = { use_split_accumulator = true } } })
    assert.are.equal(before + 1, plans())
  end)

  for _, case in ipairs { "high_precision", "dequantized" } do
    it("backward_override = " .. case .. " gives a high-precision Linear's gradients of the "
       .. (case == "high_precision" and "saved" or "dequantized FP8") .. " tensors", function()
      for _, base in ipairs { "current", "delayed", "block" } do
        local recipe = lutra.recipe[base] { backward_override = case }
        local lin = nn.Linear(64, 64, { seed = 9 })
        local ref = nn.Linear(64, 64, { seed = 9 })
        local x = lutra.tensor({ 64, 64 }):randn(21, 0, 3)
        local dy = lutra.tensor({ 64, 64 }):randn(22)
        local scope = lutra.autocast { recipe = recipe }
        for _ = 1, 2 do -- twice: delayed scaling's second step uses the updated scales
          lin:zero_grad()
          ref:zero_grad()
          scope:enter()
          lin:forward(x)
          local rx = x
          if case == "dequantized" then
            -- the forward's FP8 tensors again (the same scales, before the scope's update),
            -- dequantized
            local xq = lin:quantizer("input"):quantize(x)
            rx = lutra.tensor({ 64, 64 })
            lutra.dequantize(xq, rx)
            local wdq = lutra.tensor({ 64, 64 })
            lutra.dequantize(lin:quantizer("weight"):quantize(lin:parameters()[1].value), wdq)
            ref:parameters()[1].value:copy(wdq)
          end
          scope:exit()
          local dx = lin:backward(dy):to_table()
          ref:forward(rx)
          local rdx = ref:backward(dy):to_table()
          assert.are.same(rdx, dx, base)
          local gw, gb = grads(lin)
          local rw, rb = grads(ref)
          assert.are.same(rw, gw, base)
          assert.are.same(rb, gb, base)
        end
      end
    end)
  end
end)
