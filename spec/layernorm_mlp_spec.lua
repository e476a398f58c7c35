-- nn.LayerNormMLP on the CPU backend: norm -> FC1 -> activation -> FC2.
--   f32, no FP8, every activation: forward against an f64 reference (1e-5 relative to
--   max|ref|: f32 element math), every gradient against central finite differences of it
--   (h = 1e-4, 1e-3 relative to max|num|; the kinks of relu, srelu and reglu at 0 are met with
--   probability ~1e-3 per run by random pre-activations, well inside the bound otherwise);
--   per recipe and without one: y, dx and every parameter gradient bit for bit those of the plain
--   composition nn.LayerNorm, nn.Linear, the activation module, nn.Linear (the same operations:
--   the norm's FP8 output equals the quantized norm output, and both chains fuse the same
--   pairs), over two steps; the tanh GELU runs in FC1's epilogue (the fusion counts say so).
local lutra = require("lutra")
local nn = lutra.nn
local N = require("spec.support.norm_modules")

local function sigmoid(x) return 1 / (1 + math.exp(-x)) end
local function gelu(x)
  return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))
end
local function relu(x) return x > 0 and x or 0 end
local ACTS = {
  gelu = { f = gelu, module = function() return nn.GELU() end },
  relu = { f = relu, module = nn.ReLU },
  silu = { f = function(x) return x * sigmoid(x) end, module = nn.SiLU },
  qgelu = { f = function(x) return x * sigmoid(1.702 * x) end, module = nn.QuickGELU },
  srelu = { f = function(x) return relu(x) ^ 2 end, module = nn.SquaredReLU },
  tanh = { f = math.tanh, module = nn.Tanh },
  swiglu = { gated = function(a, b) return a * sigmoid(a) * b end, module = nn.SwiGLU },
  geglu = { gated = function(a, b) return gelu(a) * b end, module = nn.GeGLU },
  reglu = { gated = function(a, b) return relu(a) * b end, module = nn.ReGLU },
}
local ACT_NAMES = { "gelu", "relu", "silu", "qgelu", "srelu", "tanh", "swiglu", "geglu", "reglu" }

local function ref_forward(x, v, rows, h, ffn, act, rms, eps)
  local g, beta = v[1], not rms and v[2] or nil
  local k = rms and 1 or 2
  local w1, b1, w2, b2 = v[k + 1], v[k + 2], v[k + 3], v[k + 4]
  local ln = N.ref_norm(x, g, beta, rows, h, eps, rms)
  local a = ACTS[act]
  local n1 = a.gated and 2 * ffn or ffn
  local z = N.ref_linear(ln, w1, b1, rows, h, n1)
  local hdn = {}
  for r = 0, rows - 1 do
    for c = 1, ffn do
      if a.gated then
        hdn[r * ffn + c] = a.gated(z[r * n1 + c], z[r * n1 + ffn + c])
      else
        hdn[r * ffn + c] = a.f(z[r * n1 + c])
      end
    end
  end
  return N.ref_linear(hdn, w2, b2, rows, ffn, h)
end

