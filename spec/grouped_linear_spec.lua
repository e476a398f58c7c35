-- nn.GroupedLinear against num_gemms separate nn.Linear with the same weights, on the CPU
-- backend, where both run the same quantizers and GEMMs: every output and gradient must be equal
-- bit for bit, in high precision and under every FP8 recipe. Under FP8 each expert's rows are
-- padded with zero rows to the recipe's alignment (16 per-tensor, 32 MXFP8, 128 blocks) inside
-- the grouped quantization, so the reference Linear of expert e runs on its rows padded the same
-- way and only its first split_e output rows are compared. Splits are drawn fresh each call,
-- with empty experts and sizes that are no multiple of anything; outputs are poisoned (NaN)
-- before every call. Gradients are also checked against central differences (exact for a
-- linear function up to f32 rounding: tolerance 1e-3 relative).
local lutra = require("lutra")
local nn = lutra.nn

local recipes = {
  { name = "delayed", align = 16, make = function() return lutra.recipe.delayed{ amax_history_len = 4 } end },
  { name = "current", align = 16, make = function() return lutra.recipe.current{} end },
  { name = "mxfp8", align = 32, make = function() return lutra.recipe.mxfp8{} end },
  { name = "block", align = 128, make = function() return lutra.recipe.block{} end },
}

local seed = 9000
local function next_seed() seed = seed + 1; return seed end

local function random_splits(num, rows_max)
  local s, total = {}, 0
  for e = 1, num do
    local r = math.random()
    s[e] = r < 0.25 and 0 or math.random(1, rows_max)
    total = total + s[e]
  end
  if total == 0 then s[1], total = 5, 5 end
  return s, total
end

-- rows [first, first + count) of a [*, cols] tensor, padded with zero rows to `rows`
local function slice(t, first, count, cols, rows)
  local src = t:to_table()
  local vals = {}
  for i = 1, rows * cols do vals[i] = 0 end
  for i = 1, count * cols do vals[i] = src[first * cols + i] end
  return lutra.from_table(vals, { rows, cols }, t:dtype_name())
end

local function assert_rows_equal(got, ref, first, count, cols, what)
  local g, r = got:to_table(), ref:to_table()
  for i = 1, count * cols do
    local a, b = g[first * cols + i], r[i]
    if a ~= b then
      error(string.format("%s: element %d of the expert's rows differs: %.9g vs %.9g", what, i, a, b), 2)
    end
  end
end

