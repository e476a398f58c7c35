-- The GPU module specs' shared checks (spec/gpu/modules_gpu.lua, spec/gpu/module_steps_gpu.lua):
-- results against the reference device in NMSE with finiteness, scalar losses, bit-identical
-- reuse, the Linear recipes with their bounds, a Linear built identically on both devices, one
-- forward + backward under a scope, and the parameters' and quantizers' agreement. Not a spec
-- itself.
local assert = require("luassert")
local lutra = require("lutra")
local R = lutra.recipe
local nn = lutra.nn
local S = require("spec.gpu.support")
local DEV, REF, hold, fail, isfinite = S.DEV, S.REF, S.hold, S.fail, S.isfinite


-- the same random tensor on both devices (generated on the host from the seed)
local randn_pair, keep, f32 = S.randn_pair, S.keep, S.f32

-- dims and dtype as the reference's, and the result on the device under test
local function same_meta(got, want, what)
  S.same_meta(got, want, what)
  assert.are.equal(DEV, got:device_name(), what .. ": device of the result")
end

local assert_same_bytes = require("spec.support.fp8_bytes").same_bytes

-- NMSE of got (on DEV) against want (on REF) <= bound; every element of got must be finite
local function assert_nmse(got, want, bound, what)
  same_meta(got, want, what)
  return S.assert_nmse(got, want, bound, what)
end

-- relative squared error of two scalars (a loss value)
local function assert_scalar(got, want, bound, what)
  if not isfinite(got) then fail("%s: %s on %s (reference %.9g)", what, tostring(got), DEV, want) end
  local e = (got - want) ^ 2 / math.max(want * want, 1e-300)
  if not (e <= bound) then
    fail("%s: %.9g on %s, reference %.9g (relative squared error %.3e > %.1e)", what, got, DEV,
         want, e, bound)
  end
end

local function all_zero(t, what)
  local v = t:read()
  for i = 0, t:size() - 1 do
    if v[i] ~= 0 then fail("%s: element %d is %.9g, expected 0", what, i, v[i]) end
  end
end

-- bit-identical tensors on the same device (reuse and caching checks)
local function same_values(a, b, what)
  assert_same_bytes(a:bytes(), b:bytes(), what)
end


-- f32 outputs / bf16 outputs (see each test for why)
local function hp_bound(dtype) return dtype == "bf16" and 1e-5 or 1e-10 end

-- ---- GELU and losses -----------------------------------------------------------------------

local RECIPES = {
  { name = "none" },
  { name = "delayed", make = function() return R.delayed { amax_history_len = 4 } end, delayed = true },
  { name = "current", make = function() return R.current() end },
  { name = "mxfp8", make = function() return R.mxfp8() end },
  { name = "block", make = function() return R.block() end },
}

-- Bounds for Linear outputs (y, dx, dW) and db:
--   recipe none, f32: NMSE <= 1e-10 (f32 GEMMs on identical operands; order only)
--   FP8 recipes, f32: NMSE <= 1e-6: the quantized operands are identical on both devices
--     (same inputs, same scales, bit-exact quantizers; delayed scales are compared exactly
--     below), so only accumulation differs: f32 on the CPU, cuBLASLt's FP8 accumulation or a
--     bf16 GEMM of exactly dequantized operands on the GPU (~1e-8 at most)
--   bf16 outputs (bf16 params), any recipe: NMSE <= 1e-5 (rare one-ulp bf16 rounding flips)
--   db is a high-precision column sum of dy in every recipe: 1e-10 (f32), 1e-5 (bf16)
local function linear_bound(rc, dtype)
  if dtype == "bf16" then return 1e-5 end
  return rc.make and 1e-6 or 1e-10
end

-- the same Linear on both devices; parameters are generated on the host from the seed
local function linear_pair(IN, OUT, dtype, seed, extra)
  local function opts(device)
    local o = { seed = seed, dtype = dtype, device = device }
    for k, v in pairs(extra or {}) do o[k] = v end
    return o
  end
  local a, b = hold(nn.Linear(IN, OUT, opts(REF))), hold(nn.Linear(IN, OUT, opts(DEV)))
  local pa, pb = a:parameters(), b:parameters()
  assert.are.equal(#pa, #pb)
  for i = 1, #pa do
    assert.are.equal(DEV, pb[i].value:device_name())
    assert_same_bytes(pb[i].value:bytes(), pa[i].value:bytes(), "initial parameter " .. i)
  end
  return a, b
end

-- one step of a module under a scope (nil: no autocast): forward in the scope, backward after
local function fwd_bwd(m, scope, x, dy, first_microbatch)
  if scope then scope:enter() end
  local ok, y = pcall(m.forward, m, x, first_microbatch)
  if scope then scope:exit() end
  if not ok then error(y, 0) end
  local dx = m:backward(dy)
  return y, dx
end

local function compare_params(ma, mb, bound_w, bound_b, what, field)
  field = field or "grad"
  local pa, pb = ma:parameters(), mb:parameters()
  assert_nmse(pb[1][field], pa[1][field], bound_w, what .. " dW" .. (field == "grad" and "" or " (" .. field .. ")"))
  if pa[2] then
    assert_nmse(pb[2][field], pa[2][field], bound_b, what .. " db" .. (field == "grad" and "" or " (" .. field .. ")"))
  end
end

-- delayed/current scales of a Linear's quantizers: identical on both devices
local function compare_scales(ma, mb, what, history_len)
  for _, role in ipairs { "input", "weight", "grad_output" } do
    local qa, qb = ma:quantizer(role), mb:quantizer(role)
    assert.are.equal(qa == nil, qb == nil, what .. ": " .. role .. " quantizer exists on one device only")
    if qa ~= nil then
      local sa, sia = qa:scale()
      local sb, sib = qb:scale()
      if sa ~= sb or sia ~= sib then
        fail("%s: %s scale %.9g / %.9g on %s, reference %.9g / %.9g", what, role, sb, sib, DEV, sa, sia)
      end
      if history_len then
        assert.are.same(qa:history(history_len), qb:history(history_len), what .. ": " .. role .. " history")
      end
    end
  end
end

return {
  randn_pair = randn_pair, keep = keep, f32 = f32, same_meta = same_meta,
  assert_same_bytes = assert_same_bytes, assert_nmse = assert_nmse, assert_scalar = assert_scalar,
  all_zero = all_zero, same_values = same_values, hp_bound = hp_bound, RECIPES = RECIPES,
  linear_bound = linear_bound, linear_pair = linear_pair, fwd_bwd = fwd_bwd,
  compare_params = compare_params, compare_scales = compare_scales,
}
