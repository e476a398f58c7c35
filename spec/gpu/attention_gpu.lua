-- nn.DotProductAttention on the device (cuDNN's fused flash attention, through
-- src/backend/cuda/attention_cudnn.cpp) against the CPU module in f32 on the same inputs: each
-- input is drawn fresh (the seed is named in failures), rounded to the device's dtype, and the
-- CPU gets those rounded values in f32, so the only differences are the device's own roundings.
-- Bounds, as NMSE = sum (got - ref)^2 / sum ref^2:
--   forward 1e-4: cuDNN keeps the scores and the softmax statistics in f32 but rounds the
--     probabilities to bf16 (f16) before P V and the output once more; a rounding to bf16 is a
--     relative error of at most 2^-9, rms about 2^-9 / sqrt(3), an NMSE near 1.3e-6 each: two or
--     three of them stay near 5e-6, so 1e-4 leaves a margin of 20 and still fails on any wrong
--     mask, scale, head mapping or stride (those give NMSE of 1e-2 and more).
--   backward 1e-3: dO, P and dS enter their GEMMs rounded as well, and dS = P (dP - D) cancels
--     where dP is near D, which enlarges those relative errors, so a 10 times looser bound.
--   T = 1: one key, so the weight is 1, dS is 0 and dq, dk are 0 in exact arithmetic; there the
--     device's dq, dk (its dP and D summed in different orders) must be below 1e-3 in magnitude.
-- The same (rounded) inputs in f16 carry 2^-11 roundings: the bf16 bounds hold with room to spare.
-- Backward determinism: where the plan says so (module:plans()), two backwards are equal bit
-- for bit. A captured forward + backward replayed on new inputs equals an eager module's results.
local lutra = require("lutra")
local nn = lutra.nn
local S = require("spec.gpu.support")
local E = require("spec.support.errors")
local DEV, REF = S.DEV, S.REF
local function test(name, fn) S.test(it, name, fn) end

local FWD_BOUND, BWD_BOUND, ZERO_BOUND = 1e-4, 1e-3, 1e-3
local SEED = os.time() % 1000000
local next_seed = SEED
local function seed()
  next_seed = next_seed + 1
  return next_seed
end

-- a fresh random tensor rounded to dtype: its f32 copy on the CPU and its dtype copy on DEV
local function input_pair(shape, dtype)
  local rounded = lutra.tensor(shape, dtype, REF):randn(seed())
  local ref = lutra.tensor(shape, "f32", REF):copy(rounded)
  return ref, lutra.tensor(shape, dtype, DEV):set(ref:read())
end

local function check_nmse(got, want, bound, what) S.check_nmse(got, want, bound, what, SEED) end

local function check_small(got, what)
  local n, v = got:size(), got:read()
  for i = 0, n - 1 do
    if not (math.abs(v[i]) <= ZERO_BOUND) then
      S.fail("%s: element %d is %.3g, should be ~0 (seed %d)", what, i, v[i], SEED)
    end
  end
end

-- the CPU module in f32 and the device's in dtype, of the same options
local function module_pair(c, dtype)
  local function opts(extra)
    local o = { num_gqa_groups = c.Hkv, attn_mask_type = c.causal and "causal" or "no_mask",
                qkv_format = c.fmt or "bshd" }
    for k, v in pairs(extra) do o[k] = v end
    return o
  end
  return S.hold(nn.DotProductAttention(c.H, c.D, opts {})),
         S.hold(nn.DotProductAttention(c.H, c.D, opts { dtype = dtype, device = DEV }))
end

local function describe_case(c, dtype)
  return string.format("%s %s B %d T %d H %d Hkv %d D %d%s%s", dtype, c.fmt or "bshd", c.B, c.T,
                       c.H, c.Hkv, c.D, c.causal and " causal" or "", c.packed and " packed" or "")
end

-- the leading two dims of a layout: {B, T} (bshd) or {T, B} (sbhd)
local function lead(c)
  if c.fmt == "sbhd" then return c.T, c.B end
  return c.B, c.T
end

