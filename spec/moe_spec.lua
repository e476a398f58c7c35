-- MoE routing on the CPU backend (lutra.moe: the fused softmax-top-k router, permute and
-- unpermute), against plain Lua references (spec/support/moe_ref.lua) and finite differences.
-- Tolerances:
--   router probs vs an f64 reference that rounds the logit differences to f32 as the library
--     does: |got - ref| <= 2^-23 |ref| (one f32 rounding of a double result);
--   router dlogits vs central differences (h = 1e-5) of the exact f64 reference, indices held:
--     |got - fd| <= 1e-5 max|fd| + 1e-5 |fd| (the f32 rounding of the differences, ~1e-7
--     relative, dominates the f64 truncation error ~h^2);
--   f32 finite differences through the library itself (h = 1e-2, logits at least 0.25 apart so
--     that no selection changes): |got - fd| <= 2e-3 max|fd| (f32 noise ~1e-5 / h);
--   indices, row maps, m_splits and permuted rows: exact; the unpermute's f32 combine against
--     the f64 sum: 2^-22 relative to the row's magnitude.
local lutra = require("lutra")
local ffi = require("ffi")
local R = require("spec.support.moe_ref")
local E = require("spec.support.errors")
local FD = require("spec.support.finite_diff")
local moe = lutra.moe

local function tensor_of(values, shape, dtype)
  return lutra.from_table(values, shape, dtype or "f32")
end

local function assert_close(got, want, abs_rel, what, scale_of)
  local m = 0
  for i = 1, #want do m = math.max(m, math.abs(want[i])) end
  for i = 1, #want do
    local tol = scale_of and scale_of(i, m) or abs_rel * (m + math.abs(want[i]))
    if not (math.abs(got[i] - want[i]) <= tol) then
      error(string.format("%s[%d]: got %.10g, want %.10g (tol %.3g)", what, i, got[i], want[i],
                          tol), 2)
    end
  end
end

