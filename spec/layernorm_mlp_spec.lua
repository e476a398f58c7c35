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
local FB = require("spec.support.fp8_bytes")

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
  swiglu = { gated = function(a, b) return a * sigmoid(a) * b end, module = nn.SwiGLU },
  geglu = { gated = function(a, b) return gelu(a) * b end, module = nn.GeGLU },
  reglu = { gated = function(a, b) return relu(a) * b end, module = nn.ReGLU },
}
local ACT_NAMES = { "gelu", "relu", "silu", "qgelu", "srelu", "swiglu", "geglu", "reglu" }

local function linear(x, w, b, rows, n_in, n_out)
  local y = {}
  for r = 0, rows - 1 do
    for o = 1, n_out do
      local s = b and b[o] or 0
      for c = 1, n_in do s = s + x[r * n_in + c] * w[(o - 1) * n_in + c] end
      y[r * n_out + o] = s
    end
  end
  return y
end

local function ref_forward(x, v, rows, h, ffn, act, rms, eps)
  local g, beta = v[1], not rms and v[2] or nil
  local k = rms and 1 or 2
  local w1, b1, w2, b2 = v[k + 1], v[k + 2], v[k + 3], v[k + 4]
  local ln = {}
  for r = 0, rows - 1 do
    local mean, var = 0, 0
    if not rms then
      for c = 1, h do mean = mean + x[r * h + c] end
      mean = mean / h
    end
    for c = 1, h do var = var + (x[r * h + c] - mean) ^ 2 end
    local rstd = 1 / math.sqrt(var / h + eps)
    for c = 1, h do ln[r * h + c] = (x[r * h + c] - mean) * rstd * g[c] + (rms and 0 or beta[c]) end
  end
  local a = ACTS[act]
  local n1 = a.gated and 2 * ffn or ffn
  local z = linear(ln, w1, b1, rows, h, n1)
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
  return linear(hdn, w2, b2, rows, ffn, h)
end

local function fd(vec, f)
  local out, H = {}, 1e-4
  for i = 1, #vec do
    local v = vec[i]
    vec[i] = v + H
    local lp = f()
    vec[i] = v - H
    local lm = f()
    vec[i] = v
    out[i] = (lp - lm) / (2 * H)
  end
  return out
end

local function assert_close(got, want, rel, what)
  local m = 0
  for i = 1, #want do m = math.max(m, math.abs(want[i])) end
  assert.are.equal(#want, #got, what .. ": length")
  for i = 1, #want do
    local tol = rel * m + rel * math.abs(want[i])
    if not (math.abs(got[i] - want[i]) <= tol) then
      error(string.format("%s[%d]: got %.9g, want %.9g (tol %.3g)", what, i, got[i], want[i], tol), 2)
    end
  end
end

local function same_tensor(got, want, what)
  FB.same_bytes(got:bytes(false), want:bytes(false), what)
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
        local y = m:forward(x):to_table()
        local dx = m:backward(rt):to_table()
        local v = {}
        for i = 1, #p do v[i] = p[i].value:to_table() end
        local xv, r = x:to_table(), rt:to_table()
        local function f()
          local yy, s = ref_forward(xv, v, rows, h, ffn, act, rms, eps), 0
          for i = 1, #yy do s = s + yy[i] * r[i] end
          return s
        end
        assert_close(y, ref_forward(xv, v, rows, h, ffn, act, rms, eps), 1e-5, act .. " y")
        assert_close(dx, fd(xv, f), 1e-3, act .. " dx")
        for i = 1, #p do assert_close(p[i].grad:to_table(), fd(v[i], f), 1e-3, act .. " grad " .. i) end
      end)
    end
  end

  local RECIPES = {
    { name = "no recipe" },
    { name = "delayed", make = function() return lutra.recipe.delayed{ amax_history_len = 4 } end },
    { name = "current", make = function() return lutra.recipe.current{} end },
    { name = "mxfp8", make = function() return lutra.recipe.mxfp8{} end },
    { name = "block", make = function() return lutra.recipe.block{} end },
  }
  for _, rc in ipairs(RECIPES) do
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
          assert.are.equal(#pp, #pm)
          for i = 1, #pm do
            pm[i].value:randn(seed + i, 0, 0.4)
            pp[i].value:copy(pm[i].value)
          end
          local recipe = rc.make and rc.make() or nil
          for step = 1, 2 do
            local x = lutra.tensor({ rows, h }, dtype):randn(seed + 10 * step)
            local dy = lutra.tensor({ rows, h }, dtype):randn(seed + 10 * step + 1)
            local res = {}
            for i, mod in ipairs { m, plain } do
              local s = recipe and lutra.autocast{ recipe = recipe } or nil
              if s then s:enter() end
              local y = mod:forward(x)
              local dx = mod:backward(dy)
              if s then s:exit() end
              res[i] = { y, dx }
            end
            local what = name .. " step " .. step
            same_tensor(res[1][1], res[2][1], what .. ": y")
            same_tensor(res[1][2], res[2][2], what .. ": dx")
            for i = 1, #pm do same_tensor(pm[i].grad, pp[i].grad, what .. ": grad " .. i) end
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
    fails("unknown activation", nn.LayerNormMLP, 8, 8, { activation = "tanh" })
    fails("unknown normalization", nn.LayerNormMLP, 8, 8, { normalization = "rms" })
    fails("ffn_hidden", nn.LayerNormMLP, 8, 0)
    fails("unknown option", nn.LayerNormMLP, 8, 8, { return_layernorm_output = true })
    local m = nn.LayerNormMLP(8, 8)
    fails("expects 8", m.forward, m, lutra.tensor({ 2, 4 }))
    fails("not a layernorm_mlp", nn.Linear(2, 2).mlp_fusions, nn.Linear(2, 2))
  end)
end)

describe("nn.Residual", function()
  it("y = x + m(x), dx = dy + m's input gradient, bit for bit (one f32 sum rounded once)", function()
    for _, dtype in ipairs { "f32", "bf16" } do
      local lin = nn.Linear(16, 16, { dtype = dtype })
      local r = nn.Residual(lin)
      assert.are.equal("residual", r:kind())
      assert.are.equal(2, #r:parameters())
      local x = lutra.tensor({ 8, 16 }, dtype):randn(math.random(1, 2 ^ 30))
      local dy = lutra.tensor({ 8, 16 }, dtype):randn(math.random(1, 2 ^ 30))
      local y = r:forward(x):to_table()
      local h = lin:forward(x):to_table()
      local dx = r:backward(dy):to_table()
      local dh = lin:backward(dy):to_table()
      local xv, dyv = x:to_table(), dy:to_table()
      local function rounded(v) return lutra.tensor({ 1 }, dtype):set({ v }):to_table()[1] end
      for i = 1, #y do
        assert.are.equal(rounded(xv[i] + h[i]), y[i], dtype .. " y[" .. i .. "]")
        assert.are.equal(rounded(dyv[i] + dh[i]), dx[i], dtype .. " dx[" .. i .. "]")
      end
      assert.is_nil(r:backward(dy, false))
    end
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
    r:free()
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
