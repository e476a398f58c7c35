-- nn.MultiheadAttention and nn.TransformerLayer on the CPU backend (f32): each equals its pieces
-- composed by hand with the same weights (LayerNormLinear for QKV, RotaryEmbedding's in-place
-- apply_qkv, DotProductAttention on the packed QKV, Linear, residual adds, LayerNormMLP, or
-- MoEMLP for a layer made with moe = {experts, top_k}), bit
-- for bit in forward, input gradient and every parameter gradient (the same operations in the
-- same order); the whole layer's input gradient against central finite differences (h = 1e-2
-- on f32: bound 2e-2 relative to the largest gradient, which the differences' rounding, ~1e-4,
-- and their O(h^2) error sit well inside); checkpoints, print, parts and bad input.
local lutra = require("lutra")
local nn = lutra.nn
local seed = os.time() % 100000

local function randn(shape, s) return lutra.tensor(shape):randn(s, 0, 1) end

local function values(t) return t:to_table() end

local function assert_same(got, want, what)
  local g, w = values(got), values(want)
  assert.are.equal(#w, #g, what .. ": sizes")
  for i = 1, #w do
    if g[i] ~= w[i] then
      error(string.format("%s: element %d is %.9g, the composition gives %.9g", what, i, g[i],
                          w[i]), 2)
    end
  end
end

-- the pieces of a layer of config c, with the layer's weights copied in
local function pieces_of(layer, c)
  local qkv_out = (c.H + 2 * c.Hkv) * c.D
  local p = {
    qkv = nn.LayerNormLinear(c.hidden, qkv_out, { normalization = c.norm }),
    attn = nn.DotProductAttention(c.H, c.D, { num_gqa_groups = c.Hkv }),
    proj = nn.Linear(c.H * c.D, c.hidden),
    rope = c.rope and nn.RotaryEmbedding(c.D) or nil,
    mlp = c.ffn and not c.moe and nn.LayerNormMLP(c.hidden, c.ffn, { normalization = c.norm,
                                                                     activation = c.act }) or nil,
  }
  if c.moe then
    p.mlp = nn.MoEMLP(c.hidden, c.ffn, c.moe.experts, c.moe.top_k,
                      { normalization = c.norm, activation = c.act })
  end
  local mine = {}
  for _, m in ipairs { p.qkv, p.proj, p.mlp } do
    for _, q in ipairs(m:parameters()) do mine[#mine + 1] = q end
  end
  local theirs = layer:parameters()
  assert.are.equal(#theirs, #mine, "parameter count")
  for i, q in ipairs(theirs) do mine[i].value:copy(q.value) end
  return p, mine
end

local function hand_forward(p, c, x)
  local qkv = p.qkv:forward(x)
  if p.rope then p.rope:apply_qkv(qkv, c.H, c.Hkv) end
  local a = p.proj:forward(p.attn:forward(qkv))
  if not p.mlp then return a end -- a MultiheadAttention has no residual of its own
  local h = lutra.add(x, a)
  return lutra.add(h, p.mlp:forward(h))
end

local function hand_backward(p, c, dy)
  local dh = dy
  if p.mlp then dh = lutra.add(dy, p.mlp:backward(dy)) end
  local dqkv = p.attn:backward(p.proj:backward(dh))
  if p.rope then p.rope:apply_qkv(dqkv, c.H, c.Hkv, true) end
  local dx = p.qkv:backward(dqkv)
  if not p.mlp then return dx end
  return lutra.add(dh, dx)
end

local CONFIGS = {
  { hidden = 16, H = 4, Hkv = 4, D = 4, ffn = 32, B = 2, T = 5 },
  { hidden = 16, H = 4, Hkv = 2, D = 8, ffn = 24, B = 1, T = 7, rope = true, norm = "RMSNorm",
    act = "swiglu" },
  { hidden = 12, H = 2, Hkv = 1, D = 6, B = 2, T = 3, rope = true }, -- MultiheadAttention alone
  { hidden = 16, H = 4, Hkv = 4, D = 4, ffn = 12, B = 2, T = 5, moe = { experts = 4, top_k = 2 } },
  { hidden = 16, H = 4, Hkv = 2, D = 4, ffn = 8, B = 1, T = 6, rope = true, norm = "RMSNorm",
    act = "swiglu", moe = { experts = 3, top_k = 1 } },
}

local function build(c, s)
  local opts = { num_gqa_groups = c.Hkv, head_dim = c.D, rope = c.rope, normalization = c.norm,
                 seed = s }
  if not c.ffn then return nn.MultiheadAttention(c.hidden, c.H, opts) end
  opts.activation = c.act
  opts.moe = c.moe
  return nn.TransformerLayer(c.hidden, c.ffn, c.H, opts)
end

describe("nn.TransformerLayer and nn.MultiheadAttention", function()
  for n, c in ipairs(CONFIGS) do
    it("equal their pieces composed by hand, bit for bit (config " .. n .. ")", function()
      local layer = build(c, seed + n)
      local p, mine = pieces_of(layer, c)
      for step = 1, 2 do
        local x = randn({ c.B, c.T, c.hidden }, seed + 10 * n + step)
        local dy = randn({ c.B, c.T, c.hidden }, seed + 10 * n + step + 5)
        assert_same(layer:forward(x), hand_forward(p, c, x), "y")
        assert_same(layer:backward(dy), hand_backward(p, c, dy), "dx")
        for i, q in ipairs(layer:parameters()) do
          assert_same(q.grad, mine[i].grad, "parameter " .. i .. "'s gradient")
        end
      end
    end)
  end

  it("gives the input gradient of finite differences", function()
    local c = CONFIGS[2]
    local layer = build(c, seed)
    local shape = { c.B, c.T, c.hidden }
    local x = randn(shape, seed + 1)
    local w = values(randn(shape, seed + 2))
    local xv = values(x)
    local function loss()
      local y = values(layer:forward(x))
      local s = 0
      for i = 1, #y do s = s + y[i] * w[i] end
      return s
    end
    layer:forward(x)
    local dx = values(layer:backward(lutra.from_table(w, shape)))
    local biggest = 0
    for i = 1, #dx do biggest = math.max(biggest, math.abs(dx[i])) end
    for _, i in ipairs { 1, 7, 20, #xv - 3, #xv } do
      local v = xv[i]
      xv[i] = v + 1e-2
      x:set(xv)
      local lp = loss()
      xv[i] = v - 1e-2
      x:set(xv)
      local lm = loss()
      xv[i] = v
      x:set(xv)
      local num = (lp - lm) / 2e-2
      assert(math.abs(num - dx[i]) <= 2e-2 * biggest,
             string.format("dx[%d] = %.6g, finite differences %.6g", i, dx[i], num))
    end
  end)

  it("saves and loads, prints its kind and hands out its parts", function()
    local c = CONFIGS[1]
    local a, b = build(c, seed), build(c, seed + 99)
    local x = randn({ c.B, c.T, c.hidden }, seed + 3)
    local path = os.tmpname()
    lutra.save(path, { model = a })
    lutra.load(path, { model = b })
    os.remove(path)
    assert_same(b:forward(x), a:forward(x), "y after load")
    assert.are.equal("transformer_layer", a:kind())
    assert.is_truthy(tostring(a):find("transformer_layer", 1, true))
    assert.are.equal("layernorm_linear", a:part("qkv"):kind())
    assert.are.equal("dot_product_attention", a:part("attention"):kind())
    assert.are.equal("layernorm_mlp", a:part("mlp"):kind())
    local mha = build(CONFIGS[3], seed)
    assert.has_error(function() mha:part("mlp") end,
                     "lutra.nn.TransformerLayer:part: a MultiheadAttention has no mlp")
  end)

  it("with moe: saves and loads under moe_mlp.*, and its part mlp is the MoEMLP", function()
    local c = CONFIGS[4]
    local a, b = build(c, seed), build(c, seed + 99)
    local x = randn({ c.B, c.T, c.hidden }, seed + 4)
    local path = os.tmpname()
    lutra.save(path, { model = a })
    local f = assert(io.open(path, "rb"))
    local bytes = f:read("*a")
    f:close()
    for _, name in ipairs { "moe_mlp.norm.weight", "moe_mlp.router.weight", "moe_mlp.fc1.weight3",
                            "moe_mlp.fc2.bias0", "self_attention.proj.weight" } do
      assert.is_truthy(bytes:find('"' .. name .. '"', 1, true), name .. " is in the file")
    end
    lutra.load(path, { model = b })
    os.remove(path)
    assert_same(b:forward(x), a:forward(x), "y after load")
    local mlp = a:part("mlp")
    assert.are.equal("moe_mlp", mlp:kind())
    local _, idx = mlp:routing()
    assert.are.same({ c.B * c.T, 2 }, idx:dims())
  end)

  it("refuses bad configurations with the reason", function()
    local function err(f)
      local ok, msg = pcall(f)
      assert.is_false(ok)
      return tostring(msg)
    end
    assert.is_truthy(err(function() nn.TransformerLayer(16, 32, 4, { num_gqa_groups = 3 }) end)
                     :find("num_gqa_groups (3) must divide num_heads (4)", 1, true))
    assert.is_truthy(err(function() nn.MultiheadAttention(10, 4) end)
                     :find("hidden (10) is not a multiple of num_heads (4)", 1, true))
    assert.is_truthy(err(function()
      nn.TransformerLayer(16, 32, 4, { input_layernorm = false })
    end):find("pre-norm", 1, true))
    assert.is_truthy(err(function()
      nn.MultiheadAttention(12, 4, { rope = true }) -- head_dim 3: RoPE needs an even one
    end):find("lutra_mha_new", 1, true))
    assert.is_truthy(err(function() nn.TransformerLayer(16, 32, 4, { activation = "mish" }) end)
                     :find("activation", 1, true))
    assert.is_truthy(err(function() nn.TransformerLayer(16, 32, 4, { moe = 4 }) end)
                     :find("moe must be a table {experts =, top_k =}", 1, true))
    assert.is_truthy(err(function()
      nn.TransformerLayer(16, 32, 4, { moe = { experts = 2, top_k = 3 } })
    end):find("lutra_transformer_new: lutra_moe_mlp_new: top_k = 3 must be in 1..experts (2)", 1,
              true))
    assert.is_truthy(err(function() nn.TransformerLayer(16, 32, 4, { moe = { experts = 2 } }) end)
                     :find("moe.top_k", 1, true))
    assert.is_truthy(err(function()
      nn.TransformerLayer(16, 32, 4, { moe = { experts = 2, top_k = 1, k = 1 } })
    end):find("unknown option 'k'", 1, true))
  end)

  it("fp8_attention: the attention part runs FP8 inside a delayed scope, its dtype outside", function()
    local opts = { head_dim = 128, seed = seed + 90, fp8_attention = true }
    local fp8 = nn.TransformerLayer(64, 64, 2, opts)
    opts.fp8_attention = nil
    local plain = nn.TransformerLayer(64, 64, 2, opts)
    local x = randn({ 1, 16, 64 }, seed + 91)
    -- outside a scope the two layers are the same computation
    assert_same(fp8:forward(x), plain:forward(x), "y outside a scope")
    assert.is_false(fp8:part("attention"):fp8_state().last_fp8)
    local scope = lutra.autocast { recipe = lutra.recipe.delayed { amax_history_len = 4 } }
    local a, b
    for _ = 1, 3 do -- the delayed scales settle over the first steps
      scope:enter()
      a = values(fp8:forward(x))
      scope:exit()
      scope:enter()
      b = values(plain:forward(x))
      scope:exit()
    end
    assert.is_true(fp8:part("attention"):fp8_state().last_fp8)
    assert.is_false(plain:part("attention"):fp8_state().last_fp8)
    local num, den, differ = 0, 0, false
    for i = 1, #b do
      num, den = num + (a[i] - b[i]) ^ 2, den + b[i] ^ 2
      differ = differ or a[i] ~= b[i]
    end
    -- E4M3 q, k, v, S and O (3 mantissa bits) inside a residual stream: ~1e-4 of y measured
    assert.is_true(differ, "the FP8 attention changed nothing")
    assert.is_true(num / den < 1e-2, string.format("NMSE %.3g (seed %d)", num / den, seed))
    local ok, e = pcall(nn.TransformerLayer, 64, 64, 4, { fp8_attention = true })
    assert.is_false(ok)
    assert.truthy(tostring(e):find("128", 1, true), e)
  end)
end)