local function assert_equal(got, ref, what)
  local g, r = got:to_table(), ref:to_table()
  assert.are.equal(#r, #g)
  for i = 1, #r do
    if g[i] ~= r[i] then
      error(string.format("%s: element %d differs: %.9g vs %.9g", what, i, g[i], r[i]), 2)
    end
  end
end

local function assert_zero(t, what)
  for i, v in ipairs(t:to_table()) do
    if v ~= 0 then error(string.format("%s: element %d is %g, not 0", what, i, v), 2) end
  end
end

-- a GroupedLinear and its experts as Linears with copies of its weights
local function pair(num, IN, OUT, opts)
  opts = opts or {}
  local g = nn.GroupedLinear(num, IN, OUT, { bias = opts.bias, dtype = opts.dtype,
                                             accumulate_main_grad = opts.amg, seed = next_seed() })
  local gp, per = g:parameters(), (opts.bias == false) and 1 or 2
  local lins = {}
  for e = 1, num do
    local l = nn.Linear(IN, OUT, { bias = opts.bias, dtype = opts.dtype,
                                   accumulate_main_grad = opts.amg, seed = next_seed() })
    local lp = l:parameters()
    for j = 1, per do lp[j].value:copy(gp[(e - 1) * per + j].value) end
    lins[e] = l
  end
  return g, lins, per
end

local function poison(...)
  for _, t in ipairs { ... } do if t then t:fill(0 / 0) end end
end

-- one forward + backward of g and of its Linears, compared bitwise
local function step(g, lins, per, IN, OUT, splits, total, opts)
  local dtype, align = opts.dtype or "f32", opts.align or 1
  local x = lutra.tensor({ total, IN }, dtype):randn(next_seed())
  local dy = lutra.tensor({ total, OUT }, dtype):randn(next_seed())
  local scope_g = opts.recipe and lutra.autocast{ recipe = opts.recipe } or nil
  local scope_l = opts.recipe and lutra.autocast{ recipe = opts.recipe } or nil
  local function in_scope(scope, f) if scope then return scope:run(f) end return f() end
  if opts.poison then poison(opts.poison.y, opts.poison.dx) end
  local y = in_scope(scope_g, function() return g:forward(x, splits, opts.first) end)
  local dx = g:backward(dy)
  local ran, first = {}, 0
  local refs = {}
  in_scope(scope_l, function()
    for e = 1, #lins do
      local s = splits[e]
      -- under FP8 an empty expert's Linear still runs (on `align` zero rows): a GroupedLinear
      -- quantizes (and records the amax of) every expert's weight each forward
      local rows = s > 0 and math.ceil(s / align) * align or (align > 1 and align or 0)
      if rows > 0 then
        local xe = slice(x, first, s, IN, rows)
        refs[e] = { x = xe, y = lins[e]:forward(xe, opts.first), first = first, s = s, rows = rows }
        ran[#ran + 1] = e
      end
      first = first + s
    end
  end)
  -- backward in reverse order of the forwards: the scope's first forward (its backward
  -- trigger) finishes last, as GroupedLinear's single backward does
  for i = #ran, 1, -1 do
    local e = ran[i]
    local r = refs[e]
    r.dx = lins[e]:backward(slice(dy, r.first, r.s, OUT, r.rows))
  end
  local gp = g:parameters()
  for e = 1, #lins do
    local lp = lins[e]:parameters()
    local r = refs[e]
    if r then
      assert_rows_equal(y, r.y, r.first, r.s, OUT, "y of expert " .. e)
      assert_rows_equal(dx, r.dx, r.first, r.s, IN, "dx of expert " .. e)
    end
    for j = 1, per do
      local grad = opts.amg and "main_grad" or "grad"
      local got = gp[(e - 1) * per + j][grad]
      if r then
        assert_equal(got, lp[j][grad], (j == 1 and "dW" or "db") .. " of expert " .. e)
      elseif not opts.amg then
        assert_zero(got, (j == 1 and "dW" or "db") .. " of empty expert " .. e)
      end
    end
  end
  return y, dx
end

describe("nn.GroupedLinear", function()
  it("has num_gemms weights [out, in] and biases, enumerable in expert order", function()
    local g = nn.GroupedLinear(3, 16, 32)
    local p = g:parameters()
    assert.are.equal(6, #p)
    assert.are.same({ 32, 16 }, p[1].value:dims())
    assert.are.same({ 32 }, p[2].value:dims())
    assert.are.equal(3, g:num_gemms())
    assert.are.equal("grouped_linear", g:kind())
    -- experts start from different weights
    assert.are_not.same(p[1].value:to_table(), p[3].value:to_table())
    assert.are.equal(3, #nn.GroupedLinear(3, 16, 32, { bias = false }):parameters())
  end)

  for _, dtype in ipairs { "f32", "bf16" } do
    it("equals separate Linears bitwise in " .. dtype .. ", splits changing every call", function()
      math.randomseed(next_seed())
      local g, lins, per = pair(5, 24, 40, { dtype = dtype })
      local y, dx
      for _ = 1, 4 do
        local splits, total = random_splits(5, 13)
        y, dx = step(g, lins, per, 24, 40, splits, total,
                     { dtype = dtype, poison = { y = y, dx = dx } })
      end
    end)
  end

  it("accumulates into main_grad as Linears do, and takes host i32 tensors as splits", function()
    math.randomseed(next_seed())
    local g, lins, per = pair(4, 16, 16, { amg = true })
    for _ = 1, 3 do
      local splits, total = random_splits(4, 9)
      local st = lutra.from_table(splits, { 4 }, "i32")
      step(g, lins, per, 16, 16, splits, total, { amg = true })
      -- the same splits as a tensor give the same forward
      local x = lutra.tensor({ total, 16 }):randn(next_seed())
      local a = g:forward(x, splits):to_table()
      local b = g:forward(x, st):to_table()
      assert.are.same(a, b)
    end
  end)

  for _, case in ipairs { { "f32" }, { "bf16" }, { "f32", amg = true } } do
    it("takes the per-expert path for host splits, equal to Linears bitwise (" .. case[1]
       .. (case.amg and ", main_grad" or "") .. ")", function()
      math.randomseed(next_seed())
      local g, lins, per = pair(4, 16, 32, { dtype = case[1], amg = case.amg })
      g:set_path("per_expert")
      for _ = 1, 3 do
        local splits, total = random_splits(4, 11)
        step(g, lins, per, 16, 32, splits, total, { dtype = case[1], amg = case.amg })
      end
      -- the grouped path gives the same bits
      local x = lutra.tensor({ 20, 16 }, case[1]):randn(next_seed())
      local a = g:forward(x, { 5, 0, 9, 6 }):to_table()
      g:set_path("grouped")
      assert.are.same(a, g:forward(x, { 5, 0, 9, 6 }):to_table())
      assert.has_error(function() g:set_path("fast") end)
    end)
  end

  it("runs inside a Sequential (an expert MLP) with splits set on each GroupedLinear", function()
    local a = nn.GroupedLinear(3, 16, 32, { seed = next_seed() })
    local b = nn.GroupedLinear(3, 32, 16, { seed = next_seed() })
    local act = nn.GELU()
    local mlp = nn.Sequential(a, act, b)
    local x = lutra.tensor({ 12, 16 }):randn(next_seed())
    local dy = lutra.tensor({ 12, 16 }):randn(next_seed())
    local splits = { 5, 0, 7 }
    a:set_splits(splits)
    b:set_splits(lutra.from_table(splits, { 3 }, "i32"))
    local y = mlp:forward(x):to_table()
    local dx = mlp:backward(dy):to_table()
    -- the same chain by hand
    local h = act:forward(a:forward(x, splits))
    assert.are.same(y, b:forward(h, splits):to_table())
    assert.are.same(dx, a:backward(act:backward(b:backward(dy))):to_table())
    assert.has_error(function() a:set_splits(3) end)
  end)

  it("runs without bias", function()
    math.randomseed(next_seed())
    local g, lins, per = pair(3, 16, 32, { bias = false })
    local splits, total = random_splits(3, 20)
    step(g, lins, per, 16, 32, splits, total, {})
  end)

  for _, rc in ipairs(recipes) do
    it("equals separate Linears bitwise under " .. rc.name .. " (padded rows, empty experts, "
       .. "new splits each step)", function()
      math.randomseed(next_seed())
      local recipe = rc.make()
      local g, lins, per = pair(4, 32, 64, {})
      local y, dx
      for _ = 1, 3 do
        local splits, total = random_splits(4, 45)
        y, dx = step(g, lins, per, 32, 64, splits, total,
                     { recipe = recipe, align = rc.align, poison = { y = y, dx = dx } })
      end
    end)

    it("caches each expert's FP8 weight across micro-batches under " .. rc.name, function()
      math.randomseed(next_seed())
      local recipe = rc.make()
      local g, lins, per = pair(3, 32, 32, {})
      local splits = { 7, 3, 16 }
      step(g, lins, per, 32, 32, splits, 26, { recipe = recipe, align = rc.align, first = true })
      -- new weights: a micro-batch that is not the first keeps the cached FP8 weights
      local gp = g:parameters()
      for e = 1, 3 do
        local w = gp[(e - 1) * per + 1].value
        w:randn(next_seed())
        lins[e]:parameters()[1].value:copy(w)
      end
      local y1 = step(g, lins, per, 32, 32, { 3, 21, 2 }, 26,
                      { recipe = recipe, align = rc.align, first = false })
      local x = lutra.tensor({ 26, 32 }):randn(next_seed())
      local scope = lutra.autocast{ recipe = recipe }
      local cached = scope:run(function() return g:forward(x, splits, false):to_table() end)
      local fresh = scope:run(function() return g:forward(x, splits, true):to_table() end)
      assert.are_not.same(cached, fresh)
      assert.is_truthy(y1)
    end)
  end

  it("calibrates every expert's delayed scaling as Linears do", function()
    math.randomseed(next_seed())
    local recipe = lutra.recipe.delayed { amax_history_len = 4 }
    local g, lins, per = pair(3, 32, 32, {})
    local splits = { 9, 16, 7 }
    local x = lutra.tensor({ 32, 32 }):randn(next_seed())
    -- a calibrating scope records amaxes and computes in high precision
    local cal_g = lutra.autocast { recipe = recipe, calibrating = true }
    local cal_l = lutra.autocast { recipe = recipe, calibrating = true }
    local yg = cal_g:run(function() return g:forward(x, splits):to_table() end)
    local first = 0
    cal_l:run(function()
      for e = 1, 3 do
        local xe = slice(x, first, splits[e], 32, splits[e])
        local ye = lins[e]:forward(xe)
        local want = ye:to_table()
        for i = 1, splits[e] * 32 do
          assert.are.equal(want[i], yg[first * 32 + i], "calibration output of expert " .. e)
        end
        first = first + splits[e]
      end
    end)
    -- then FP8 with the calibrated scales: equal again
    step(g, lins, per, 32, 32, { 4, 20, 8 }, 32, { recipe = recipe, align = 16 })
  end)

  it("keeps the FP8 weights under the device skip flag (is_first_microbatch \"device\")", function()
    local recipe = lutra.recipe.current{}
    local g = nn.GroupedLinear(2, 32, 32, { seed = next_seed() })
    local x = lutra.tensor({ 20, 32 }):randn(next_seed())
    local splits = { 9, 11 }
    local scope = lutra.autocast{ recipe = recipe }
    local function fwd() return scope:run(function() return g:forward(x, splits, "device"):to_table() end) end
    lutra.set_skip_weight_update("cpu", false)
    local first = fwd()
    g:parameters()[1].value:randn(next_seed())
    lutra.set_skip_weight_update("cpu", true)
    local skipped = fwd()
    lutra.set_skip_weight_update("cpu", false)
    local updated = fwd()
    assert.are.same(first, skipped)
    assert.are_not.same(first, updated)
  end)

  it("updates every expert's delayed scaling in the scope's one fused update", function()
    local recipe = lutra.recipe.delayed{ amax_history_len = 4 }
    local g = nn.GroupedLinear(8, 16, 16, { seed = next_seed() })
    local scope = lutra.autocast{ recipe = recipe }
    local x = lutra.tensor({ 40, 16 }):randn(next_seed())
    local u0 = lutra.update_stats()
    scope:run(function() g:forward(x, { 5, 0, 5, 5, 10, 5, 5, 5 }) end)
    local u1, forward_count = lutra.update_stats()
    -- one update at the scope's exit, over the input and weight metas of all 8 experts
    assert.are.equal(u0 + 1, u1)
    assert.are.equal(16, forward_count)
    g:backward(lutra.tensor({ 40, 16 }):randn(next_seed()))
    local u2, backward_count = lutra.update_stats()
    assert.are.equal(u1 + 1, u2)
    assert.are.equal(8, backward_count)
  end)

  it("joins each expert's metas to the scope's update once, however many forwards run", function()
    local recipe = lutra.recipe.delayed{ amax_history_len = 4 }
    local g = nn.GroupedLinear(8, 16, 16, { seed = next_seed() })
    local lin = nn.Linear(16, 16, { seed = next_seed() })
    local scope = lutra.autocast{ recipe = recipe }
    local x = lutra.tensor({ 40, 16 }):randn(next_seed())
    local splits = { 5, 0, 5, 5, 10, 5, 5, 5 }
    local u0 = lutra.update_stats()
    scope:run(function()
      g:forward(x, splits)
      lin:forward(lutra.tensor({ 48, 16 }):randn(next_seed()))
      g:forward(x, { 0, 10, 5, 5, 5, 5, 5, 5 })
    end)
    local u1, count = lutra.update_stats()
    assert.are.equal(u0 + 1, u1)
    -- the 8 experts' input and weight metas once, then the Linear's input and weight
    assert.are.equal(16 + 2, count)
    -- and in the next scope again (a new epoch)
    scope:run(function() g:forward(x, splits) end)
    local u2, count2 = lutra.update_stats()
    assert.are.equal(u1 + 1, u2)
    assert.are.equal(16, count2)
  end)

  it("has gradients that match central differences (f32)", function()
    math.randomseed(next_seed())
    local IN, OUT = 6, 5
    local g = nn.GroupedLinear(3, IN, OUT, { seed = next_seed() })
    local splits, total = { 4, 0, 3 }, 7
    local x = lutra.tensor({ total, IN }):randn(next_seed())
    local r = lutra.tensor({ total, OUT }):randn(next_seed())
    local rt = r:to_table()
    local function loss()
      local y = g:forward(x, splits):to_table()
      local s = 0
      for i = 1, #y do s = s + y[i] * rt[i] end
      return s
    end
    loss()
    local dx = g:backward(r):to_table()
    local p = g:parameters()
    local grads = {}
    for i = 1, #p do grads[i] = p[i].grad:to_table() end
    local h = 0.25
    local function fd(t, i)
      local v = t:to_table()
      local v0 = v[i]
      v[i] = v0 + h; t:set(v); local lp = loss()
      v[i] = v0 - h; t:set(v); local lm = loss()
      v[i] = v0; t:set(v)
      return (lp - lm) / (2 * h)
    end
    local function close(a, b) return math.abs(a - b) <= 1e-3 * math.max(1, math.abs(b)) end
    for _, i in ipairs { 1, 9, 17, 42 } do
      local n = fd(x, i)
      assert.is_true(close(dx[i], n), string.format("dx[%d] %g vs %g", i, dx[i], n))
    end
    for k = 1, #p do
      for _, i in ipairs { 1, 4, #grads[k] } do
        local n = fd(p[k].value, i)
        assert.is_true(close(grads[k][i], n),
                       string.format("param %d grad[%d] %g vs %g", k, i, grads[k][i], n))
      end
    end
    -- the empty expert's weight does not change the loss
    assert.are.equal(0, fd(p[3].value, 1))
  end)

  it("trains with an optimizer over all experts' parameters", function()
    local g = nn.GroupedLinear(2, 8, 8, { seed = next_seed() })
    local opt = lutra.optim.SGD(g, { lr = 0.1 })
    local x = lutra.tensor({ 6, 8 }):randn(next_seed())
    local target = lutra.tensor({ 6, 8 }):randn(next_seed())
    local mse = nn.MSELoss()
    local first, last
    for i = 1, 30 do
      local y = g:forward(x, { 2, 4 })
      mse:forward(y, target)
      g:zero_grad()
      g:backward(mse:backward())
      opt:step()
      if i == 1 then first = mse:value() end
      last = mse:value()
    end
    assert.is_true(last < 0.5 * first, string.format("loss %g -> %g", first, last))
  end)

  describe("bad input", function()
    local g = nn.GroupedLinear(3, 16, 16, { seed = 1 })
    local x = lutra.tensor({ 10, 16 }):randn(2)

    it("refuses splits that do not sum to the rows, negative or missing ones", function()
      assert.has_error(function() g:forward(x, { 3, 3, 3 }) end,
                       "lutra_grouped_forward: m_splits sum to 9, the input has 10 rows")
      assert.has_error(function() g:forward(x, { 3, -1, 8 }) end,
                       "module:forward: m_splits[2] must be an integer >= 0 (got -1)")
      assert.has_error(function() g:forward(x, { 3, 7 }) end,
                       "module:forward: m_splits has 2 entries, the module has 3 experts")
      assert.has_error(function() g:forward(x, { 3, 2.5, 4.5 }) end)
      local neg = lutra.from_table({ 3, -1, 8 }, { 3 }, "i32")
      assert.has_error(function() g:forward(x, neg) end,
                       "lutra_grouped_forward: m_splits[1] is -1: a split must be >= 0")
      assert.has_error(function() g:forward(x, lutra.tensor({ 3 })) end,
                       "lutra_grouped_forward: m_splits must be an i32 tensor (got f32)")
      assert.has_error(function() g:forward(x, lutra.tensor({ 4 }, "i32")) end,
                       "lutra_grouped_forward: m_splits has 4 elements, the module has 3 experts")
    end)

    it("refuses a forward without splits, and splits for another module kind", function()
      local fresh = nn.GroupedLinear(2, 16, 16)
      assert.has_error(function() fresh:forward(x) end)
      assert.has_error(function() nn.Linear(16, 16):forward(x, { 5, 5 }) end,
                       "lutra_grouped_forward: a linear takes no m_splits (a GroupedLinear does, "
                       .. "and a Sequential holding one)")
      assert.has_error(function()
        nn.Linear(16, 16):forward(x, lutra.from_table({ 5, 5 }, { 2 }, "i32"))
      end, "lutra_grouped_forward: a linear takes no m_splits (a GroupedLinear does, and a "
           .. "Sequential holding one)")
    end)

    it("refuses wrong features, dtypes and construction arguments", function()
      assert.has_error(function() g:forward(lutra.tensor({ 10, 8 }), { 5, 5, 0 }) end,
                       "lutra_grouped_forward: input has 8 features, the module expects 16")
      assert.has_error(function() g:forward(lutra.tensor({ 10, 16 }, "bf16"), { 5, 5, 0 }) end)
      assert.has_error(function() nn.GroupedLinear(0, 16, 16) end)
      assert.has_error(function() nn.GroupedLinear(2, 0, 16) end)
      assert.has_error(function() nn.GroupedLinear(2, 16, 16, { colour = 1 }) end,
                       "lutra.nn.GroupedLinear: unknown option 'colour'")
      local desc = lutra.ffi.new("lutra_grouped_linear_desc")
      lutra.C.lutra_grouped_linear_defaults(desc)
      desc.num_gemms, desc.in_features, desc.out_features = 2, 16, 16
      desc.dtype = lutra.C.LUTRA_E4M3
      local box = lutra.ffi.new("lutra_module*[1]")
      assert.are_not.equal(0, lutra.C.lutra_grouped_linear_new(desc, box))
      assert.are_not.equal(0, lutra.C.lutra_grouped_linear_new(nil, box))
    end)

    it("refuses NULL and freed arguments at the C API with a status and a message", function()
      local C, ffi = lutra.C, lutra.ffi
      local box = ffi.new("lutra_tensor*[1]")
      local st = lutra.from_table({ 5, 5, 0 }, { 3 }, "i32")
      local function refused(status, msg)
        assert.are_not.equal(0, status)
        assert.matches(msg, ffi.string(C.lutra_last_error()), 1, true)
      end
      refused(C.lutra_grouped_forward(nil, x, st, nil, box), "lutra_grouped_forward: module is NULL")
      refused(C.lutra_grouped_set_splits(g, nil), "lutra_grouped_set_splits: m_splits is NULL")
      refused(C.lutra_grouped_num_gemms(g, nil), "lutra_grouped_num_gemms: n is NULL")
      refused(C.lutra_grouped_set_path(g, 7), "lutra_grouped_set_path: path must be")
      refused(C.lutra_grouped_forward(g, x, st, nil, box), "args is NULL")
      local lin = nn.Linear(16, 16)
      refused(C.lutra_grouped_check(lin), "module is a linear, not a grouped_linear")
    end)

    it("refuses FP8 with features that are no multiple of 16", function()
      local odd = nn.GroupedLinear(2, 24, 16)
      local scope = lutra.autocast{ recipe = lutra.recipe.current{} }
      assert.has_error(function()
        scope:run(function() odd:forward(lutra.tensor({ 4, 24 }), { 2, 2 }) end)
      end)
    end)

    -- recipes it cannot honour are refused by name, with the module unchanged: before, a rowwise
    -- recipe failed inside the CPU block cast, and hybrid recipes ran with one format for both
    -- copies
    it("refuses rowwise and hybrid recipes, saying why, and changes nothing", function()
      local m = nn.GroupedLinear(2, 32, 32, { seed = 5 })
      local x32 = lutra.tensor({ 8, 32 }):randn(6)
      local before = m:forward(x32, { 4, 4 }):to_table()
      local R = lutra.recipe
      local cases = {
        { R.rowwise {}, "GroupedLinear has no rowwise quantization: its casts have no grouped kernels" },
        { R.custom { input = { kind = "current", columnwise_format = "e5m2" },
                     weight = { kind = "current" }, grad_output = { kind = "current", format = "e4m3" } },
          "GroupedLinear has no hybrid roles: the input role's columnwise copy is in another format" },
      }
      for _, c in ipairs(cases) do
        local ok, err = pcall(function()
          lutra.autocast { recipe = c[1] }:run(function() m:forward(x32, { 4, 4 }) end)
        end)
        assert.is_false(ok)
        assert.is_truthy(tostring(err):find("lutra_grouped_forward: " .. c[2], 1, true), tostring(err))
      end
      assert.are.same(before, m:forward(x32, { 4, 4 }):to_table())
    end)

    it("refuses a backward before a forward, or after new splits", function()
      local h = nn.GroupedLinear(2, 16, 16)
      assert.has_error(function() h:backward(lutra.tensor({ 4, 16 })) end,
                       "lutra_grouped_backward: backward called before forward")
      h:forward(lutra.tensor({ 4, 16 }), { 1, 3 })
      assert.has_error(function() h:backward(lutra.tensor({ 5, 16 })) end)
      h:forward(lutra.tensor({ 4, 16 }), { 1, 3 })
      lutra.C.lutra_grouped_set_splits(h, lutra.from_table({ 2, 2 }, { 2 }, "i32"))
      assert.has_error(function() h:backward(lutra.tensor({ 4, 16 })) end,
                       "lutra_grouped_backward: backward called before forward")
    end)

    it("keeps the last output when a call is refused, and survives free and GC", function()
      local h = nn.GroupedLinear(2, 16, 16, { seed = 3 })
      local xi = lutra.tensor({ 4, 16 }):randn(4)
      local y = h:forward(xi, { 1, 3 })
      local before = y:to_table()
      assert.has_error(function() h:forward(xi, { 1, 2 }) end)
      assert.has_error(function() h:forward(xi, lutra.from_table({ 1, -3 }, { 2 }, "i32")) end)
      assert.are.same(before, y:to_table())
      -- the refused calls changed nothing: the backward of the last forward still runs
      assert.are.same({ 4, 16 }, h:backward(lutra.tensor({ 4, 16 }):randn(6)):dims())
      local p = h:parameters()
      h:destroy()
      assert.has_error(function() h:forward(xi, { 1, 3 }) end)
      assert.has_error(function() p[1].value:to_table() end)
      assert.has_error(function() y:to_table() end)
      h, p, y = nil, nil, nil
      collectgarbage()
      collectgarbage()
      assert.is_nil(h)
      assert.are.equal(0, lutra.C.lutra_grouped_check(nil) == 0 and 1 or 0)
    end)
  end)
end)