local function assert_ints(got, want, what)
  assert.are.equal(#want, #got, what .. ": count")
  for i = 1, #want do
    if got[i] ~= want[i] then
      error(string.format("%s[%d]: got %d, want %d", what, i, got[i], want[i]), 2)
    end
  end
end

-- logits with exact ties in some rows (to check the tie rule) from a seed
local function logits_with_ties(T, Ex, seed)
  local v = R.noise(T * Ex, seed)
  for t = 0, T - 1, 3 do
    v[t * Ex + 1] = 0.75
    v[t * Ex + Ex] = 0.75 -- the first and last expert tie at the top of every third row
    for j = 2, Ex - 1 do v[t * Ex + j] = math.min(v[t * Ex + j], 0.5) end
  end
  for i = 1, #v do v[i] = v[i] * 3 end
  return v
end

describe("moe.TopK forward", function()
  for _, c in ipairs {
    { T = 17, E = 8, k = 1, renorm = true }, { T = 17, E = 8, k = 2, renorm = true },
    { T = 9, E = 16, k = 4, renorm = false }, { T = 5, E = 64, k = 8, renorm = true },
    { T = 6, E = 8, k = 8, renorm = false, scale = 2.5 }, { T = 33, E = 3, k = 2, renorm = false },
    { T = 12, E = 12, k = 3, renorm = true, dtype = "bf16" },
  } do
    local name = string.format("T=%d E=%d k=%d %s%s%s", c.T, c.E, c.k,
                               c.renorm and "renormalized" or "pre-softmax",
                               c.scale and (" scale " .. c.scale) or "", c.dtype and (" " .. c.dtype) or "")
    it("matches the Lua reference: " .. name, function()
      local x = tensor_of(logits_with_ties(c.T, c.E, c.T * 31 + c.k), { c.T, c.E }, c.dtype)
      local vals = x:to_table() -- as stored (bf16-rounded)
      local r = moe.TopK(c.E, c.k, { renormalize = c.renorm, scaling_factor = c.scale })
      local probs, idx = r:forward(x)
      assert.are.same({ c.T, c.k }, probs:dims())
      assert.are.same({ c.T, c.k }, idx:dims())
      assert.are.equal("f32", probs:dtype_name())
      assert.are.equal("i32", idx:dtype_name())
      local want_idx = R.topk_indices(vals, c.T, c.E, c.k)
      assert_ints(R.ints(idx), want_idx, "indices")
      local want = R.topk_probs(vals, want_idx, c.T, c.E, c.k, c.renorm, c.scale or 1, true)
      assert_close(probs:to_table(), want, 0, "probs", function(i) return 2 ^ -23 * math.abs(want[i]) end)
      if c.renorm then -- each token's probabilities sum to the scaling factor
        local p = probs:to_table()
        for t = 0, c.T - 1 do
          local s = 0
          for i = 1, c.k do s = s + p[t * c.k + i] end
          assert.is_true(math.abs(s - (c.scale or 1)) < 1e-6, "row sum " .. s)
        end
      end
    end)
  end

  it("breaks ties to the lower expert and treats NaN as -inf", function()
    local r = moe.TopK(4, 2)
    local x = tensor_of({ 1, 1, 1, 1, 0 / 0, 2, 0 / 0, 2, 0 / 0, 0 / 0, 5, 0 / 0 }, { 3, 4 })
    local p, idx = r:forward(x)
    assert.are.same({ 0, 1, 1, 3, 2, 0 }, R.ints(idx))
    local pv = p:to_table()
    assert.are.same({ 0.5, 0.5, 0.5, 0.5, 1, 0 }, pv) -- NaN takes probability 0
  end)

  it("refreshes its outputs in place and holds nothing stale across shapes", function()
    local r = moe.TopK(6, 2)
    local p1 = r:forward(lutra.tensor({ 4, 6 }):randn(1))
    local before = p1:to_table()
    local p2 = r:forward(lutra.tensor({ 4, 6 }):randn(2))
    assert.are.equal(p1, p2) -- the same buffer, reused
    assert.are_not.same(before, p2:to_table())
    local p3 = r:forward(lutra.tensor({ 5, 6 }):randn(3))
    assert.are.same({ 5, 2 }, p3:dims())
    assert.is_true(p1:is_freed()) -- replaced by the new shape
  end)
end)

-- L = sum probs * w with the indices held fixed: d L / d logits by central differences of the
-- exact f64 reference
local function fd_router(vals, idx, T, Ex, k, renorm, scale, w)
  local function L()
    local p = R.topk_probs(vals, idx, T, Ex, k, renorm, scale, false)
    local s = 0
    for i = 1, #p do s = s + p[i] * w[i] end
    return s
  end
  return FD.central(vals, L, 1e-5)
end

describe("moe.TopK backward", function()
  for _, c in ipairs {
    { T = 7, E = 8, k = 2, renorm = true }, { T = 7, E = 8, k = 2, renorm = false },
    { T = 4, E = 16, k = 5, renorm = true, scale = 1.5 }, { T = 4, E = 9, k = 1, renorm = false },
    { T = 3, E = 10, k = 8, renorm = false, scale = 0.5 }, { T = 5, E = 8, k = 1, renorm = true },
  } do
    local name = string.format("T=%d E=%d k=%d %s", c.T, c.E, c.k,
                               c.renorm and "renormalized" or "pre-softmax")
    it("equals f64 finite differences: " .. name, function()
      local vals = R.noise(c.T * c.E, 7 * c.k + c.E)
      for i = 1, #vals do vals[i] = R.f32(vals[i] * 2) end
      local w = R.noise(c.T * c.k, 99 + c.k)
      local r = moe.TopK(c.E, c.k, { renormalize = c.renorm, scaling_factor = c.scale })
      local _, idx = r:forward(tensor_of(vals, { c.T, c.E }))
      local dl = r:backward(tensor_of(w, { c.T, c.k }))
      assert.are.same({ c.T, c.E }, dl:dims())
      local want = fd_router(vals, R.ints(idx), c.T, c.E, c.k, c.renorm, c.scale or 1, w)
      assert_close(dl:to_table(), want, 1e-5, "dlogits")
    end)
  end

  for _, renorm in ipairs { true, false } do
    it("equals f32 finite differences through the library (" .. (renorm and "renormalized" or "pre-softmax") .. ")", function()
      local T, Ex, k = 3, 6, 2
      -- a permutation of well-separated values per row: h = 1e-2 changes no selection
      local vals, perm = {}, R.noise(T * Ex, 5)
      for t = 0, T - 1 do
        local order = {}
        for j = 1, Ex do order[j] = j end
        table.sort(order, function(a, b) return perm[t * Ex + a] < perm[t * Ex + b] end)
        for j = 1, Ex do vals[t * Ex + order[j]] = (j - 1) * 0.4 - 1 end
      end
      local w = R.noise(T * k, 17)
      local x = tensor_of(vals, { T, Ex })
      local r = moe.TopK(Ex, k, { renormalize = renorm })
      local function L()
        local p = r:forward(x):to_table()
        local s = 0
        for i = 1, #p do s = s + p[i] * w[i] end
        return s
      end
      L()
      local got = r:backward(tensor_of(w, { T, k })):to_table()
      local fd = FD.central(vals, L, 1e-2, function(v) x:set(v) end)
      assert_close(got, fd, 1e-3, "dlogits")
    end)
  end
end)

describe("moe.Dispatcher permute", function()
  for _, c in ipairs {
    { T = 10, k = 1, E = 4, H = 3 }, { T = 37, k = 2, E = 8, H = 5 }, { T = 64, k = 4, E = 16, H = 8 },
    { T = 3, k = 8, E = 64, H = 2 }, { T = 50, k = 2, E = 3, H = 16, dtype = "bf16" },
    { T = 20, k = 3, E = 5, H = 7, dtype = "f16" },
  } do
    local name = string.format("T=%d k=%d E=%d H=%d %s", c.T, c.k, c.E, c.H, c.dtype or "f32")
    it("orders rows by expert, stably, with m_splits: " .. name, function()
      local idx = R.random_indices(c.T * c.k, c.E, c.T + c.k) -- duplicates within a token too
      local x = lutra.tensor({ c.T, c.H }, c.dtype or "f32"):randn(c.T * 3 + c.E)
      local d = moe.Dispatcher(c.E)
      local xp, splits = d:permute(x, tensor_of(idx, { c.T, c.k }, "i32"))
      assert.are.same({ c.T * c.k, c.H }, xp:dims())
      assert.are.equal(x:dtype_name(), xp:dtype_name())
      assert.are.same({ c.E }, splits:dims())
      local want_map, want_splits = R.permute_map(idx, c.T * c.k, c.E)
      assert_ints(R.ints(splits), want_splits, "m_splits")
      local map = R.ints(d:row_map())
      assert_ints(map, want_map, "row_map")
      -- each expert's rows in token order: the row map restricted to an expert increases
      local last = {}
      for s = 1, #idx do
        local e = idx[s]
        if last[e] then assert.is_true(map[s] > last[e]) end
        last[e] = map[s]
      end
      -- rows are bit copies
      local esz = c.dtype and 2 or 4
      local xb, pb = x:bytes(), xp:bytes()
      for s = 1, #idx do
        local t = math.floor((s - 1) / c.k)
        assert.are.equal(xb:sub(t * c.H * esz + 1, (t + 1) * c.H * esz),
                         pb:sub(map[s] * c.H * esz + 1, (map[s] + 1) * c.H * esz), "row of slot " .. s)
      end
    end)
  end

  it("accepts 1-D indices as k = 1 and experts that receive nothing", function()
    local d = moe.Dispatcher(6)
    local x = tensor_of({ 1, 2, 3, 4 }, { 4, 1 })
    local xp, splits = d:permute(x, tensor_of({ 5, 0, 5, 2 }, { 4 }, "i32"))
    assert.are.same({ 1, 0, 1, 0, 0, 2 }, R.ints(splits))
    assert.are.same({ 2, 4, 1, 3 }, xp:to_table())
  end)
end)

describe("moe.Dispatcher unpermute", function()
  it("permute then unpermute with probabilities 1 and k = 1 is the identity, bit for bit", function()
    for _, dtype in ipairs { "f32", "bf16", "f16" } do
      local T, H, Ex = 40, 12, 7
      local x = lutra.tensor({ T, H }, dtype):randn(4)
      local d = moe.Dispatcher(Ex)
      local idx = tensor_of(R.random_indices(T, Ex, 3), { T, 1 }, "i32")
      local xp = d:permute(x, idx)
      local ones = lutra.tensor({ T, 1 }):fill(1)
      local y = d:unpermute(xp, ones)
      assert.are.equal(x:bytes(), y:bytes(), dtype)
    end
  end)

  it("with k = 2 and probabilities 1/2 is the identity, with 1 it doubles, bit for bit", function()
    local T, H, Ex = 33, 9, 5
    local x = lutra.tensor({ T, H }):randn(8)
    local d = moe.Dispatcher(Ex)
    local xp = d:permute(x, tensor_of(R.random_indices(2 * T, Ex, 11), { T, 2 }, "i32"))
    assert.are.equal(x:bytes(), d:unpermute(xp, lutra.tensor({ T, 2 }):fill(0.5)):bytes())
    local twice = lutra.tensor({ T, H }):copy(x)
    local v = twice:to_table()
    for i = 1, #v do v[i] = 2 * v[i] end
    twice:set(v)
    assert.are.equal(twice:bytes(), d:unpermute(xp, lutra.tensor({ T, 2 }):fill(1)):bytes())
  end)

  it("combines the experts' rows with the probabilities (f64 reference)", function()
    local T, k, Ex, H, O = 25, 3, 6, 4, 5
    local idx = R.random_indices(T * k, Ex, 21)
    local d = moe.Dispatcher(Ex)
    d:permute(lutra.tensor({ T, H }):randn(1), tensor_of(idx, { T, k }, "i32"))
    local xe = lutra.tensor({ T * k, O }):randn(2)
    local probs = lutra.tensor({ T, k }):uniform(3)
    local y = d:unpermute(xe, probs)
    assert.are.same({ T, O }, y:dims())
    local want = R.unpermute(xe:to_table(), probs:to_table(), R.ints(d:row_map()), T, k, O)
    assert_close(y:to_table(), want, 2 ^ -22, "y")
  end)
end)

describe("moe routing of [.., hidden] inputs", function()
  it("routes the rows of the leading dims: the same bytes as the matrix, y and dx in x's leading dims", function()
    local fresh = require("spec.support.fresh_random").new()
    local B, T, H, O, Ex, k = 2, 3, 5, 4, 6, 2
    local x3 = lutra.tensor({ B, T, H }):randn(fresh.int(1, 2 ^ 30))
    local x2 = lutra.tensor({ B * T, H }):copy(x3)
    local l3 = lutra.tensor({ B, T, Ex }):randn(fresh.int(1, 2 ^ 30))
    local l2 = lutra.tensor({ B * T, Ex }):copy(l3)
    local r3, r2 = moe.TopK(Ex, k), moe.TopK(Ex, k)
    local p3, i3 = r3:forward(l3)
    local p2, i2 = r2:forward(l2)
    assert.are.same({ B * T, k }, p3:dims())
    assert.are.equal(p2:bytes(), p3:bytes(), "probs (seed " .. fresh.seed .. ")")
    assert.are.equal(i2:bytes(), i3:bytes(), "indices")
    local d3, d2 = moe.Dispatcher(Ex), moe.Dispatcher(Ex)
    local xp3, s3 = d3:permute(x3, i3)
    local xp2, s2 = d2:permute(x2, i2)
    assert.are.equal(xp2:bytes(), xp3:bytes(), "permuted")
    assert.are.equal(s2:bytes(), s3:bytes(), "m_splits")
    local xe = lutra.tensor({ B * T * k, O }):randn(fresh.int(1, 2 ^ 30))
    local y3, y2 = d3:unpermute(xe, p3), d2:unpermute(xe, p2)
    assert.are.same({ B, T, O }, y3:dims())
    assert.are.equal(y2:bytes(), y3:bytes(), "y")
    local dy3 = lutra.tensor({ B, T, O }):randn(fresh.int(1, 2 ^ 30))
    local dxe3, dp3 = d3:unpermute_backward(dy3)
    local dxe2, dp2 = d2:unpermute_backward(lutra.tensor({ B * T, O }):copy(dy3))
    assert.are.equal(dxe2:bytes(), dxe3:bytes(), "dexpert_out")
    assert.are.equal(dp2:bytes(), dp3:bytes(), "dprobs")
    local dx3, dx2 = d3:permute_backward(xp3), d2:permute_backward(xp2)
    assert.are.same({ B, T, H }, dx3:dims())
    assert.are.equal(dx2:bytes(), dx3:bytes(), "dx")
    local dl3 = r3:backward(dp3)
    assert.are.same({ B, T, Ex }, dl3:dims())
    assert.are.equal(r2:backward(dp2):bytes(), dl3:bytes(), "dlogits")
  end)
end)

describe("moe.Dispatcher backward", function()
  it("unpermute: dexpert_out and dprobs equal finite differences (f64 and f32)", function()
    local T, k, Ex, O = 9, 2, 4, 3
    local idx = R.random_indices(T * k, Ex, 31)
    local d = moe.Dispatcher(Ex)
    d:permute(lutra.tensor({ T, 2 }):randn(1), tensor_of(idx, { T, k }, "i32"))
    local map = R.ints(d:row_map())
    local xe_v, p_v = R.noise(T * k * O, 3), R.noise(T * k, 4)
    local r = R.noise(T * O, 5)
    local xe, probs = tensor_of(xe_v, { T * k, O }), tensor_of(p_v, { T, k })
    d:unpermute(xe, probs)
    local dxe, dp = d:unpermute_backward(tensor_of(r, { T, O }))
    assert.are.same({ T * k, O }, dxe:dims())
    assert.are.same({ T, k }, dp:dims())
    local xe_f, p_f = xe:to_table(), probs:to_table()
    local function L_ref()
      local y, s = R.unpermute(xe_f, p_f, map, T, k, O), 0
      for i = 1, #y do s = s + y[i] * r[i] end
      return s
    end
    local function fd(vec, H, L) return FD.central(vec, L, H) end
    assert_close(dxe:to_table(), fd(xe_f, 1e-5, L_ref), 1e-6, "dexpert_out (f64 fd)")
    assert_close(dp:to_table(), fd(p_f, 1e-5, L_ref), 1e-6, "dprobs (f64 fd)")
    -- f32 differences through the library's own unpermute
    local function L_lib()
      xe:set(xe_v)
      probs:set(p_v)
      local y, s = d:unpermute(xe, probs):to_table(), 0
      for i = 1, #y do s = s + y[i] * r[i] end
      return s
    end
    assert_close(dp:to_table(), fd(p_v, 1e-2, L_lib), 1e-3, "dprobs (f32 fd)")
    assert_close(dxe:to_table(), fd(xe_v, 1e-2, L_lib), 1e-3, "dexpert_out (f32 fd)")
  end)

  it("permute: dx sums each token's rows (exactly, in choice order) and equals finite differences", function()
    local T, k, Ex, H = 11, 3, 5, 4
    local idx = R.random_indices(T * k, Ex, 41)
    local d = moe.Dispatcher(Ex)
    local xv = R.noise(T * H, 6)
    local x = tensor_of(xv, { T, H })
    d:permute(x, tensor_of(idx, { T, k }, "i32"))
    local map = R.ints(d:row_map())
    local g = lutra.tensor({ T * k, H }):randn(9)
    local dx = d:permute_backward(g)
    local gv, want = g:to_table(), {}
    for t = 0, T - 1 do
      for h = 1, H do
        local acc = 0
        for i = 1, k do acc = R.f32(acc + gv[map[t * k + i] * H + h]) end
        want[t * H + h] = acc
      end
    end
    assert.are.same(want, dx:to_table())
    -- L = sum permuted * g through the library, by f32 central differences
    local function L()
      x:set(xv)
      local p, s = d:permute(x, tensor_of(idx, { T, k }, "i32")):to_table(), 0
      for i = 1, #p do s = s + p[i] * gv[i] end
      return s
    end
    local fd = {}
    for i = 1, #xv do
      local v = xv[i]
      xv[i] = v + 1e-2
      local lp = L()
      xv[i] = v - 1e-2
      local lm = L()
      xv[i] = v
      fd[i] = (lp - lm) / 2e-2
    end
    assert_close(dx:to_table(), fd, 1e-3, "dx (f32 fd)")
  end)

  it("router + permute + experts + unpermute: the logits' gradient through the probabilities equals f64 finite differences", function()
    -- L(logits) = sum_t r_t . y_t, y = unpermute(experts(permute(x)), router(logits)), where
    -- expert e scales its rows by c_e (done on the host here): the router is trained through
    -- unpermute's dprobs
    local T, Ex, k, H = 6, 5, 2, 3
    local c = { 0.5, -1, 2, 1.5, -0.25 }
    for _, renorm in ipairs { true, false } do
      local lv = R.noise(T * Ex, 71)
      for i = 1, #lv do lv[i] = R.f32(lv[i] * 2) end
      local xv, r = R.noise(T * H, 72), R.noise(T * H, 73)
      local router, d = moe.TopK(Ex, k, { renormalize = renorm }), moe.Dispatcher(Ex)
      local probs, idx = router:forward(tensor_of(lv, { T, Ex }))
      local xp = d:permute(tensor_of(xv, { T, H }), idx)
      local ix, map, pv = R.ints(idx), R.ints(d:row_map()), xp:to_table()
      for s = 1, T * k do
        for h = 1, H do
          local at = map[s] * H + h
          pv[at] = pv[at] * c[ix[s] + 1]
        end
      end
      d:unpermute(tensor_of(pv, { T * k, H }), probs)
      local _, dprobs = d:unpermute_backward(tensor_of(r, { T, H }))
      local dl = router:backward(dprobs):to_table()
      local x32 = tensor_of(xv, { T, H }):to_table()
      local w = {} -- d L / d probs[t, i] = c_e r_t . x_t
      for t = 0, T - 1 do
        local dot = 0
        for h = 1, H do dot = dot + r[t * H + h] * x32[t * H + h] end
        for i = 1, k do w[t * k + i] = c[ix[t * k + i] + 1] * dot end
      end
      local want = fd_router(lv, ix, T, Ex, k, renorm, 1, w)
      local m = 0
      for i = 1, #want do m = math.max(m, math.abs(want[i])) end
      assert.is_true(m > 0.05, "the gradient is not trivially zero")
      assert_close(dl, want, 1e-5, "dlogits")
    end
  end)
end)

describe("moe.Router (Linear + fused top-k)", function()
  it("runs the Linear into the top-k and back", function()
    local router = moe.Router(8, 4, 2, { seed = 5 })
    local x = lutra.tensor({ 10, 8 }):randn(6)
    local probs, idx = router:forward(x)
    local logits = router.linear:forward(x)
    local p2, i2 = router.topk:forward(logits)
    assert.are.same(probs:to_table(), p2:to_table())
    assert.are.same(R.ints(idx), R.ints(i2))
    local dx = router:backward(lutra.tensor({ 10, 2 }):randn(7))
    assert.are.same({ 10, 8 }, dx:dims())
    assert.are.equal(1, #router:parameters()) -- no bias by default
  end)
end)

describe("moe bad inputs", function()
  local T, Ex = 4, 6
  local function logits() return lutra.tensor({ T, Ex }):randn(1) end
  local function idx(values, shape) return tensor_of(values, shape or { T, 2 }, "i32") end
  local good_idx = { 0, 1, 2, 3, 4, 5, 0, 1 }
  local cases = {
    { "k > experts", function() moe.TopK(3, 4) end, "lutra_moe_router_new", "larger than the number of experts" },
    { "k = 0", function() moe.TopK(3, 0) end, "lutra.moe.TopK", "k" },
    { "k = 9", function() moe.TopK(16, 9) end, "lutra_moe_router_new", "outside 1..8" },
    { "experts = 5000", function() moe.TopK(5000, 2) end, "lutra_moe_router_new", "outside 1..4096" },
    { "scaling factor 0", function() moe.TopK(4, 2, { scaling_factor = 0 }) end, "lutra_moe_router_new", "scaling_factor" },
    { "scaling factor NaN", function() moe.TopK(4, 2, { scaling_factor = 0 / 0 }) end, "lutra.moe.TopK", "scaling_factor" },
    { "unknown option", function() moe.TopK(4, 2, { topk = 2 }) end, "lutra.moe.TopK", "unknown option 'topk'" },
    { "logits of the wrong width", function() moe.TopK(5, 2):forward(logits()) end, "lutra_moe_router_forward", "[tokens, 5]" },
    { "1-D logits", function() moe.TopK(6, 2):forward(lutra.tensor({ 6 })) end, "lutra_moe_router_forward", "[tokens, 6]" },
    { "i32 logits", function() moe.TopK(6, 2):forward(lutra.tensor({ T, Ex }, "i32")) end, "lutra_moe_router_forward", "not f32" },
    { "logits not a tensor", function() moe.TopK(6, 2):forward({}) end, "topk:forward", "logits" },
    { "backward before forward", function() moe.TopK(6, 2):backward(lutra.tensor({ T, 2 })) end, "lutra_moe_router_backward", "before forward" },
    { "dprobs of the wrong shape", function()
        local r = moe.TopK(6, 2); r:forward(logits()); r:backward(lutra.tensor({ T, 3 }))
      end, "lutra_moe_router_backward", "dprobs must be [4, 2]" },
    { "bf16 dprobs", function()
        local r = moe.TopK(6, 2); r:forward(logits()); r:backward(lutra.tensor({ T, 2 }, "bf16"))
      end, "lutra_moe_router_backward", "must be f32" },
    { "a freed router", function() local r = moe.TopK(6, 2); r:destroy(); r:forward(logits()) end, "lutra_moe_router_forward", "freed" },
    { "dispatcher experts = 0", function() moe.Dispatcher(0) end, "lutra.moe.Dispatcher", "experts" },
    { "dispatcher experts = 4097", function() moe.Dispatcher(4097) end, "lutra_moe_dispatch_new", "outside 1..4096" },
    { "f32 indices", function() moe.Dispatcher(Ex):permute(logits(), lutra.tensor({ T, 2 })) end, "lutra_moe_permute", "must be i32" },
    { "indices of other rows", function() moe.Dispatcher(Ex):permute(logits(), idx({ 0, 1, 2, 3, 4, 5 }, { 3, 2 })) end, "lutra_moe_permute", "tokens = 4" },
    { "index -1", function() moe.Dispatcher(Ex):permute(logits(), idx({ 0, 1, 2, -1, 4, 5, 0, 1 })) end, "lutra_moe_permute", "index -1 of token 1 (choice 1) is outside [0, 6)" },
    { "index = experts", function() moe.Dispatcher(Ex):permute(logits(), idx({ 0, 1, 2, 3, 4, 5, 6, 1 })) end, "lutra_moe_permute", "index 6 of token 3" },
    { "i32 rows", function() moe.Dispatcher(Ex):permute(lutra.tensor({ T, 3 }, "i32"), idx(good_idx)) end, "lutra_moe_permute", "x dtype i32" },
    { "1-D rows", function() moe.Dispatcher(Ex):permute(lutra.tensor({ T * 3 }), idx(good_idx)) end, "lutra_moe_permute", "2 or more dims" },
    { "unpermute before permute", function() moe.Dispatcher(Ex):unpermute(lutra.tensor({ 8, 3 }), lutra.tensor({ T, 2 })) end, "lutra_moe_unpermute", "no permute" },
    { "permute_backward before permute", function() moe.Dispatcher(Ex):permute_backward(lutra.tensor({ 8, 3 })) end, "lutra_moe_permute_backward", "no permute" },
    { "unpermute_backward before unpermute", function() moe.Dispatcher(Ex):unpermute_backward(lutra.tensor({ T, 3 })) end, "lutra_moe_unpermute_backward", "before unpermute" },
    { "expert rows that do not match the permute", function()
        local d = moe.Dispatcher(Ex); d:permute(logits(), idx(good_idx)); d:unpermute(lutra.tensor({ 7, 3 }), lutra.tensor({ T, 2 }))
      end, "lutra_moe_unpermute", "expert_out has 7 rows, the last permute made 8" },
    { "probs of the wrong size", function()
        local d = moe.Dispatcher(Ex); d:permute(logits(), idx(good_idx)); d:unpermute(lutra.tensor({ 8, 3 }), lutra.tensor({ T, 3 }))
      end, "lutra_moe_unpermute", "probs must be [tokens, k] = [4, 2]" },
    { "i32 probs", function()
        local d = moe.Dispatcher(Ex); d:permute(logits(), idx(good_idx)); d:unpermute(lutra.tensor({ 8, 3 }), lutra.tensor({ T, 2 }, "i32"))
      end, "lutra_moe_unpermute", "probs dtype i32" },
    { "dpermuted of the wrong rows", function()
        local d = moe.Dispatcher(Ex); d:permute(logits(), idx(good_idx)); d:permute_backward(lutra.tensor({ 4, 6 }))
      end, "lutra_moe_permute_backward", "dpermuted has 4 rows" },
    { "dy of the wrong shape", function()
        local d = moe.Dispatcher(Ex); d:permute(logits(), idx(good_idx)); d:unpermute(lutra.tensor({ 8, 3 }), lutra.tensor({ T, 2 }))
        d:unpermute_backward(lutra.tensor({ T, 4 }))
      end, "lutra_moe_unpermute_backward", "dy must be [4, 3]" },
    { "dy of another dtype", function()
        local d = moe.Dispatcher(Ex); d:permute(logits(), idx(good_idx)); d:unpermute(lutra.tensor({ 8, 3 }), lutra.tensor({ T, 2 }))
        d:unpermute_backward(lutra.tensor({ T, 3 }, "bf16"))
      end, "lutra_moe_unpermute_backward", "does not match" },
    { "a freed dispatcher", function() local d = moe.Dispatcher(Ex); d:destroy(); d:permute(logits(), idx(good_idx)) end, "lutra_moe_permute", "freed" },
    { "row_map before permute", function() moe.Dispatcher(Ex):row_map() end, "lutra_moe_row_map", "no permute" },
  }
  for _, c in ipairs(cases) do
    it("refuses " .. c[1], function() E.expect_error(c[2], c[3], c[4]) end)
  end

  it("leaves the dispatcher as it was after a refused permute", function()
    local d = moe.Dispatcher(Ex)
    local x = logits()
    local xp = d:permute(x, idx(good_idx))
    local before, map = xp:bytes(), R.ints(d:row_map())
    E.expect_error(function() d:permute(x, idx({ 0, 1, 2, 3, 4, 9, 0, 1 })) end, "lutra_moe_permute", "index 9")
    assert.are.equal(before, xp:bytes())
    assert.are.same(map, R.ints(d:row_map()))
    assert.is_false(xp:is_freed())
    d:check() -- nothing flagged on the CPU
  end)
end)

describe("moe lifetimes", function()
  it("outputs keep their router and dispatcher alive; a freed owner's outputs report it", function()
    local probs, idx, xp, splits
    do
      local r, d = moe.TopK(4, 2), moe.Dispatcher(4)
      probs, idx = r:forward(lutra.tensor({ 3, 4 }):randn(1))
      xp, splits = d:permute(lutra.tensor({ 3, 2 }):randn(2), idx)
    end
    collectgarbage()
    collectgarbage()
    assert.are.equal(6, #xp:to_table() / 2)
    assert.are.equal(4, #R.ints(splits))
    local r = moe.TopK(4, 2)
    local p = r:forward(lutra.tensor({ 3, 4 }):randn(1))
    r:destroy()
    assert.is_true(p:is_freed())
    E.expect_error(function() p:to_table() end, "lutra_tensor_get_f32", "freed")
    assert.is_true(probs:size() == 6)
  end)
end)

describe("moe C entry points", function()
  local C = lutra.C
  local tb = ffi.new("lutra_tensor*[2]")
  local function call(fn) return function() E.c_check(fn()) end end
  local x = lutra.tensor({ 4, 3 }):randn(1)
  local idx = tensor_of({ 0, 1, 2, 3 }, { 4, 1 }, "i32")
  local cases = {
    { "router_new(NULL desc)", function() return C.lutra_moe_router_new(nil, ffi.new("lutra_moe_router*[1]")) end,
      "lutra_moe_router_new", "desc is NULL" },
    { "router_forward(NULL router)", function() return C.lutra_moe_router_forward(nil, x, tb, tb + 1) end,
      "lutra_moe_router_forward", "router" },
    { "router_forward(NULL logits)", function() return C.lutra_moe_router_forward(moe.TopK(3, 1), nil, tb, tb + 1) end,
      "lutra_moe_router_forward", "logits" },
    { "router_forward(NULL outputs)", function() return C.lutra_moe_router_forward(moe.TopK(3, 1), x, nil, nil) end,
      "lutra_moe_router_forward", "must not be NULL" },
    { "router_backward(NULL dlogits)", function() return C.lutra_moe_router_backward(moe.TopK(3, 1), x, nil) end,
      "lutra_moe_router_backward", "dlogits is NULL" },
    { "dispatch_new(NULL out)", function() return C.lutra_moe_dispatch_new(4, 0, nil) end,
      "lutra_moe_dispatch_new", "out is NULL" },
    { "dispatch_new on an unknown device", function() return C.lutra_moe_dispatch_new(4, 7, ffi.new("lutra_moe_dispatch*[1]")) end,
      "lutra_moe_dispatch_new", nil },
    { "permute(NULL dispatcher)", function() return C.lutra_moe_permute(nil, x, idx, tb, tb + 1) end,
      "lutra_moe_permute", "dispatcher" },
    { "permute(NULL indices)", function() return C.lutra_moe_permute(moe.Dispatcher(4), x, nil, tb, tb + 1) end,
      "lutra_moe_permute", "indices" },
    { "permute(NULL outputs)", function() return C.lutra_moe_permute(moe.Dispatcher(4), x, idx, nil, tb) end,
      "lutra_moe_permute", "must not be NULL" },
    { "permute with a router as the dispatcher", function()
        return C.lutra_moe_permute(ffi.cast("lutra_moe_dispatch*", moe.TopK(3, 1)), x, idx, tb, tb + 1)
      end, "lutra_moe_permute", "is not a" },
    { "unpermute(NULL y)", function() return C.lutra_moe_unpermute(moe.Dispatcher(4), x, x, nil) end,
      "lutra_moe_unpermute", "y is NULL" },
    { "unpermute_backward(NULL outputs)", function() return C.lutra_moe_unpermute_backward(moe.Dispatcher(4), x, nil, tb) end,
      "lutra_moe_unpermute_backward", "must not be NULL" },
    { "permute_backward(NULL dx)", function() return C.lutra_moe_permute_backward(moe.Dispatcher(4), x, nil) end,
      "lutra_moe_permute_backward", "dx is NULL" },
    { "row_map(NULL out)", function() return C.lutra_moe_row_map(moe.Dispatcher(4), nil) end,
      "lutra_moe_row_map", "row_map is NULL" },
    { "dispatch_check(NULL)", function() return C.lutra_moe_dispatch_check(nil) end,
      "lutra_moe_dispatch_check", "dispatcher" },
  }
  for _, c in ipairs(cases) do
    it("refuses " .. c[1], function() E.expect_error(call(c[2]), c[3], c[4]) end)
  end

  it("the free functions take NULL and the last reference", function()
    assert.are.equal(0, C.lutra_moe_router_unref(nil))
    assert.are.equal(0, C.lutra_moe_dispatch_unref(nil))
    local box = ffi.new("lutra_moe_dispatch*[1]")
    assert.are.equal(0, C.lutra_moe_dispatch_new(4, 0, box))
    assert.are.equal(0, C.lutra_moe_permute(box[0], x, idx, tb, tb + 1))
    assert.are.equal(0, C.lutra_moe_dispatch_unref(box[0]))
  end)
end)
