-- What the specs of the norm modules share (spec/norm_spec.lua, layernorm_linear_spec.lua,
-- layernorm_mlp_spec.lua, gpu/fused_norm_gpu.lua): the f64 references, central finite
-- differences, the relative bound, the recipes, a norm module with random parameters and the
-- two-step comparison of a fused module with its unfused composition. Not a spec itself (no _spec
-- in its name).
local lutra = require("lutra")
local assert = require("luassert")
local FB = require("spec.support.fp8_bytes")
local FD = require("spec.support.finite_diff")
local nn = lutra.nn

local M = {}

-- the recipes the fused modules are compared under; cfg says what a snapshot of a quantization
-- holds (spec/support/fp8_bytes.lua)
M.RECIPES = {
  { name = "delayed", make = function() return lutra.recipe.delayed{ amax_history_len = 4 } end,
    cfg = { tensor = true, delayed = true } },
  { name = "current", make = function() return lutra.recipe.current{} end, cfg = { tensor = true } },
  { name = "mxfp8", make = function() return lutra.recipe.mxfp8{} end, cfg = {} },
  { name = "block", make = function() return lutra.recipe.block{} end, cfg = {} },
}

-- "no recipe" first, then M.RECIPES
function M.recipe_cases()
  local cases = { { name = "no recipe" } }
  for _, rc in ipairs(M.RECIPES) do cases[#cases + 1] = rc end
  return cases
end

-- LayerNorm (RMSNorm if rms) of the rows x h values x in f64: statistics in f64, gamma + 1 if zc
function M.ref_norm(x, g, b, rows, h, eps, rms, zc)
  local y = {}
  for r = 0, rows - 1 do
    local mean, var = 0, 0
    if not rms then
      for c = 1, h do mean = mean + x[r * h + c] end
      mean = mean / h
    end
    for c = 1, h do
      local d = x[r * h + c] - mean
      var = var + d * d
    end
    local rstd = 1 / math.sqrt(var / h + eps)
    for c = 1, h do
      local gg = zc and g[c] + 1 or g[c]
      y[r * h + c] = (x[r * h + c] - mean) * rstd * gg + (rms and 0 or b[c])
    end
  end
  return y
end

-- y = x w^T + b in f64 for rows x n_in values x and an n_out x n_in w (b may be nil)
function M.ref_linear(x, w, b, rows, n_in, n_out)
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

-- d f / d vec[i] by central differences, step h (1e-4 unless given)
function M.fd(vec, f, h)
  return FD.central(vec, f, h or 1e-4)
end

-- |got - want| <= rel * (max|want| + |want|) element by element, and the same length
function M.assert_close(got, want, rel, what)
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

-- m's forward at x and backward from rt against ref(xv, v), the f64 reference of the forward (v:
-- m's parameter values as tables): y within 1e-5 relative to max|ref|, dx and every parameter
-- gradient against central differences of L = sum(ref * rt) within 1e-3 relative to max|num|
function M.check_reference(m, x, rt, ref, what)
  local p = m:parameters()
  local y = m:forward(x):to_table()
  local dx = m:backward(rt):to_table()
  local v = {}
  for i = 1, #p do v[i] = p[i].value:to_table() end
  local xv, r = x:to_table(), rt:to_table()
  local function f()
    local yy, s = ref(xv, v), 0
    for i = 1, #yy do s = s + yy[i] * r[i] end
    return s
  end
  M.assert_close(y, ref(xv, v), 1e-5, what .. " y")
  M.assert_close(dx, M.fd(xv, f), 1e-3, what .. " dx")
  for i = 1, #p do M.assert_close(p[i].grad:to_table(), M.fd(v[i], f), 1e-3, what .. " grad " .. i) end
end

-- a LayerNorm (RMSNorm if rms) of width h with random parameters from the seed (host-generated:
-- the same on every device); opts: dtype, device, zero_centered_gamma. Returns it, gamma, beta.
function M.new_norm(rms, h, opts, seed)
  local m = (rms and nn.RMSNorm or nn.LayerNorm)(h, opts)
  local p = m:parameters()
  p[1].value:randn(seed, opts.zero_centered_gamma and 0 or 1, 0.3)
  if not rms then p[2].value:randn(seed + 1, 0, 0.5) end
  return m, p[1].value, not rms and p[2].value or nil
end

function M.same_tensor(got, want, what)
  FB.same_bytes(got:bytes(false), want:bytes(false), what)
end

-- the parameters pf random (normal(0, sd), from the seed) and copied into pp, one for one
function M.tie_parameters(pf, pp, seed, sd)
  assert.are.equal(#pf, #pp, "parameter count")
  for i = 1, #pf do
    pf[i].value:randn(seed + i, 0, sd)
    pp[i].value:copy(pf[i].value)
  end
end

-- one forward at x and backward from dy, under recipe (nil: without autocast); returns y, dx
function M.step(m, recipe, x, dy)
  local s = recipe and lutra.autocast{ recipe = recipe } or nil
  if s then s:enter() end
  local y = m:forward(x)
  local dx = m:backward(dy)
  if s then s:exit() end
  return y, dx
end

-- a step of the fused module and of the plain one, pf and pp their parameters: y, dx and every
-- gradient bit for bit
function M.same_step(fused, plain, pf, pp, recipe, x, dy, what)
  local yf, dxf = M.step(fused, recipe, x, dy)
  local yp, dxp = M.step(plain, recipe, x, dy)
  M.same_tensor(yf, yp, what .. ": y")
  M.same_tensor(dxf, dxp, what .. ": dx")
  for i = 1, #pf do M.same_tensor(pf[i].grad, pp[i].grad, what .. ": grad " .. i) end
end

return M
