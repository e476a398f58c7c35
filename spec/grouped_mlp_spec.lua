-- The expert MLP: Sequential(GroupedLinear, activation, GroupedLinear) with m_splits passed once
-- (they travel in the forward's args to both GroupedLinears), on the CPU backend, against the
-- same three modules run one by one with the splits given to each. Through the fusion protocol
-- the activation runs inside the second GroupedLinear's split-quantize of its FP8 input and its
-- derivative (with the bias gradient) inside the first one's grad_output split-quantize, under
-- the per-tensor recipes (delayed, current); the fused casts form each value with the
-- activation's own formula rounded into the module's dtype, so every output and gradient is bit
-- for bit the composition's, for f32 and bf16 and every recipe (MXFP8 and the block recipes,
-- and high precision, run the activation's kernel: the composition itself). The f32 forward is
-- also checked against a float64 reference computed here (tolerance 1e-5 relative). Splits are
-- drawn fresh each call, with empty experts and sizes that are no multiple of the alignment;
-- outputs are poisoned before each run.
local lutra = require("lutra")
local nn = lutra.nn

local KINDS = {
  { name = "relu", make = nn.ReLU, f = function(v) return v > 0 and v or 0 end },
  { name = "silu", make = nn.SiLU, f = function(v) return v / (1 + math.exp(-v)) end },
  { name = "gelu_tanh", make = nn.GELU },
  { name = "qgelu", make = nn.QuickGELU },
  { name = "gelu_erf", make = function() return nn.GELU { approximate = "none" } end },
  { name = "tanh", make = nn.Tanh, f = math.tanh },
  { name = "swiglu", make = nn.SwiGLU, gated = true },
  { name = "reglu", make = nn.ReGLU, gated = true },
}

-- high precision, then the recipes of spec/act_fusion_spec.lua
local RECIPES = { { name = "high precision" } }
for _, r in ipairs(require("spec.support.fusion_recipes")) do RECIPES[#RECIPES + 1] = r end

local NUM, IN, H, OUT = 4, 32, 32, 32

local function random_splits(rows_max)
  local s, total = {}, 0
  for e = 1, NUM do
    s[e] = math.random() < 0.3 and 0 or math.random(1, rows_max)
    total = total + s[e]
  end
  if total == 0 then s[2], total = 7, 7 end
  return s, total
end

-- tensors or tables of their values
local function same_bits(a, b, what)
  local x = type(a) == "table" and a or a:to_table()
  local y = type(b) == "table" and b or b:to_table()
  assert.are.equal(#y, #x, what .. ": sizes")
  for i = 1, #x do
    if x[i] ~= y[i] and not (x[i] ~= x[i] and y[i] ~= y[i]) then
      error(string.format("%s: element %d differs: %.9g vs %.9g", what, i, x[i], y[i]), 2)
    end
  end
end

local function modules(kind, dtype, seed)
  local h_in = kind.gated and 2 * H or H
  return { nn.GroupedLinear(NUM, IN, h_in, { dtype = dtype, seed = seed }), kind.make(),
           nn.GroupedLinear(NUM, H, OUT, { dtype = dtype, seed = seed + 100 }) }
end

local function under(recipe, f)
  if recipe then lutra.autocast { recipe = recipe }:run(f) else f() end
end

-- the fused Sequential and the modules one by one, on the same input, gradient and splits
local function compare(kind, rec, dtype, splits_as_tensor)
  local seed = math.random(1, 2 ^ 20)
  local a, b = modules(kind, dtype, seed), modules(kind, dtype, seed)
  local seq = nn.Sequential(a[1], a[2], a[3])
  local splits, rows = random_splits(23)
  local sp = splits
  if splits_as_tensor then sp = lutra.from_table(splits, { NUM }, "i32") end
  local x = lutra.tensor({ rows, IN }, dtype):randn(seed + 1)
  local dy = lutra.tensor({ rows, OUT }, dtype):randn(seed + 2)
  local recipe_a, recipe_b = rec.make and rec.make(), rec.make and rec.make()
  local y1, y2
  under(recipe_a, function() y1 = seq:forward(x, sp) end)
  local dx1 = seq:backward(dy)
  local fwd, bwd = seq:fusions()
  under(recipe_b, function()
    local h = b[1]:forward(x, sp)
    h = b[2]:forward(h)
    y2 = b[3]:forward(h, sp)
  end)
  local g = b[3]:backward(dy)
  g = b[2]:backward(g)
  local dx2 = b[1]:backward(g)
  local tag = string.format("%s %s %s", kind.name, rec.name, dtype)
  same_bits(y1, y2, tag .. ": forward output")
  same_bits(dx1, dx2, tag .. ": input gradient")
  for _, m in ipairs { 1, 3 } do
    local pa, pb = a[m]:parameters(), b[m]:parameters()
    for j = 1, #pa do
      same_bits(pa[j].grad, pb[j].grad, string.format("%s: grouped %d parameter %d gradient", tag, m, j))
    end
  end
  return fwd, bwd, a, x, splits, y1
end

-- y = act(x W1_e^T + b1_e) W2_e^T + b2_e per expert, in float64
local function reference(kind, mods, x, splits)
  local p1, p2 = mods[1]:parameters(), mods[3]:parameters()
  local xs = x:to_table()
  local out, r0 = {}, 0
  for e = 1, NUM do
    local w1, b1 = p1[2 * e - 1].value:to_table(), p1[2 * e].value:to_table()
    local w2, b2 = p2[2 * e - 1].value:to_table(), p2[2 * e].value:to_table()
    for r = r0, r0 + splits[e] - 1 do
      local h = {}
      for j = 1, H do
        local s = b1[j]
        for k = 1, IN do s = s + xs[r * IN + k] * w1[(j - 1) * IN + k] end
        h[j] = kind.f(s)
      end
      for o = 1, OUT do
        local s = b2[o]
        for j = 1, H do s = s + h[j] * w2[(o - 1) * H + j] end
        out[r * OUT + o] = s
      end
    end
    r0 = r0 + splits[e]
  end
  return out
end

describe("the expert MLP: Sequential(GroupedLinear, activation, GroupedLinear)", function()
  for _, kind in ipairs(KINDS) do
    for _, rec in ipairs(RECIPES) do
      for _, dtype in ipairs { "f32", "bf16" } do
        it(string.format("%s, %s, %s: fused equals the modules one by one", kind.name, rec.name,
                         dtype), function()
          local fwd, bwd = compare(kind, rec, dtype, dtype == "bf16")
          -- forward: the activation inside the second GroupedLinear's input cast under the
          -- per-tensor recipes; backward: its derivative in the first one's grad_output cast
          local want_fwd = (rec.fuses or rec.fuses_forward_only) and 1 or 0
          local want_bwd = rec.fuses and 1 or 0
          assert.are.same({ want_fwd, want_bwd }, { fwd, bwd }, "fusions (forward, backward)")
        end)
      end
    end
  end

  it("computes the expert MLP in f32 (float64 reference)", function()
    for _, kind in ipairs(KINDS) do
      if kind.f then
        local _, _, mods, x, splits, y = compare(kind, RECIPES[1], "f32")
        local ref, got = reference(kind, mods, x, splits), y:to_table()
        local scale, worst = 0, 0
        for i = 1, #ref do scale = math.max(scale, math.abs(ref[i])) end
        for i = 1, #ref do worst = math.max(worst, math.abs(got[i] - ref[i])) end
        assert.is_true(worst <= 1e-5 * scale, string.format("%s: %.3g relative", kind.name,
                                                               worst / scale))
      end
    end
  end)

  it("runs again with new splits each step (bitwise as the composition)", function()
    for _ = 1, 3 do compare(KINDS[2], RECIPES[2], "f32") end
  end)

  it("gives the same output in an inference forward (grad = false), fused or not", function()
    for _, rec in ipairs { RECIPES[1], RECIPES[2], RECIPES[3] } do
      -- two alike stacks, each with its own recipe (delayed scaling's state moves each step)
      local a, b = modules(KINDS[2], "f32", 31), modules(KINDS[2], "f32", 31)
      local seq_a, seq_b = nn.Sequential(a[1], a[2], a[3]), nn.Sequential(b[1], b[2], b[3])
      local splits, rows = random_splits(17)
      local x = lutra.tensor({ rows, IN }):randn(math.random(1, 2 ^ 20))
      local y1, y2
      under(rec.make and rec.make(), function() y1 = seq_a:forward(x, splits) end)
      under(rec.make and rec.make(), function() y2 = seq_b:forward(x, splits, { grad = false }) end)
      same_bits(y2, y1, rec.name .. ": inference forward")
      assert.are.same({ seq_a:fusions() }, { seq_b:fusions() }, rec.name .. ": fusions")
      assert.has_error(function() seq_b:backward(lutra.tensor({ rows, OUT })) end)
    end
  end)

  it("takes the splits set on each GroupedLinear when forward is given none", function()
    local mods = modules(KINDS[1], "f32", 77)
    local seq = nn.Sequential(mods[1], mods[2], mods[3])
    local splits, rows = random_splits(9)
    local x = lutra.tensor({ rows, IN }):randn(3)
    mods[1]:set_splits(splits)
    mods[3]:set_splits(splits)
    local y = seq:forward(x):to_table()
    same_bits(seq:forward(x, splits), y, "set_splits and forward's splits")
  end)
end)

describe("the expert MLP refuses bad input", function()
  -- seq:forward(x, splits) fails with an error containing msg (x: 8 rows of IN by default)
  local function refused(seq, splits, msg, x)
    local ok, err = pcall(seq.forward, seq, x or lutra.tensor({ 8, IN }):randn(1), splits)
    assert.is_false(ok)
    assert.matches(msg, err, 1, true)
  end

  it("a forward without splits", function()
    local mods = modules(KINDS[1], "f32", 5)
    local seq = nn.Sequential(mods[1], mods[2], mods[3])
    assert.has_error(function() seq:forward(lutra.tensor({ 8, IN }):randn(1)) end,
                     "lutra_grouped_forward: no m_splits for this forward: pass "
                     .. "them to forward (the splits of lutra_forward_args, which a Sequential "
                     .. "hands to each of its GroupedLinears) or set them first "
                     .. "(lutra_grouped_set_splits)")
  end)

  it("splits given to a Sequential without a GroupedLinear", function()
    local seq = nn.Sequential(nn.Linear(IN, H), nn.ReLU(), nn.Linear(H, OUT))
    refused(seq, { 4, 4 }, "lutra_grouped_forward: a sequential takes no m_splits")
  end)

  it("splits for another number of experts than the second GroupedLinear's", function()
    local seq = nn.Sequential(nn.GroupedLinear(4, IN, H), nn.ReLU(), nn.GroupedLinear(3, H, OUT))
    refused(seq, { 2, 2, 2, 2 }, "m_splits has 4 elements, the module has 3 experts")
  end)

  it("modules in an order whose features do not chain", function()
    -- a gated activation halves 32 features into 16: the second GroupedLinear expects 32
    local seq = nn.Sequential(nn.GroupedLinear(4, IN, H), nn.SwiGLU(), nn.GroupedLinear(4, H, OUT))
    refused(seq, { 2, 2, 2, 2 }, "the activation's output has 16 features, the module expects 32")
    -- the activation first: its input is the data, of IN features, and it runs in the
    -- GroupedLinear's cast; a GroupedLinear after the last one is refused by its features
    local seq2 = nn.Sequential(nn.ReLU(), nn.GroupedLinear(4, IN, H), nn.GroupedLinear(4, OUT, 16))
    local y = seq2:forward(lutra.tensor({ 8, IN }):randn(2), { 2, 2, 2, 2 })
    assert.are.same({ 8, 16 }, y:dims())
    local seq3 = nn.Sequential(nn.GroupedLinear(4, IN, H), nn.GroupedLinear(4, 16, OUT))
    refused(seq3, { 2, 2, 2, 2 }, "input has 32 features, the module expects 16")
  end)

  it("splits that do not sum to the rows, and leaves the modules as they were", function()
    local mods = modules(KINDS[1], "f32", 9)
    local seq = nn.Sequential(mods[1], mods[2], mods[3])
    local x = lutra.tensor({ 8, IN }):randn(1)
    local y = seq:forward(x, { 2, 2, 2, 2 }):to_table()
    refused(seq, { 2, 2, 2, 3 }, "m_splits sum to 9, the input has 8 rows", x)
    -- the refused call did not replace the splits: the backward of the last forward still runs
    seq:backward(lutra.tensor({ 8, OUT }):randn(2))
    same_bits(seq:forward(x, { 2, 2, 2, 2 }), y, "after the refused call")
  end)
end)
