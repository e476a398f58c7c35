-- nn.DotProductAttention on the CPU backend (the reference; spec/gpu/attention_gpu.lua compares
-- cuDNN to it). Fresh random inputs each run (the seed is named in failures). Tolerances:
--   forward (f32) against a naive f64 Lua attention on the same f32 inputs: |got - ref| <=
--     2^-22 |ref| + 1e-10 (the module sums in f64 and rounds once to f32: 2^-24 relative);
--   backward (f32) against the same reference: |got - ref| <= 2^-22 |ref| + 1e-5 max|ref| (the
--     backward rebuilds the weights from the f32 log-sum-exp: up to 2^-24 |lse| relative error in
--     each weight, |lse| < 20 here, times sums of a few dozen terms of size max|ref|);
--   finite differences (f64 loss sum(out * w) through the f32 module, central, h = 2^-6, the
--     step taken as the f32 values actually set): |an - fd| <= 2e-3 max|fd| + 2e-5 (f32 rounding
--     of out, about 2^-24 sum|w out| / 2h, and the h^2 truncation term);
--   bf16 against f32 on the same bf16-representable inputs: forward |a - b| <= 2^-8 |b| + 1e-6
--     (one rounding to bf16's 8 significant bits); backward in norm ||a - b|| <= 2^-5 ||b|| (the
--     gradient, O and the output rounded to bf16, 2^-8 each, enter D_i = dO . O and dS);
--   sbhd against bshd, packed against q/k/v, repeated backwards: bit for bit (the same sums in
--     the same order).
local lutra = require("lutra")
local nn = lutra.nn
local ffi = require("ffi")
local bit = require("bit")
local C = ffi.C

local fresh = require("spec.support.fresh_random").new()
local SEED, random = fresh.seed, fresh.int

local function rand(shape, dtype) return lutra.tensor(shape, dtype or "f32"):randn(random(1, 2 ^ 30)) end
local function f32(x) return tonumber(ffi.new("float", x)) end

-- the naive reference, f64, tables in bshd order (1-based); keep(b, h, i, j) the dropout's
-- factor (nil: none). D_i is computed as sum_j P G (not dO . O as the module does): independent.
local function reference(c, q, k, v, dout, keep)
  local B, Tq, Tk, H, Hkv, D = c.B, c.Tq, c.Tk or c.Tq, c.H, c.Hkv or c.H, c.D
  local scale, rep = c.scale or f32(1 / math.sqrt(D)), H / Hkv
  local function qi(b, t, h, d) return ((b * Tq + t) * H + h) * D + d + 1 end
  local function ki(b, t, g, d) return ((b * Tk + t) * Hkv + g) * D + d + 1 end
  local out, dq, dk, dv = {}, {}, {}, {}
  for i = 1, B * Tk * Hkv * D do dk[i], dv[i] = 0, 0 end
  for b = 0, B - 1 do
    for h = 0, H - 1 do
      local g = math.floor(h / rep)
      for i = 0, Tq - 1 do
        local len = c.causal and i + 1 or Tk
        local s, m = {}, -math.huge
        for j = 0, len - 1 do
          local dot = 0
          for d = 0, D - 1 do dot = dot + q[qi(b, i, h, d)] * k[ki(b, j, g, d)] end
          s[j] = dot * scale
          m = math.max(m, s[j])
        end
        local sum = 0
        for j = 0, len - 1 do sum = sum + math.exp(s[j] - m) end
        local P, Z = {}, {}
        for j = 0, len - 1 do
          P[j] = math.exp(s[j] - m) / sum
          Z[j] = keep and keep(b, h, i, j) or 1
        end
        for d = 0, D - 1 do
          local acc = 0
          for j = 0, len - 1 do acc = acc + P[j] * Z[j] * v[ki(b, j, g, d)] end
          out[qi(b, i, h, d)] = acc
        end
        if dout then
          local G, delta = {}, 0
          for j = 0, len - 1 do
            local dot = 0
            for d = 0, D - 1 do dot = dot + dout[qi(b, i, h, d)] * v[ki(b, j, g, d)] end
            G[j] = Z[j] * dot
            delta = delta + P[j] * G[j]
          end
          for d = 0, D - 1 do dq[qi(b, i, h, d)] = 0 end
          for j = 0, len - 1 do
            local ds = P[j] * (G[j] - delta)
            for d = 0, D - 1 do
              dq[qi(b, i, h, d)] = dq[qi(b, i, h, d)] + scale * ds * k[ki(b, j, g, d)]
              dk[ki(b, j, g, d)] = dk[ki(b, j, g, d)] + scale * ds * q[qi(b, i, h, d)]
              dv[ki(b, j, g, d)] = dv[ki(b, j, g, d)] + P[j] * Z[j] * dout[qi(b, i, h, d)]
            end
          end
        end
      end
    end
  end
  return out, dq, dk, dv
