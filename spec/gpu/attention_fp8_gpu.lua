-- FP8 attention (nn.DotProductAttention {fp8 = true}, cuDNN's sdpa_fp8 and sdpa_fp8_backward
-- through src/backend/cuda/attention_cudnn_fp8.cpp) on the device, inside an autocast scope of a
-- delayed-scaling recipe, against three references on the same bf16-representable inputs (each
-- drawn fresh; the seed is named in failures):
--   the CPU module in f32 (exact softmax, f64 sums), bounds as NMSE = sum (got - ref)^2 /
--     sum ref^2:
--     forward 1e-2: q, k, v, the softmax probabilities and O are each rounded once to E4M3 (3
--       mantissa bits: about 5.6e-4 of NMSE per rounding of values spread over a binade), about
--       3e-3 in all (the CPU's emulation measures that), and the bf16 output adds 2^-9 roundings
--       (1e-6); a margin of 3 that any wrong scale (a factor 2 is an NMSE of 0.25 or more),
--       stale descale, mask or head mapping exceeds;
--     backward 4e-2: dO and dS = P (dP - D) are rounded to E5M2 (2 mantissa bits, about 2.2e-3
--       each; dS's relative error enlarged where dP is near D), dq, dk, dv once more, on top of
--       the forward's: about 1e-2 in the CPU's emulation, a margin of 4;
--   the device's bf16 path (cuDNN's BF16 flash attention, within 1e-4 / 1e-3 of f32:
--     spec/gpu/attention_gpu.lua): the same bounds (the triangle inequality, with room);
--   the CPU's FP8 emulation (src/backend/cpu/attention_fp8_cpu.c, the same codes in, the same
--     scales): forward 5e-3, backward 3e-2 (each side about 1e-2 from f32, and where their dS
--     roundings flip apart the two errors add: the hybrid recipe's dq was seen 2.1e-2 from the
--     emulation, seed 1796543785, a step whose dq was within bounds of f32). Not bit for bit: cuDNN's flash kernels sum in f32 in
--     their own order (an FP8 rounding flips where a value sits near a boundary) and may round at
--     other points than cudnn-frontend's reference graph the emulation follows (e.g. the
--     unnormalized exp(s - running max) rather than P), of the same size: at most about two
--     E4M3 roundings forward, two E5M2 roundings backward (a failure here beside passes above
--     says cuDNN rounds where the emulation does not: the emulation is what to revisit).
-- Scales: every step updates all six through the scope (forward at its exit, backward when the
-- module, the first of the forward, finishes its backward); QKV's and dO's amaxes are the
-- casts' exact max |x|, so their scales equal the CPU emulation's to f32 rounding; S's (causal:
-- row 0's single weight is 1) and the others within an FP8 rounding of the amaxes.
-- The packed input (the module protocol) against q, k, v: NMSE 1e-3 (other strides, maybe
-- another kernel). A captured step (scope, forward, backward, the scale updates) replayed on new
-- inputs equals an eager module's step: the output bit for bit, the gradients too where the plan
-- is deterministic (else NMSE 1e-3: an FP8 rounding flipped by another summation order).
-- FP8 shapes: head_dim 128 (cuDNN's FP8 backward on Hopper); sm_90 or newer.
local lutra = require("lutra")
local nn, R = lutra.nn, lutra.recipe
local S = require("spec.gpu.support")
local E = require("spec.support.errors")
local P = require("spec.support.qkv_packing")
local DEV, REF = S.DEV, S.REF
local function test(name, fn) S.test(it, name, fn) end

local FWD_F32, BWD_F32 = 1e-2, 4e-2
local FWD_EMU, BWD_EMU = 5e-3, 3e-2
local fresh = require("spec.support.fresh_random").new()
local SEED = fresh.seed
local function seed() return fresh.int(1, 2 ^ 30) end

-- a fresh bf16-representable random tensor: its f32 copy on the CPU and its bf16 copy on DEV
local function input_pair(shape)
  local rounded = lutra.tensor(shape, "bf16", REF):randn(seed())
  local ref = lutra.tensor(shape, "f32", REF):copy(rounded)
  return ref, lutra.tensor(shape, "bf16", DEV):set(ref:read())
end

local function check_nmse(got, want, bound, what) S.check_nmse(got, want, bound, what, SEED) end

-- one training step: the forward inside scope, the backward after its exit
local function step(m, scope, q, k, v, dout)
  scope:enter()
  local ok, out = pcall(m.forward, m, q, k, v)
  scope:exit()
  if not ok then error(out, 0) end
  return { out, m:backward(dout) }
end

local NAMES = { "out", "dq", "dk", "dv" }

local function describe_case(c)
  return string.format("B %d T %d H %d Hkv %d D 128%s, %s", c.B, c.T, c.H, c.Hkv,
                       c.causal and " causal" or "", c.format)
end

-- steps of the device's FP8 module against the CPU in f32, the device's bf16 path and the CPU's
-- FP8 emulation, each side in a scope of its own (one scope holds the metas of one device)
local function compare(c)
  local what = describe_case(c)
  local function opts(extra)
    local o = { num_gqa_groups = c.Hkv, attn_mask_type = c.causal and "causal" or "no_mask" }
    for key, val in pairs(extra) do o[key] = val end
    return o
  end
  local dev = S.hold(nn.DotProductAttention(c.H, 128, opts { fp8 = true, dtype = "bf16",
                                                             device = DEV }))
  local bf16 = S.hold(nn.DotProductAttention(c.H, 128, opts { dtype = "bf16", device = DEV }))
  local emu = S.hold(nn.DotProductAttention(c.H, 128, opts { fp8 = true }))
  local ref = S.hold(nn.DotProductAttention(c.H, 128, opts {}))
  local recipe = function() return R.delayed { fp8_format = c.format, amax_history_len = 4 } end
  local dev_scope, emu_scope = lutra.autocast { recipe = recipe() },
                               lutra.autocast { recipe = recipe() }
  for s = 1, 3 do
    local qr, qd = input_pair({ c.B, c.T, c.H, 128 })
    local kr, kd = input_pair({ c.B, c.T, c.Hkv, 128 })
    local vr, vd = input_pair({ c.B, c.T, c.Hkv, 128 })
    local dr, dd = input_pair({ c.B, c.T, c.H, 128 })
    local got = step(dev, dev_scope, qd, kd, vd, dd)
    assert.is_true(dev:fp8_state().last_fp8, what .. ": the forward ran FP8")
    assert.are.equal("bf16", got[1]:dtype_name(), what .. ": output dtype")
    local plain = { bf16:forward(qd, kd, vd), bf16:backward(dd) }
    local emulated = step(emu, emu_scope, qr, kr, vr, dr)
    local exact = { ref:forward(qr, kr, vr), ref:backward(dr) }
    for i, name in ipairs(NAMES) do
      local label = string.format("%s step %d: %s", what, s, name)
      local f32_bound = i == 1 and FWD_F32 or BWD_F32
      check_nmse(got[i], exact[i], f32_bound, label .. " against f32")
      check_nmse(got[i], plain[i], f32_bound, label .. " against the bf16 path")
      check_nmse(got[i], emulated[i], i == 1 and FWD_EMU or BWD_EMU, label .. " against the emulation")
    end
    -- the scales after the step's updates
    local sd, se = dev:fp8_state(), emu:fp8_state()
    for name, want in pairs(se.scales) do
      local have = sd.scales[name]
      local tol = (name == "qkv" or name == "do") and 1e-6 or (name == "s" or name == "o") and 2 ^ -3
                  or 2 ^ -2
      if not (math.abs(have - want) <= tol * want) then
        S.fail("%s step %d: scale of %s %.6g, the emulation's %.6g (seed %d)", what, s, name, have,
               want, SEED)
      end
      assert.is_true(have ~= 1, string.format("%s step %d: %s's scale was never updated", what, s,
                                              name))
    end
  end
end

local CASES = {
  { B = 2, T = 128, H = 4, Hkv = 4, causal = true, format = "hybrid" },
  { B = 2, T = 200, H = 8, Hkv = 2, causal = true, format = "hybrid" }, -- GQA, T not a tile multiple
  { B = 1, T = 256, H = 4, Hkv = 1, causal = true, format = "e4m3" },   -- MQA, E4M3 gradients
}

describe("nn.DotProductAttention {fp8 = true} on " .. DEV .. " (delayed scaling)", function()
  for _, c in ipairs(CASES) do
    test(describe_case(c) .. ": three steps within their bounds of f32, bf16 and the emulation",
         function() compare(c) end)
  end

  test("the module protocol: forward(qkv) packed matches forward(q, k, v), dqkv the three",
       function()
    local B, T, H, Hkv = 2, 128, 4, 2
    local W = (H + 2 * Hkv) * 128
    local o = { num_gqa_groups = Hkv, fp8 = true, dtype = "bf16", device = DEV }
    local m, mp = S.hold(nn.DotProductAttention(H, 128, o)), S.hold(nn.DotProductAttention(H, 128, o))
    local sa, sb = lutra.autocast { recipe = R.delayed() }, lutra.autocast { recipe = R.delayed() }
    for _ = 1, 2 do
      local xr, xd = input_pair({ B, T, W })
      local dr, dd = input_pair({ B, T, H * 128 })
      local widths = { H * 128, Hkv * 128, Hkv * 128 }
      local parts = P.split(xr:to_table(), widths, B * T)
      local q = lutra.from_table(parts[1], { B, T, H, 128 }, "bf16", DEV)
      local k = lutra.from_table(parts[2], { B, T, Hkv, 128 }, "bf16", DEV)
      local v = lutra.from_table(parts[3], { B, T, Hkv, 128 }, "bf16", DEV)
      local g = step(m, sa, q, k, v, lutra.from_table(dr:to_table(), { B, T, H, 128 }, "bf16", DEV))
      sb:enter()
      local ok, out = pcall(mp.forward, mp, xd)
      sb:exit()
      assert(ok, out)
      -- other strides may take cuDNN to another kernel (its sums in another order): an FP8
      -- rounding may flip, a wrong offset of k or v would be an NMSE near 1
      check_nmse(lutra.from_table(out:to_table()), lutra.from_table(g[1]:to_table()), 1e-3, "out")
      local dx = P.split(mp:backward(dd):to_table(), widths, B * T)
      for i, name in ipairs { "dq", "dk", "dv" } do
        check_nmse(lutra.from_table(dx[i]), lutra.from_table(g[i + 1]:to_table()), 1e-3,
                   name .. " in dqkv")
      end
    end
  end)

  test("a captured step (scope, forward, backward, scale updates) replays equal to eager",
       function()
    if DEV == "cpu" then return end -- CUDA graphs need cuda
    local B, T, H, Hkv = 2, 128, 4, 2
    local o = { num_gqa_groups = Hkv, fp8 = true, dtype = "bf16", device = DEV }
    local graphed = S.hold(nn.DotProductAttention(H, 128, o))
    local eager = S.hold(nn.DotProductAttention(H, 128, o))
    local gs = lutra.autocast { recipe = R.delayed { amax_history_len = 4 } }
    local es = lutra.autocast { recipe = R.delayed { amax_history_len = 4 } }
    local shapes = { { B, T, H, 128 }, { B, T, Hkv, 128 }, { B, T, Hkv, 128 }, { B, T, H, 128 } }
    local inputs = {}
    for i, s in ipairs(shapes) do
      local _, t = input_pair(s)
      inputs[i] = t
    end
    local outs
    local g = lutra.graph.capture(function()
      outs = step(graphed, gs, inputs[1], inputs[2], inputs[3], inputs[4])
    end, { warmup = 1 })
    step(eager, es, inputs[1], inputs[2], inputs[3], inputs[4]) -- what the warm-up step did
    local _, deterministic = graphed:plans()
    for round = 1, 3 do
      local fresh = {}
      for i, s in ipairs(shapes) do
        local _, t = input_pair(s)
        inputs[i]:copy(t)
        fresh[i] = t
      end
      g:replay()
      local want = step(eager, es, fresh[1], fresh[2], fresh[3], fresh[4])
      S.assert_replay(outs, want, NAMES, function(i) return i == 1 or deterministic end, 1e-3,
                      "replay " .. round, SEED)
      local sg, se = graphed:fp8_state(), eager:fp8_state()
      for name, want_scale in pairs(se.scales) do
        local tol = deterministic and 0 or 1e-5
        assert.is_true(math.abs(sg.scales[name] - want_scale) <= tol * want_scale,
                       string.format("replay %d: scale of %s %.9g, eager %.9g", round, name,
                                     sg.scales[name], want_scale))
      end
    end
    g:destroy()
  end)

  test("head_dim other than 128 and dropout are refused at construction", function()
    for _, case in ipairs { { 64, {} }, { 128, { dropout = 0.1 } } } do
      local o = { fp8 = true, dtype = "bf16", device = DEV }
      for key, val in pairs(case[2]) do o[key] = val end
      local msg = E.message_of(function() nn.DotProductAttention(2, case[1], o) end)
      assert.is_truthy(msg:find("fp8 attention", 1, true), msg)
    end
  end)
end)