describe("nn.LayerNormMLP", function()
  for _, act in ipairs(ACT_NAMES) do
    for _, rms in ipairs { false, true } do
      local norm_name = rms and "RMSNorm" or "LayerNorm"
      it(act .. ", " .. norm_name .. ": f64 reference and finite differences", function()
        local rows, h, ffn, eps = 3, 6, 4, 1e-5
        local m = nn.LayerNormMLP(h, ffn, { activation = act, normalization = norm_name })
        local p = m:parameters()
        assert.are.equal(rms and 5 or 6, #p)
        for i = 1, #p do p[i].value:randn(math.random(1, 2 ^ 30), i == 1 and 1 or 0, 0.5) end
        local x = lutra.tensor({ rows, h }):randn(math.random(1, 2 ^ 30), 0.1, 1.3)
        local rt = lutra.tensor({ rows, h }):randn(math.random(1, 2 ^ 30))
        N.check_reference(m, x, rt, function(xv, v)
          return ref_forward(xv, v, rows, h, ffn, act, rms, eps)
        end, act)
      end)
    end
  end

  for _, rc in ipairs(N.recipe_cases()) do
    for _, act in ipairs { "gelu", "swiglu", "relu" } do
      for _, dtype in ipairs { "f32", "bf16" } do
        local name = string.format("%s %s %s", rc.name, act, dtype)
        it(name .. ": bit for bit LayerNorm + Linear + activation + Linear, two steps", function()
          local seed = math.random(1, 2 ^ 30)
          local rows, h, ffn = 64, 64, 96
          local gated = ACTS[act].gated ~= nil
          local m = nn.LayerNormMLP(h, ffn, { activation = act, dtype = dtype })
          local plain = nn.Sequential(nn.LayerNorm(h, { dtype = dtype }),
                                      nn.Linear(h, gated and 2 * ffn or ffn, { dtype = dtype }),
                                      ACTS[act].module(), nn.Linear(ffn, h, { dtype = dtype }))
          local pm, pp = m:parameters(), plain:parameters()
          N.tie_parameters(pm, pp, seed, 0.4)
          local recipe = rc.make and rc.make() or nil
          for step = 1, 2 do
            local x = lutra.tensor({ rows, h }, dtype):randn(seed + 10 * step)
            local dy = lutra.tensor({ rows, h }, dtype):randn(seed + 10 * step + 1)
            local what = name .. " step " .. step
            N.same_step(m, plain, pm, pp, recipe, x, dy, what)
            local ff, fb = m:mlp_fusions()
            local pf, pb = plain:fusions()
            assert.are.same({ pf, pb }, { ff, fb }, what .. ": fusions")
            if act == "gelu" then assert.are.equal(1, ff, what .. ": GELU in FC1's epilogue") end
          end
        end)
      end
    end
  end

  it("an AdamW loop reaches the parameters of all three parts", function()
    local m = nn.LayerNormMLP(32, 64, { activation = "swiglu", normalization = "RMSNorm" })
    local before = {}
    for i, p in ipairs(m:parameters()) do before[i] = p.value:bytes(false) end
    local opt = lutra.optim.AdamW(m, { lr = 1e-2 })
    m:forward(lutra.tensor({ 16, 32 }):randn(1))
    m:backward(lutra.tensor({ 16, 32 }):randn(2))
    opt:step()
    for i, p in ipairs(m:parameters()) do
      assert.is_true(p.value:bytes(false) ~= before[i], "parameter " .. i .. " did not move")
    end
  end)

  it("refuses bad options naming the call", function()
    local function fails(pat, f, ...)
      local ok, err = pcall(f, ...)
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(pat, 1, true), tostring(err))
    end
    fails("unknown activation", nn.LayerNormMLP, 8, 8, { activation = "mish" })
    fails("unknown normalization", nn.LayerNormMLP, 8, 8, { normalization = "rms" })
    fails("ffn_hidden", nn.LayerNormMLP, 8, 0)
    fails("unknown option", nn.LayerNormMLP, 8, 8, { return_layernorm_output = true })
    local m = nn.LayerNormMLP(8, 8)
    fails("expects 8", m.forward, m, lutra.tensor({ 2, 4 }))
    fails("Linear has no method 'mlp_fusions'", function() return nn.Linear(2, 2).mlp_fusions end)
  end)
end)