-- forward and backward of q, k, v on both sides
local function compare_qkv(c, dtype)
  local what = describe_case(c, dtype)
  local n1, n2 = lead(c)
  local qr, qd = input_pair({ n1, n2, c.H, c.D }, dtype)
  local kr, kd = input_pair({ n1, n2, c.Hkv, c.D }, dtype)
  local vr, vd = input_pair({ n1, n2, c.Hkv, c.D }, dtype)
  local dr, dd = input_pair({ n1, n2, c.H, c.D }, dtype)
  local ref, dev = module_pair(c, dtype)
  local want = ref:forward(qr, kr, vr)
  local got = dev:forward(qd, kd, vd)
  assert.are.equal(dtype, got:dtype_name(), what .. ": output dtype")
  check_nmse(got, want, FWD_BOUND, what .. ": out")
  local gw = { ref:backward(dr) }
  if c.T == 1 and DEV == "cuda" then
    -- cuDNN has no SDPA backward for s_q = s_kv = 1: the forward (a generation step) runs, the
    -- backward is refused with cuDNN's reason
    local ok, msg = pcall(dev.backward, dev, dd)
    assert.is_false(ok, what .. ": backward at T 1 should be refused")
    assert.is_truthy(tostring(msg):find("cannot run this attention backward", 1, true), msg)
    return
  end
  local gg = { dev:backward(dd) }
  for i, name in ipairs { "dq", "dk", "dv" } do
    if c.T == 1 and i < 3 then
      check_small(gg[i], what .. ": " .. name)
    else
      check_nmse(gg[i], gw[i], BWD_BOUND, what .. ": " .. name)
    end
  end
end

-- forward(qkv) of a fused projection's output [n1, n2, (H + 2 Hkv) D] and its dqkv
local function compare_packed(c, dtype)
  local what = describe_case(c, dtype)
  local n1, n2 = lead(c)
  local xr, xd = input_pair({ n1, n2, (c.H + 2 * c.Hkv) * c.D }, dtype)
  local dr, dd = input_pair({ n1, n2, c.H * c.D }, dtype)
  local ref, dev = module_pair(c, dtype)
  check_nmse(dev:forward(xd), ref:forward(xr), FWD_BOUND, what .. ": out")
  check_nmse(dev:backward(dd), ref:backward(dr), BWD_BOUND, what .. ": dqkv")
end

local CASES = {
  { B = 2, T = 67, H = 4, Hkv = 4, D = 64, causal = true },
  { B = 2, T = 67, H = 4, Hkv = 4, D = 64, causal = false },
  { B = 2, T = 67, H = 8, Hkv = 2, D = 128, causal = true }, -- GQA
  { B = 1, T = 67, H = 4, Hkv = 1, D = 128, causal = false }, -- MQA
  { B = 3, T = 1, H = 4, Hkv = 2, D = 64, causal = true },
  { B = 2, T = 1, H = 2, Hkv = 2, D = 128, causal = false },
  { B = 2, T = 67, H = 4, Hkv = 2, D = 64, causal = true, fmt = "sbhd" },
  { B = 3, T = 40, H = 4, Hkv = 2, D = 64, causal = false, fmt = "sbhd" },
}
local PACKED = {
  { B = 2, T = 67, H = 4, Hkv = 2, D = 64, causal = true, packed = true },
  { B = 2, T = 33, H = 2, Hkv = 2, D = 128, causal = false, packed = true, fmt = "sbhd" },
}

