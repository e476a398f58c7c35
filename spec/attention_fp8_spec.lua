-- FP8 attention (nn.DotProductAttention {fp8 = true}) on the CPU backend, which emulates cuDNN's
-- FP8 attention (src/backend/cpu/attention_fp8_cpu.c): the option, its refusals, the
-- delayed-scaling state joining the scope's update, and the results against the same module in
-- f32. Fresh random inputs each run (the seed is named in failures). Bounds, as NMSE =
-- sum (got - ref)^2 / sum ref^2 against the f32 module on the same inputs:
--   forward 1e-2: q, k, v, the softmax probabilities S and O are each rounded once to E4M3 (3
--     mantissa bits: a rounding error uniform within half an ulp of 2^-3 of the binade start, so
--     an NMSE near 2^-6 / 12 / 2.3 = 5.6e-4 per rounding for values spread over a binade); the
--     five compound to about 3e-3, so 1e-2 leaves a margin of 3 and fails on any wrong scale
--     (a factor 2 is an NMSE of 1 or 0.25), mask or stale descale;
--   backward 1e-1: dO and dS are rounded to E5M2 (2 mantissa bits, about 2.2e-3 each; E4M3
--     under fp8_format e4m3), dS = P (dP - D) cancels where dP is near D (enlarging its relative
--     error), and dq, dk, dv are rounded once more on top of the forward's roundings: about 1e-2
--     with unit-variance inputs, 4.3e-2 seen for one seed (dq, step 2, causal: the cancellation
--     in dS), so 1e-1; what it guards against is larger still (a stale descale: NMSE near 1, a
--     scale off by 2: 0.25).
-- Step 1 runs with every scale at 1 (unit-variance inputs keep its values in E4M3's normal range)
-- and the scope's exit updates the scales between its forward and backward: the backward must
-- descale what the forward wrote with the forward's scales (a stale descale is an NMSE near 1).
-- And below 1e-7 it must not be: a module that silently ran f32 would pass the bounds.
-- Packed against q, k, v, and fp8 outside a scope against the plain module: bit for bit.
local lutra = require("lutra")
local nn, R = lutra.nn, lutra.recipe
local ffi = require("ffi")
local E = require("spec.support.errors")
local P = require("spec.support.qkv_packing")

local fresh = require("spec.support.fresh_random").new()
local SEED, random = fresh.seed, fresh.int

local FWD_BOUND, BWD_BOUND, FLOOR = 1e-2, 1e-1, 1e-7
local B, T, H, D = 2, 24, 2, 128

local function rand(shape, std)
  return lutra.tensor(shape, "f32"):randn(random(1, 2 ^ 30), 0, std or 1)
end
local function f32(x) return tonumber(ffi.new("float", x)) end

local function nmse(got, want)
  local a, b, e, s = got:read(), want:read(), 0, 0
  for i = 0, want:size() - 1 do
    e = e + (a[i] - b[i]) ^ 2
    s = s + b[i] ^ 2
  end
  return e / s
end

local function check(got, want, bound, what)
  local e = nmse(got, want)
  assert.is_true(e <= bound, string.format("%s: NMSE %.3e > %.0e (seed %d)", what, e, bound, SEED))
  assert.is_true(e >= FLOOR, string.format("%s: NMSE %.3e: no FP8 rounding at all? (seed %d)",
                                           what, e, SEED))
end

local function max_abs(...)
  local m = 0
  for _, t in ipairs { ... } do
    local v = t:read()
    for i = 0, t:size() - 1 do m = math.max(m, math.abs(v[i])) end
  end
  return m
end

-- q, k, v and dout of one step (q and k of standard deviation qk_std)
local function inputs(Hkv, qk_std)
  return rand({ B, T, H, D }, qk_std), rand({ B, T, Hkv or H, D }, qk_std),
         rand({ B, T, Hkv or H, D }), rand({ B, T, H, D })
end

-- one training step of m inside scope (forward inside, backward after its exit, as a training
-- loop runs them): out, dq, dk, dv
local function step(m, scope, q, k, v, dout)
  scope:enter()
  local ok, out = pcall(m.forward, m, q, k, v)
  scope:exit()
  assert(ok, out)
  return out, m:backward(dout)
end

describe("nn.DotProductAttention {fp8 = true} on the cpu", function()
  it("takes fp8 = true and shows it; a non-boolean fp8 is refused naming the option", function()
    local m = nn.DotProductAttention(2, 128, { fp8 = true })
    assert.is_truthy(tostring(m):find(", fp8)", 1, true), tostring(m))
    assert.is_falsy(tostring(nn.DotProductAttention(2, 128)):find("fp8", 1, true))
    local msg = E.message_of(function() nn.DotProductAttention(2, 128, { fp8 = 1 }) end)
    assert.is_truthy(msg:find("fp8", 1, true), msg)
  end)

  it("refuses head_dim other than 128 and dropout at construction, naming why", function()
    E.expect_error(function() nn.DotProductAttention(2, 64, { fp8 = true }) end,
                   "lutra_attention_new", "fp8 attention takes head_dim 128")
    E.expect_error(function() nn.DotProductAttention(2, 128, { fp8 = true, dropout = 0.1 }) end,
                   "lutra_attention_new", "fp8 attention runs without dropout")
  end)

  it("refuses a scope whose recipe is not delayed scaling, and changes nothing", function()
    local m = nn.DotProductAttention(H, D, { fp8 = true })
    local q, k, v = inputs()
    for _, recipe in ipairs { R.current(), R.mxfp8() } do
      local scope = lutra.autocast { recipe = recipe }
      scope:enter()
      local ok, msg = pcall(m.forward, m, q, k, v)
      scope:exit()
      assert.is_false(ok)
      assert.is_truthy(tostring(msg):find("runs under delayed scaling", 1, true), tostring(msg))
    end
    local st = m:fp8_state()
    assert.are.same({}, st.history.qkv, "no state was built")
    assert.is_false(st.last_fp8)
    assert.has_error(function() m:backward(q) end) -- no forward ran
  end)

  it("outside an enabled scope (and calibrating) runs the plain path, bit for bit", function()
    local m, plain = nn.DotProductAttention(H, D, { fp8 = true }), nn.DotProductAttention(H, D)
    local q, k, v, dout = inputs()
    local calib = lutra.autocast { recipe = R.delayed(), calibrating = true }
    for round = 1, 2 do
      if round == 2 then calib:enter() end
      local got, want = m:forward(q, k, v):bytes(), plain:forward(q, k, v):bytes()
      if round == 2 then calib:exit() end
      assert.are.equal(want, got, "out, round " .. round)
      assert.is_false(m:fp8_state().last_fp8)
      local g, w = { m:backward(dout) }, { plain:backward(dout) }
      for i = 1, 3 do assert.are.equal(w[i]:bytes(), g[i]:bytes(), "gradient " .. i) end
    end
  end)

  -- S's scale follows its amax history as TE's does: a step whose largest weight exceeds what
  -- the history saw is clipped to it. A causal mask's row 0 has weight 1 every step; without a
  -- mask, q and k of std 0.3 keep the weights near 1 / T, so no step's maximum runs far above
  -- another's (unit q and k would let one step's largest weight double the last one's).
  for _, c in ipairs {
    { name = "causal", causal = true },
    { name = "causal, one key/value head for 2 query heads, fp8_format e4m3 (E4M3 gradients)",
      causal = true, Hkv = 1, format = "e4m3" },
    { name = "no_mask, weights near 1 / T", causal = false, qk_std = 0.3 },
  } do
    it(c.name .. ": forward and backward within the FP8 bounds of the f32 module, every step",
       function()
      local opts = { attn_mask_type = c.causal and "causal" or "no_mask", num_gqa_groups = c.Hkv }
      local m = nn.DotProductAttention(H, D, { fp8 = true, attn_mask_type = opts.attn_mask_type,
                                               num_gqa_groups = c.Hkv })
      local ref = nn.DotProductAttention(H, D, opts)
      local scope = lutra.autocast { recipe = R.delayed { fp8_format = c.format or "hybrid" } }
      for s = 1, 3 do -- step 1 runs with scales 1; the scope's exit updates them before its backward
        local q, k, v, dout = inputs(c.Hkv, c.qk_std)
        local out, dq, dk, dv = step(m, scope, q, k, v, dout)
        assert.is_true(m:fp8_state().last_fp8, "the forward ran FP8")
        local what = string.format("%s step %d", c.name, s)
        check(out, ref:forward(q, k, v), FWD_BOUND, what .. ": out")
        local gw = { ref:backward(dout) }
        for i, g in ipairs { dq, dk, dv } do
          check(g, gw[i], BWD_BOUND, what .. ": " .. ({ "dq", "dk", "dv" })[i])
        end
      end
    end)
  end

  it("its six scales follow delayed scaling's rule from the amaxes it records", function()
    local margin = 1
    local m = nn.DotProductAttention(H, D, { fp8 = true })
    local scope = lutra.autocast { recipe = R.delayed { margin = margin, amax_history_len = 3 } }
    local q, k, v, dout = inputs()
    local out, dq, dk, dv = step(m, scope, q, k, v, dout)
    local st = m:fp8_state()
    assert.are.equal(3, #st.history.qkv)
    -- the most recent amax is the history's last (rolled at the update)
    local amax = {}
    for name, h in pairs(st.history) do amax[name] = h[3] end
    -- exact: the casts' max |x| over q, k, v and over dout
    assert.are.equal(f32(max_abs(q, k, v)), amax.qkv, "QKV's amax")
    assert.are.equal(f32(max_abs(dout)), amax["do"], "dO's amax")
    -- O and the gradients came back through one FP8 rounding (E4M3 2^-4, E5M2 2^-3 relative)
    assert.is_true(math.abs(amax.o - max_abs(out)) <= 2 ^ -4 * amax.o, "O's amax")
    assert.is_true(math.abs(amax.dqkv - max_abs(dq, dk, dv)) <= 2 ^ -3 * amax.dqkv, "dQKV's amax")
    -- S: a probability, at least 1 / T (a row's largest) and at most 1; dP: positive
    assert.is_true(amax.s >= 1 / T and amax.s <= 1, "S's amax " .. amax.s)
    assert.is_true(amax.dp > 0, "dP's amax")
    for name, a in pairs(amax) do
      local fmax = (name == "do" or name == "dp" or name == "dqkv") and 57344 or 448
      local want = f32(f32(fmax / 2 ^ margin) / a)
      assert.is_true(math.abs(st.scales[name] - want) <= 1e-6 * want,
                     string.format("%s: scale %.9g, want %.9g (amax %.9g)", name, st.scales[name],
                                   want, a))
    end
  end)

  it("forward(qkv) packed equals forward(q, k, v) bit for bit, and its dqkv the three", function()
    local Hkv = 1
    local m, mp = nn.DotProductAttention(H, D, { fp8 = true, num_gqa_groups = Hkv }),
                  nn.DotProductAttention(H, D, { fp8 = true, num_gqa_groups = Hkv })
    local scope = lutra.autocast { recipe = R.delayed() }
    for _ = 1, 2 do
      local q, k, v, dout = inputs(Hkv)
      local widths = { H * D, Hkv * D, Hkv * D }
      local x = P.pack({ q:to_table(), k:to_table(), v:to_table() }, widths, B * T)
      local out, dq, dk, dv = step(m, scope, q, k, v, dout)
      scope:enter()
      local outp = mp:forward(lutra.from_table(x, { B, T, #x / (B * T) }))
      scope:exit()
      assert.are.equal(out:bytes(), outp:bytes(), "out")
      local dx = mp:backward(lutra.from_table(dout:to_table(), { B, T, H * D })):to_table()
      local parts = P.split(dx, widths, B * T)
      for i, g in ipairs { dq, dk, dv } do
        assert.are.same(g:to_table(), parts[i], ({ "dq", "dk", "dv" })[i] .. " in dqkv")
      end
    end
    assert.are.same(m:fp8_state().scales, mp:fp8_state().scales)
  end)

  it("a module collected inside a scope leaves it: the exit updates the others' scales", function()
    local scope = lutra.autocast { recipe = R.delayed() }
    local keep = nn.DotProductAttention(H, D, { fp8 = true })
    local q, k, v = inputs()
    scope:enter()
    local ok, err = pcall(function()
      nn.DotProductAttention(H, D, { fp8 = true }):forward(q, k, v) -- its metas join the list
      collectgarbage()
      collectgarbage()
      keep:forward(q, k, v)
    end)
    scope:exit()
    assert(ok, err)
    assert.are.equal(f32(f32(448 / max_abs(q, k, v))), keep:fp8_state().scales.qkv)
  end)

  it("a forward under another recipe rebuilds the state for it (its history length)",
     function()
    local m = nn.DotProductAttention(H, D, { fp8 = true })
    local q, k, v, dout = inputs()
    step(m, lutra.autocast { recipe = R.delayed { amax_history_len = 2 } }, q, k, v, dout)
    assert.are.equal(2, #m:fp8_state().history.qkv)
    local scope = lutra.autocast { recipe = R.delayed { amax_history_len = 5 } }
    step(m, scope, q, k, v, dout)
    assert.are.equal(5, #m:fp8_state().history.qkv)
  end)
end)