describe("nn.Residual", function()
  -- Runs r forward and backward on fresh [8, 16] inputs of dtype and checks y = x + h and
  -- dx = dy + dh bit for bit, each sum rounded once into dtype: h = h_of(x) (a table of values),
  -- dh the input gradient of wide (an f32 twin of the wrapped module) at the widened inputs.
  local function check_sums(r, wide, dtype, what, h_of)
    local x = lutra.tensor({ 8, 16 }, dtype):randn(math.random(1, 2 ^ 30))
    local dy = lutra.tensor({ 8, 16 }, dtype):randn(math.random(1, 2 ^ 30))
    local y = r:forward(x):to_table()
    local h = h_of(x)
    local dx = r:backward(dy):to_table()
    wide:forward(lutra.tensor({ 8, 16 }):copy(x))
    local dh = wide:backward(lutra.tensor({ 8, 16 }):copy(dy)):to_table()
    local xv, dyv = x:to_table(), dy:to_table()
    local function rounded(v)
      local f32 = lutra.tensor({ 1 }):set({ v })
      return lutra.tensor({ 1 }, dtype):copy(f32):to_table()[1]
    end
    for i = 1, #y do
      assert.are.equal(rounded(xv[i] + h[i]), y[i], what .. " y[" .. i .. "]")
      assert.are.equal(rounded(dyv[i] + dh[i]), dx[i], what .. " dx[" .. i .. "]")
    end
    assert.is_nil(r:backward(dy, false))
  end

  -- the Linear's GEMMs add x and dy (their epilogue's C): y = x W^T + b + x and dx = dy W + dy
  -- in f32, rounded once. An f32 Linear with the same (exactly widened) weights gives the f32
  -- values before that rounding, so a bf16 sum rounded twice (the product first) fails it.
  it("y = x + m(x), dx = dy + m's input gradient in m's GEMMs, bit for bit (one rounding)", function()
    for _, dtype in ipairs { "f32", "bf16" } do
      local lin = nn.Linear(16, 16, { dtype = dtype })
      local wide = nn.Linear(16, 16)
      for i, q in ipairs(lin:parameters()) do wide:parameters()[i].value:copy(q.value) end
      local r = nn.Residual(lin)
      assert.are.equal("residual", r:kind())
      assert.are.equal(2, #r:parameters())
      check_sums(r, wide, dtype, dtype, function(x)
        return wide:forward(lutra.tensor({ 8, 16 }):copy(x)):to_table()
      end)
    end
  end)

  -- around a norm, the norm's backward kernel adds dy (dx_add): dx = LN'(dy) + dy in f32, rounded
  -- once (a bf16 sum rounded twice fails it). The forward's sum is the Residual's own: x + y, y
  -- rounded into dtype first.
  it("around a norm: dx = dy + the norm's input gradient in its kernel, bit for bit", function()
    for _, kind in ipairs { "LayerNorm", "RMSNorm" } do
      for _, dtype in ipairs { "f32", "bf16" } do
        local norm = nn[kind](16, { dtype = dtype })
        local wide = nn[kind](16)
        for i, q in ipairs(norm:parameters()) do
          q.value:randn(math.random(1, 2 ^ 30), 1, 0.5)
          wide:parameters()[i].value:copy(q.value)
        end
        check_sums(nn.Residual(norm), wide, dtype, kind .. " " .. dtype, function(x)
          return lutra.tensor({ 8, 16 }, dtype):copy(norm:forward(x)):to_table()
        end)
      end
    end
  end)

  -- applied to its own output, the Residual cannot hand the GEMM its input as C and as D: it sums
  -- after the module, as the plain composition does
  it("applied to its own output: the same values as the plain composition", function()
    local lin = nn.Linear(8, 8)
    local r = nn.Residual(lin)
    local x = lutra.tensor({ 4, 8 }):randn(math.random(1, 2 ^ 30))
    local y1 = r:forward(x)
    local want = {}
    local y1v, h = y1:to_table(), lin:forward(lutra.tensor({ 4, 8 }):copy(y1)):to_table()
    for i = 1, #y1v do want[i] = lutra.tensor({ 1 }):set({ y1v[i] + h[i] }):to_table()[1] end
    assert.are.same(want, r:forward(r:forward(x)):to_table())
  end)

  it("keeps the wrapped module alive, and outputs keep their owner alive (GC)", function()
    local r = nn.Residual(nn.LayerNormMLP(32, 32, { activation = "silu" }))
    collectgarbage()
    collectgarbage()
    local x = lutra.tensor({ 4, 32 }):randn(1)
    local y1 = lutra.tensor({ 4, 32 }):copy(r:forward(x)):to_table()
    local y = nn.LayerNormLinear(32, 16):forward(x)
    local m = nn.LayerNormMLP(32, 64):forward(x)
    collectgarbage()
    collectgarbage()
    assert.are.equal(64, #y:to_table())
    assert.are.equal(128, #m:to_table())
    assert.are.same(y1, r:forward(x):to_table())
    r:destroy()
    local ok, err = pcall(r.forward, r, x)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("freed", 1, true), tostring(err))
  end)

  it("refuses a module whose output does not match its input", function()
    local r = nn.Residual(nn.Linear(8, 4))
    local ok, err = pcall(r.forward, r, lutra.tensor({ 2, 8 }))
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("lutra_residual_forward", 1, true), tostring(err))
    ok, err = pcall(nn.Residual, 3)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("must be a module", 1, true), tostring(err))
  end)
end)