describe("nn.DotProductAttention on " .. DEV .. " against the CPU in f32", function()
  for _, dtype in ipairs { "bf16", "f16" } do
    for _, c in ipairs(CASES) do
      test(describe_case(c, dtype) .. ": forward and backward within their NMSE bounds",
           function() compare_qkv(c, dtype) end)
    end
    for _, c in ipairs(PACKED) do
      test(describe_case(c, dtype) .. ": forward(qkv) and its dqkv within the bounds",
           function() compare_packed(c, dtype) end)
    end
  end

  test("forward and backward give the same bits on every run (the plan deterministic)",
       function()
    local B, T, H, Hkv, D = 2, 256, 8, 2, 64
    local m = nn.DotProductAttention(H, D, { num_gqa_groups = Hkv, dtype = "bf16", device = DEV })
    local _, q = input_pair({ B, T, H, D }, "bf16")
    local _, k = input_pair({ B, T, Hkv, D }, "bf16")
    local _, v = input_pair({ B, T, Hkv, D }, "bf16")
    local _, dout = input_pair({ B, T, H, D }, "bf16")
    local out = m:forward(q, k, v):bytes()
    local count, deterministic = m:plans()
    assert.are.equal(1, count, "one plan for one shape")
    if os.getenv("LUTRA_CUDNN_DETERMINISTIC") == "0" then
      assert.is_false(deterministic, "LUTRA_CUDNN_DETERMINISTIC=0 asks for the faster backward")
      return
    end
    assert.is_true(deterministic, "cuDNN offered no deterministic backward for this shape on "
                   .. DEV .. " (module:plans() says false)")
    local first = { m:backward(dout) }
    local bytes = { first[1]:bytes(), first[2]:bytes(), first[3]:bytes() }
    -- (the first run executes cuDNN directly, the second captures a graph of each call, the
    -- third replays those: src/backend/cuda/call_graphs.c)
    for run = 1, 3 do
      assert.are.equal(out, m:forward(q, k, v):bytes(), "out changed on run " .. run + 1)
      local again = { m:backward(dout) }
      for i, name in ipairs { "dq", "dk", "dv" } do
        assert.are.equal(bytes[i], again[i]:bytes(), name .. " changed on run " .. run + 1)
      end
    end
  end)

  test("a captured forward + backward replays equal to an eager module on new inputs", function()
    if DEV == "cpu" then return end -- CUDA graphs need cuda
    local B, T, H, Hkv, D = 2, 128, 4, 2, 128
    local opts = { num_gqa_groups = Hkv, dtype = "bf16", device = DEV }
    local graphed, eager = nn.DotProductAttention(H, D, opts), nn.DotProductAttention(H, D, opts)
    local shapes = { { B, T, H, D }, { B, T, Hkv, D }, { B, T, Hkv, D }, { B, T, H, D } }
    local inputs = {} -- the graph's inputs: q, k, v, dout
    for i, s in ipairs(shapes) do
      local _, t = input_pair(s, "bf16")
      inputs[i] = t
    end
    local outs
    local g = lutra.graph.capture(function()
      local out = graphed:forward(inputs[1], inputs[2], inputs[3])
      local dq, dk, dv = graphed:backward(inputs[4])
      outs = { out, dq, dk, dv }
    end, { warmup = 1 })
    local _, deterministic = graphed:plans()
    for round = 1, 3 do -- new values in the same buffers, then a replay
      local fresh = {}
      for i, s in ipairs(shapes) do
        local _, t = input_pair(s, "bf16")
        inputs[i]:copy(t)
        fresh[i] = t
      end
      g:replay()
      local want = { eager:forward(fresh[1], fresh[2], fresh[3]) }
      for _, t in ipairs { eager:backward(fresh[4]) } do want[#want + 1] = t end
      for i, name in ipairs { "out", "dq", "dk", "dv" } do
        local what = string.format("replay %d: %s", round, name)
        if i == 1 or deterministic then
          assert.are.equal(want[i]:bytes(), outs[i]:bytes(), what .. " differs from eager")
        else
          check_nmse(outs[i], want[i], 1e-6, what)
        end
      end
    end
    g:destroy()
  end)

  test("dropout: a fraction p of the weights dropped, the backward redrawing the same mask",
       function()
    if DEV == "cpu" then return end -- the CPU's own mask is spec/attention_spec.lua's
    -- q = 0 makes every weight 1 / T, and v_j = e_j puts weight (i, j) in out[i][j]: out * T
    -- * (1 - p) is the mask, 0 or 1 (T = D; 1 / T and 1 / (1 - p) = 2 exact in bf16)
    local T, p = 64, 0.5
    local m = nn.DotProductAttention(1, T, { attn_mask_type = "no_mask", dropout = p,
                                             dtype = "bf16", device = DEV })
    local q = lutra.tensor({ 1, T, 1, T }, "bf16", DEV):fill(0)
    local eye = {}
    for j = 0, T - 1 do
      for d = 0, T - 1 do eye[j * T + d + 1] = (j == d) and 1 or 0 end
    end
    local v = lutra.from_table(eye, { 1, T, 1, T }, "bf16", DEV)
    local function mask_of(out)
      local o, mask, dropped = out:read(), {}, 0
      for e = 0, T * T - 1 do
        local x = o[e] * T * (1 - p)
        assert.is_true(x == 0 or x == 1, string.format("element %d: out * T * (1 - p) = %g", e, x))
        mask[e] = x
        if x == 0 then dropped = dropped + 1 end
      end
      return mask, dropped
    end
    local mask, dropped = mask_of(m:forward(q, v, v))
    -- a binomial count of T^2 draws: 5 standard deviations either side of p T^2
    local sd = math.sqrt(T * T * p * (1 - p))
    assert.is_true(math.abs(dropped - p * T * T) <= 5 * sd,
                   string.format("%d of %d dropped, expected about %d", dropped, T * T, p * T * T))
    -- dv_j = sum_i mask_ij dO_i / (T (1 - p)): the forward's mask
    local dr, dd = input_pair({ 1, T, 1, T }, "bf16")
    local _, _, dv = m:backward(dd)
    local g, want = dr:read(), {}
    for j = 0, T - 1 do
      for d = 0, T - 1 do
        local s = 0
        for i = 0, T - 1 do s = s + mask[i * T + j] * g[i * T + d] end
        want[j * T + d + 1] = s / (T * (1 - p))
      end
    end
    check_nmse(dv, lutra.from_table(want, { 1, T, 1, T }), BWD_BOUND, "dropout dv")
    -- the next forward draws a fresh mask
    local next_mask, differ = mask_of(m:forward(q, v, v)), 0
    for e = 0, T * T - 1 do
      if next_mask[e] ~= mask[e] then differ = differ + 1 end
    end
    assert.is_true(differ > 0, "the next forward drew the same mask")
  end)

  test("head_dim cuDNN cannot take is refused naming it, and the module stays usable", function()
    if DEV == "cpu" then return end
    for _, D in ipairs { 60, 264 } do
      local m = nn.DotProductAttention(2, D, { dtype = "bf16", device = DEV })
      local q = lutra.tensor({ 1, 8, 2, D }, "bf16", DEV):fill(0.5)
      local msg = E.message_of(function() m:forward(q, q, q) end)
      assert.is_truthy(msg:find("head_dim " .. D, 1, true), msg)
      assert.is_truthy(msg:find("multiple of 8 up to 256", 1, true), msg)
    end
    local m = nn.DotProductAttention(2, 64, { dtype = "bf16", device = DEV })
    local q = lutra.tensor({ 1, 8, 2, 64 }, "bf16", DEV):fill(0.5)
    assert.are.same({ 1, 8, 2, 64 }, m:forward(q, q, q):dims())
  end)

  test("f32 on cuda is refused naming the dtype (cuDNN's attention takes bf16 and f16)", function()
    if DEV == "cpu" then return end
    local msg = E.message_of(function()
      local m = nn.DotProductAttention(2, 64, { dtype = "f32", device = DEV })
      local q = lutra.tensor({ 1, 8, 2, 64 }, "f32", DEV):fill(0.5)
      m:forward(q, q, q)
    end)
    assert.is_truthy(msg:find("f32", 1, true), msg)
  end)

  test("a cuDNN that LUTRA_CUDNN_PATH names and that does not load is refused, naming it", function()
    if DEV == "cpu" then return end -- the CPU has no cuDNN to miss
    -- in a process of its own: the library is looked for once per process
    local shell = require("spec.support.shell")
    local ok, out = shell.luajit_chunk([[
      local lutra = require("lutra")
      local m = lutra.nn.DotProductAttention(2, 64, { dtype = "bf16", device = "cuda" })
      local q = lutra.tensor({ 1, 8, 2, 64 }, "bf16", "cuda"):randn(1)
      local ok, err = pcall(m.forward, m, q, q, q)
      print(ok, err)
      -- a second call is refused the same way (the process looked once)
      print(pcall(m.forward, m, q, q, q))
    ]], "LUTRA_CUDNN_PATH=/nonexistent/libcudnn.so.9")
    assert.is_true(ok, out)
    assert.is_truthy(out:find("false", 1, true), out)
    assert.is_truthy(out:find("LUTRA_CUDNN_PATH=/nonexistent/libcudnn.so.9", 1, true), out)
    local _, count = out:gsub("LUTRA_CUDNN_PATH=/nonexistent", "")
    assert.are.equal(2, count, out)
  end)
end)
