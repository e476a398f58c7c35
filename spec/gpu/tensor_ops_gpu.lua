-- The tensor operations (src/lutra/tensor_ops.h) on the device against the CPU reference, and a
-- Lua Sequential's training step captured in a CUDA graph against the same steps run eagerly.
-- Bounds and why:
--   add_, scale_, lutra.add    bit for bit: one f32 product and one f32 sum per element, rounded
--                              apart on both (no FMA), then once into bf16/f16
--   select, rows               bit for bit (copies / the same memory)
--   argmax                     the same ids: a comparison, the first index on a tie on both
--   softmax                    max |dev - cpu| <= 2e-6 per probability: CUDA's expf (2 ulp) and
--                              its f32 tree sum against the CPU's libm expf and f64 row sum
--   sample                     the same uniform number per row on both; the sums differ by
--                              rounding, so a draw within ~1e-6 of a boundary may pick a
--                              neighbour: at least 99% of the rows agree (a few in 10^4 expected),
--                              and the device gives the same ids for a seed on every run
local lutra = require("lutra")
local nn = lutra.nn
local S = require("spec.gpu.support")
local DEV, REF = S.DEV, S.REF
local function test(name, fn) S.test(it, name, fn) end

local function same(dev, ref, what)
  assert.are.same(ref:to_table(), dev:to_table(), what)
end

describe("tensor ops on " .. DEV .. " against the cpu", function()
  test("add_, scale_ and lutra.add: the cpu's bits", function()
    for _, dtype in ipairs { "f32", "bf16", "f16" } do
      local ar, ad = S.randn_pair({ 33, 517 }, dtype, 1)
      local br, bd = S.randn_pair({ 33, 517 }, dtype, 2)
      ar:add_(br, 0.37)
      ad:add_(bd, 0.37)
      same(ad, ar, dtype .. " add_")
      same(ad:scale_(-1.7), ar:scale_(-1.7), dtype .. " scale_")
      local od = S.poisoned({ 33, 517 }, dtype, DEV)
      same(lutra.add(ad, bd, od), lutra.add(ar, br), dtype .. " lutra.add")
    end
  end)

  test("select and rows: the cpu's values", function()
    local hr, hd = S.randn_pair({ 4, 37, 96 }, "bf16", 3)
    for dim, index in pairs { [1] = 3, [2] = 37, [3] = 5 } do
      same(hd:select(dim, index), hr:select(dim, index), "select " .. dim)
    end
    same(hd:rows(2, 2), hr:rows(2, 2), "rows")
  end)

  test("argmax: the cpu's ids", function()
    for _, dtype in ipairs { "f32", "bf16" } do
      local xr, xd = S.randn_pair({ 3, 50, 1000 }, dtype, 4)
      same(xd:argmax(), xr:argmax(), dtype)
    end
  end)

  test("softmax: within 2e-6 of the cpu", function()
    for _, T in ipairs { 1, 0.7 } do
      local xr, xd = S.randn_pair({ 64, 5000 }, "f32", 5, 3)
      local out = S.poisoned({ 64, 5000 }, "f32", DEV)
      local pr = xr:softmax { temperature = T }:to_table()
      local pd = xd:softmax { temperature = T, out = out }:to_table()
      local worst = 0
      for i = 1, #pr do worst = math.max(worst, math.abs(pd[i] - pr[i])) end
      S.note("softmax T %g: max |dev - cpu| %.3g", T, worst)
      assert.is_true(worst <= 2e-6, "max |dev - cpu| " .. worst)
    end
  end)

  test("sample: deterministic for a seed, the cpu's ids on >= 99% of the rows", function()
    local xr, xd = S.randn_pair({ 512, 3000 }, "bf16", 6, 2)
    for _, case in ipairs { { 1, 0 }, { 0.8, 40 }, { 1.5, 1 } } do
      local o = { temperature = case[1], top_k = case[2], seed = 11 }
      local d1 = xd:sample(o):to_table()
      assert.are.same(d1, xd:sample(o):to_table(), "the same seed gave other ids")
      local r = xr:sample(o):to_table()
      local agree = 0
      for i = 1, #r do agree = agree + (r[i] == d1[i] and 1 or 0) end
      S.note("sample T %g top_k %d: %d of %d rows as the cpu", case[1], case[2], agree, #r)
      assert.is_true(agree >= 0.99 * #r, agree .. " of " .. #r .. " rows agree")
    end
  end)
end)

-- the block of spec/lua_module_spec.lua
local Block = require("spec.support.residual_block")

describe("a Lua Sequential in a CUDA graph", function()
  test("a captured training step replayed equals the same steps run eagerly", function()
    if DEV == "cpu" then return end -- graphs are CUDA's
    local function build()
      local net = nn.Sequential(nn.Linear(64, 128, { seed = 3, device = DEV }), nn.GELU(),
                                Block(128, 256, { device = DEV }),
                                nn.Linear(128, 16, { seed = 4, device = DEV }))
      return net, lutra.optim.SGD(net, { lr = 0.01 })
    end
    local x = lutra.tensor({ 32, 64 }, "f32", DEV):randn(7)
    local labels = lutra.tensor({ 32 }, "i32", DEV)
    local function step(net, opt, loss)
      loss:forward(net:forward(x), labels)
      net:backward(loss:backward(), false)
      opt:step()
    end
    local eager, eopt = build()
    local graphed, gopt = build()
    local eloss, gloss = nn.CrossEntropyLoss(), nn.CrossEntropyLoss()
    -- the warm-up runs one step; the capture records the next without running it
    local g = lutra.graph.capture(function() step(graphed, gopt, gloss) end, { warmup = 1 })
    step(eager, eopt, eloss)
    for _ = 1, 3 do
      g:replay()
      step(eager, eopt, eloss)
    end
    assert.are.equal(eloss:value(), gloss:value(), "last loss")
    local pe, pg = eager:parameters(), graphed:parameters()
    for i = 1, #pe do same(pg[i].value, pe[i].value, "parameter " .. i) end
  end)
end)