end

local function max_abs(t)
  local m = 0
  for _, x in ipairs(t) do m = math.max(m, math.abs(x)) end
  return m
end

local function assert_close(got, want, rel, abs, what)
  assert.are.equal(#want, #got, what)
  for i = 1, #want do
    local tol = rel * math.abs(want[i]) + abs
    if not (math.abs(got[i] - want[i]) <= tol) then
      error(string.format("%s[%d] = %.9g, want %.9g (tolerance %.3g, seed %d)", what, i, got[i],
                          want[i], tol, SEED), 2)
    end
  end
end

-- forward and backward of a module against the reference; returns the module's tensors
local function check_against_reference(c)
  local Tk, Hkv = c.Tk or c.Tq, c.Hkv or c.H
  local m = nn.DotProductAttention(c.H, c.D, { num_gqa_groups = Hkv,
                                               attn_mask_type = c.causal and "causal" or "no_mask" })
  local q, k, v = rand { c.B, c.Tq, c.H, c.D }, rand { c.B, Tk, Hkv, c.D }, rand { c.B, Tk, Hkv, c.D }
  local dout = rand { c.B, c.Tq, c.H, c.D }
  local out = m:forward(q, k, v):to_table()
  local dq, dk, dv = m:backward(dout)
  local rout, rdq, rdk, rdv = reference(c, q:to_table(), k:to_table(), v:to_table(), dout:to_table())
  assert_close(out, rout, 2 ^ -22, 1e-10, "out")
  assert_close(dq:to_table(), rdq, 2 ^ -22, 1e-5 * max_abs(rdq), "dq")
  assert_close(dk:to_table(), rdk, 2 ^ -22, 1e-5 * max_abs(rdk), "dk")
  assert_close(dv:to_table(), rdv, 2 ^ -22, 1e-5 * max_abs(rdv), "dv")
end

-- the CPU's documented dropout hash (src/backend/cpu/attention_cpu.c)
local function mix(z)
  z = z + 0x9E3779B97F4A7C15ULL
  z = bit.bxor(z, bit.rshift(z, 30)) * 0xBF58476D1CE4E5B9ULL
  z = bit.bxor(z, bit.rshift(z, 27)) * 0x94D049BB133111EBULL
  return bit.bxor(z, bit.rshift(z, 31))
end
local function cpu_keep(seed, offset, p, H, Tq, Tk)
  local stream = mix(bit.bxor(mix(ffi.cast("uint64_t", seed)), ffi.cast("uint64_t", offset)))
  return function(b, h, i, j)
    local idx = ffi.cast("uint64_t", ((b * H + h) * Tq + i) * Tk + j)
    local u = tonumber(bit.rshift(mix(bit.bxor(stream, idx)), 11)) * 2 ^ -53
    return u >= p and 1 / (1 - p) or 0
  end
end

describe("nn.DotProductAttention", function()
  it("matches a naive f64 attention, causal and not, with GQA (H 4: Hkv 4, 2, 1)", function()
    for _, causal in ipairs { true, false } do
      for _, hkv in ipairs { 4, 2, 1 } do
        check_against_reference { B = 2, Tq = 7, H = 4, Hkv = hkv, D = 8, causal = causal }
      end
    end
  end)

  it("matches it for T = 67 (not a multiple of a tile), T = 1, and T_kv ~= T_q without a mask",
     function()
    check_against_reference { B = 1, Tq = 67, H = 2, Hkv = 1, D = 4, causal = true }
    check_against_reference { B = 3, Tq = 1, H = 2, Hkv = 2, D = 5, causal = true }
    check_against_reference { B = 3, Tq = 1, H = 2, Hkv = 1, D = 5, causal = false }
    check_against_reference { B = 2, Tq = 5, Tk = 9, H = 4, Hkv = 2, D = 3, causal = false }
  end)

  it("takes its softmax_scale", function()
    local m = nn.DotProductAttention(2, 4, { softmax_scale = 0.7, attn_mask_type = "no_mask" })
    local q, k, v = rand { 1, 5, 2, 4 }, rand { 1, 5, 2, 4 }, rand { 1, 5, 2, 4 }
    local want = reference({ B = 1, Tq = 5, H = 2, D = 4, scale = f32(0.7) }, q:to_table(),
                           k:to_table(), v:to_table())
    assert_close(m:forward(q, k, v):to_table(), want, 2 ^ -22, 1e-10, "out")
  end)

  it("gradient check: central finite differences of an f64 loss for dq, dk and dv", function()
    for _, causal in ipairs { true, false } do
      local B, T, H, Hkv, D = 1, 4, 2, 1, 3
      local m = nn.DotProductAttention(H, D, { num_gqa_groups = Hkv,
                                              attn_mask_type = causal and "causal" or "no_mask" })
      local t = { rand { B, T, H, D }, rand { B, T, Hkv, D }, rand { B, T, Hkv, D } }
      local w = rand { B, T, H, D }
      local wt = w:to_table()
      local function loss()
        local out, s = m:forward(t[1], t[2], t[3]):to_table(), 0
        for i = 1, #out do s = s + out[i] * wt[i] end
        return s
      end
      loss()
      local grads = { m:backward(w) }
      local h = 2 ^ -6
      for which = 1, 3 do
        local an, vec, num = grads[which]:to_table(), t[which]:to_table(), {}
        for i = 1, #vec do
          local x = vec[i]
          vec[i] = x + h
          t[which]:set(vec)
          local up, lp = t[which]:to_table()[i], loss()
          vec[i] = x - h
          t[which]:set(vec)
          local down, lm = t[which]:to_table()[i], loss()
          vec[i] = x
          t[which]:set(vec)
          num[i] = (lp - lm) / (up - down)
        end
        local tol = 2e-3 * max_abs(num) + 2e-5
        for i = 1, #num do
          assert.is_true(math.abs(an[i] - num[i]) <= tol,
                         string.format("%s[%d] = %.9g, finite differences %.9g (seed %d)",
                                       ({ "dq", "dk", "dv" })[which], i, an[i], num[i], SEED))
        end
      end
    end
  end)

  it("sbhd equals bshd transposed, bit for bit", function()
    local B, T, H, Hkv, D = 2, 6, 4, 2, 5
    local a = nn.DotProductAttention(H, D, { num_gqa_groups = Hkv })
    local s = nn.DotProductAttention(H, D, { num_gqa_groups = Hkv, qkv_format = "sbhd" })
    local function transpose(x, n1, n2, inner) -- [n1, n2, inner] -> [n2, n1, inner]
      local src, dst = x:to_table(), {}
      for i = 0, n1 - 1 do
        for j = 0, n2 - 1 do
          for e = 1, inner do dst[(j * n1 + i) * inner + e] = src[(i * n2 + j) * inner + e] end
        end
      end
      return dst
    end
    local q, k, v, dout = rand { B, T, H, D }, rand { B, T, Hkv, D }, rand { B, T, Hkv, D },
                          rand { B, T, H, D }
    local qs = lutra.from_table(transpose(q, B, T, H * D), { T, B, H, D })
    local ks = lutra.from_table(transpose(k, B, T, Hkv * D), { T, B, Hkv, D })
    local vs = lutra.from_table(transpose(v, B, T, Hkv * D), { T, B, Hkv, D })
    local ds = lutra.from_table(transpose(dout, B, T, H * D), { T, B, H, D })
    local out = a:forward(q, k, v)
    assert.are.same(transpose(out, B, T, H * D), s:forward(qs, ks, vs):to_table())
    local g = { a:backward(dout) }
    local gs = { s:backward(ds) }
    for i, hd in ipairs { H * D, Hkv * D, Hkv * D } do
      assert.are.same(transpose(g[i], B, T, hd), gs[i]:to_table())
    end
  end)

  it("packed QKV (the module protocol) equals the q, k, v call, bit for bit, both formats",
     function()
    for _, fmt in ipairs { "bshd", "sbhd" } do
      local N1, N2, H, Hkv, D = 3, 5, 4, 1, 6 -- [B, T] or [T, B]
      local a = nn.DotProductAttention(H, D, { num_gqa_groups = Hkv, qkv_format = fmt })
      local x = rand { N1, N2, (H + 2 * Hkv) * D }
      local xt, qt, kt, vt = x:to_table(), {}, {}, {}
      local W = (H + 2 * Hkv) * D
      for r = 0, N1 * N2 - 1 do
        for e = 1, H * D do qt[r * H * D + e] = xt[r * W + e] end
        for e = 1, Hkv * D do
          kt[r * Hkv * D + e] = xt[r * W + H * D + e]
          vt[r * Hkv * D + e] = xt[r * W + (H + Hkv) * D + e]
        end
      end
      local q = lutra.from_table(qt, { N1, N2, H, D })
      local k = lutra.from_table(kt, { N1, N2, Hkv, D })
      local v = lutra.from_table(vt, { N1, N2, Hkv, D })
      local dy = rand { N1, N2, H * D }
      local y = a:forward(x)
      assert.are.same({ N1, N2, H * D }, y:dims())
      local packed_out = y:to_table()
      local dx = a:backward(dy)
      assert.are.same({ N1, N2, W }, dx:dims())
      local dxt = dx:to_table()
      assert.are.same(packed_out, a:forward(q, k, v):to_table())
      local dq, dk, dv = a:backward(lutra.from_table(dy:to_table(), { N1, N2, H, D }))
      dq, dk, dv = dq:to_table(), dk:to_table(), dv:to_table()
      for r = 0, N1 * N2 - 1 do
        for e = 1, H * D do assert.are.equal(dq[r * H * D + e], dxt[r * W + e]) end
        for e = 1, Hkv * D do
          assert.are.equal(dk[r * Hkv * D + e], dxt[r * W + H * D + e])
          assert.are.equal(dv[r * Hkv * D + e], dxt[r * W + (H + Hkv) * D + e])
        end
      end
    end
  end)

  it("sits in a Sequential after a fused QKV Linear, backward flowing through", function()
    local d, H, D = 16, 2, 8
    local net = nn.Sequential(nn.Linear(d, 3 * d), nn.DotProductAttention(H, D), nn.Linear(d, d))
    local x, target = rand { 2, 5, d }, rand { 2, 5, d }
    local loss = nn.MSELoss()
    loss:forward(net:forward(x), target)
    local dx = net:backward(loss:backward())
    assert.are.same({ 2, 5, d }, dx:dims())
    local first = loss:value()
    local opt = lutra.optim.AdamW(net, { lr = 1e-2 })
    for _ = 1, 20 do
      loss:forward(net:forward(x), target)
      net:backward(loss:backward())
      opt:step()
    end
    assert.is_true(loss:value() < first, string.format("%g -> %g", first, loss:value()))
  end)

  it("bf16 stays within its rounding of f32 on the same inputs", function()
    local B, T, H, Hkv, D = 2, 9, 4, 2, 8
    local to_bf16 = function(t) return lutra.tensor(t:dims(), "bf16"):copy(t) end
    local q, k, v, dout = rand { B, T, H, D }, rand { B, T, Hkv, D }, rand { B, T, Hkv, D },
                          rand { B, T, H, D }
    local qb, kb, vb, db = to_bf16(q), to_bf16(k), to_bf16(v), to_bf16(dout)
    local function as_f32(t) return lutra.tensor(t:dims()):copy(t) end
    local a = nn.DotProductAttention(H, D, { num_gqa_groups = Hkv })
    local b = nn.DotProductAttention(H, D, { num_gqa_groups = Hkv, dtype = "bf16" })
    local ref = a:forward(as_f32(qb), as_f32(kb), as_f32(vb)):to_table()
    local got = b:forward(qb, kb, vb)
    assert.are.equal("bf16", got:dtype_name())
    assert_close(got:to_table(), ref, 2 ^ -8, 1e-6, "bf16 out")
    local ga = { a:backward(as_f32(db)) }
    local gb = { b:backward(db) }
    for i, name in ipairs { "dq", "dk", "dv" } do
      local x, y = gb[i]:to_table(), ga[i]:to_table()
      local err, norm = 0, 0
      for e = 1, #y do
        err = err + (x[e] - y[e]) ^ 2
        norm = norm + y[e] ^ 2
      end
      assert.is_true(math.sqrt(err) <= 2 ^ -5 * math.sqrt(norm),
                     string.format("%s: ||bf16 - f32|| %.3g, ||f32|| %.3g (seed %d)", name,
                                   math.sqrt(err), math.sqrt(norm), SEED))
    end
  end)

  it("the backward gives the same bits every run", function()
    local m = nn.DotProductAttention(4, 8, { num_gqa_groups = 1, dropout = 0.2 })
    local q, k, v, dout = rand { 2, 11, 4, 8 }, rand { 2, 11, 1, 8 }, rand { 2, 11, 1, 8 },
                          rand { 2, 11, 4, 8 }
    m:forward(q, k, v)
    local g1 = { m:backward(dout) }
    local b1 = { g1[1]:bytes(), g1[2]:bytes(), g1[3]:bytes() }
    local g2 = { m:backward(dout) }
    for i = 1, 3 do assert.are.equal(b1[i], g2[i]:bytes()) end
    assert.are.same({ 1, true }, { m:plans() })
  end)
end)

describe("nn.DotProductAttention dropout", function()
  -- q = 0 makes every weight 1/T, and v_j the unit vector e_j shows weight (i, j) in out[i][j]:
  -- out * T is the mask times 1 / (1 - p)
  local B, T, H, p = 2, 32, 4, 0.25
  local function mask_of(m)
    local q = lutra.tensor { B, T, H, T }
    local kv = {}
    for b = 0, B - 1 do
      for j = 0, T - 1 do
        for h = 0, H - 1 do
          for e = 0, T - 1 do kv[((b * T + j) * H + h) * T + e + 1] = e == j and 1 or 0 end
        end
      end
    end
    local k = lutra.from_table(kv, { B, T, H, T })
    local out = m:forward(q, k, k):to_table()
    for i = 1, #out do out[i] = out[i] * T end
    return out
  end

  it("drops a fraction p of the weights, the documented CPU mask, fresh each forward", function()
    local seed = random(1, 2 ^ 30)
    local m = nn.DotProductAttention(H, T, { attn_mask_type = "no_mask", dropout = p, seed = seed })
    local s0, o0 = m:rng_state()
    assert.are.equal(seed, tonumber(s0))
    assert.are.equal(0, tonumber(o0))
    local first = mask_of(m)
    local dropped, keep = 0, cpu_keep(seed, 0, p, H, T, T)
    for b = 0, B - 1 do
      for i = 0, T - 1 do
        for h = 0, H - 1 do
          for j = 0, T - 1 do
            local z = first[((b * T + i) * H + h) * T + j + 1]
            assert.is_true(math.abs(z - keep(b, h, i, j)) < 1e-5,
                           string.format("weight (%d,%d,%d,%d): %g (seed %d)", b, h, i, j, z, seed))
            if z < 0.5 then dropped = dropped + 1 end
          end
        end
      end
    end
    -- 8192 weights: the fraction's standard deviation is 0.0048; 5 of them
    local frac = dropped / (B * H * T * T)
    assert.is_true(math.abs(frac - p) < 0.025, string.format("dropped %.4f (seed %d)", frac, seed))
    local _, o1 = m:rng_state()
    assert.are.equal(C.LUTRA_ATTENTION_OFFSET_STEP, tonumber(o1))
    local second = mask_of(m)
    assert.are_not.same(first, second)
    -- the same seed and offset draw the same mask again; an inference forward has none
    m:set_rng_state(seed, 0)
    assert.are.same(first, mask_of(m))
    assert.are.same(first, mask_of(nn.DotProductAttention(H, T, { attn_mask_type = "no_mask",
                                                                  dropout = p, seed = seed })))
    local q = lutra.tensor { B, T, H, T }
    local out = m:forward(q, q, q, { grad = false })
    assert.is_nil(select(2, m:plans()))
    for _, x in ipairs(out:to_table()) do assert.are.equal(0, x) end
  end)

  it("forward and backward equal the masked formula at the forward's (seed, offset)", function()
    local c = { B = 2, Tq = 6, H = 2, Hkv = 1, D = 4, causal = true }
    local seed = random(1, 2 ^ 30)
    local m = nn.DotProductAttention(2, 4, { num_gqa_groups = 1, dropout = p, seed = seed })
    m:set_rng_state(seed, 77)
    local q, k, v, dout = rand { 2, 6, 2, 4 }, rand { 2, 6, 1, 4 }, rand { 2, 6, 1, 4 },
                          rand { 2, 6, 2, 4 }
    local out = m:forward(q, k, v):to_table()
    local _, next_offset = m:rng_state()
    assert.are.equal(77 + 16, tonumber(next_offset))
    local dq, dk, dv = m:backward(dout)
    local rout, rdq, rdk, rdv = reference(c, q:to_table(), k:to_table(), v:to_table(),
                                          dout:to_table(), cpu_keep(seed, 77, p, 2, 6, 6))
    assert_close(out, rout, 2 ^ -22, 1e-10, "out")
    assert_close(dq:to_table(), rdq, 2 ^ -22, 1e-5 * max_abs(rdq), "dq")
    assert_close(dk:to_table(), rdk, 2 ^ -22, 1e-5 * max_abs(rdk), "dk")
    assert_close(dv:to_table(), rdv, 2 ^ -22, 1e-5 * max_abs(rdv), "dv")
  end)

  it("gradient check with dropout: finite differences at a fixed (seed, offset)", function()
    local m = nn.DotProductAttention(2, 3, { num_gqa_groups = 2, attn_mask_type = "no_mask",
                                             dropout = 0.4 })
    local seed = m:rng_state()
    local q, k, v, w = rand { 1, 5, 2, 3 }, rand { 1, 5, 2, 3 }, rand { 1, 5, 2, 3 },
                       rand { 1, 5, 2, 3 }
    local wt = w:to_table()
    local function loss()
      m:set_rng_state(seed, 5)
      local out, s = m:forward(q, k, v):to_table(), 0
      for i = 1, #out do s = s + out[i] * wt[i] end
      return s
    end
    loss()
    local dq = m:backward(w):to_table()
    local vec, num, h = q:to_table(), {}, 2 ^ -6
    for i = 1, #vec do
      local x = vec[i]
      vec[i] = x + h
      q:set(vec)
      local up, lp = q:to_table()[i], loss()
      vec[i] = x - h
      q:set(vec)
      local down, lm = q:to_table()[i], loss()
      vec[i] = x
      q:set(vec)
      num[i] = (lp - lm) / (up - down)
    end
    local tol = 2e-3 * max_abs(num) + 2e-5
    for i = 1, #num do
      assert.is_true(math.abs(dq[i] - num[i]) <= tol,
                     string.format("dq[%d] = %.9g, finite differences %.9g (seed %d)", i, dq[i],
                                   num[i], SEED))
    end
  end)
end)
