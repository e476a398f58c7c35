-- nn.RotaryEmbedding on the device against the CPU reference, bit for bit in every dtype: both
-- read the same f32 (cos, sin) table (computed in f64 on the host and uploaded), and the kernel
-- spells the CPU's f32 operations with __fmul_rn / __fsub_rn / __fadd_rn (no fused multiply-add)
-- before the same round-to-nearest-even store, so there is no tolerance (F32, BF16 and F16
-- alike; spec/rope_spec.lua bounds the CPU against an f64 rotation). Covered: bshd and sbhd,
-- rotary_dim < head_dim (pass-through copied out of place, untouched in place), interleaved
-- pairs, a position offset, T of no particular multiple, the fused in-place QKV call and its
-- inverse (v's bits untouched), a GPT-2-sized batch, and a captured training step replayed equal
-- to the same steps run eagerly. The cases take both of the kernel's paths: 4-wide (head_dim 8,
-- 16, 64, 128; rotary_dim / 2 a multiple of 4) and scalar (rotary_dim 6 and 4: r/2 of 3 and 2;
-- interleaved pairs).
local lutra = require("lutra")
local nn = lutra.nn
local S = require("spec.gpu.support")
local E = require("spec.support.errors")
local DEV, REF = S.DEV, S.REF
local function test(name, fn) S.test(it, name, fn) end

local function pair(head_dim, opts)
  local ref = S.hold(nn.RotaryEmbedding(head_dim, opts))
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.device = DEV
  return ref, S.hold(nn.RotaryEmbedding(head_dim, o))
end

local CASES = {
  { shape = { 2, 7, 3, 8 }, opts = {} },
  { shape = { 5, 3, 2, 16 }, opts = { qkv_format = "sbhd" } },
  { shape = { 1, 13, 2, 12 }, opts = { rotary_dim = 6 }, offset = 100 },
  { shape = { 9, 2, 1, 10 }, opts = { qkv_format = "sbhd", rotary_dim = 4, base = 500 },
    offset = 17 },
  { shape = { 2, 11, 2, 8 }, opts = { interleaved = true }, offset = 3000 },
  { shape = { 3, 1, 4, 128 }, opts = { rotary_dim = 64, base = 1e6 }, offset = 4095 },
}

describe("nn.RotaryEmbedding on " .. DEV .. " against the CPU", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    test(dt .. ": forward and backward bit for bit (formats, partial, interleaved, offsets)",
         function()
      for k, c in ipairs(CASES) do
        local opts = { dtype = dt }
        for key, v in pairs(c.opts) do opts[key] = v end
        local ref, dev = pair(c.shape[4], opts)
        ref:set_offset(c.offset or 0)
        dev:set_offset(c.offset or 0)
        local xr, xd = S.randn_pair(c.shape, dt, 10 + k)
        local what = string.format("%s case %d", dt, k)
        S.assert_same_tensor(dev:forward(xd), ref:forward(xr), what .. " forward")
        local dr, dd = S.randn_pair(c.shape, dt, 20 + k)
        S.assert_same_tensor(dev:backward(dd), ref:backward(dr), what .. " backward")
      end
    end)
  end

  test("a GPT-2-sized batch (B 4, T 1024, H 12, D 64), bf16, bit for bit", function()
    local ref, dev = pair(64, { dtype = "bf16", max_seq = 1024 })
    local xr, xd = S.randn_pair({ 4, 1024, 12, 64 }, "bf16", 3)
    S.assert_same_tensor(dev:forward(xd), ref:forward(xr), "forward")
    S.assert_same_tensor(dev:backward(xd), ref:backward(xr), "backward")
  end)

  for _, fmt in ipairs { "bshd", "sbhd" } do
    test("apply_qkv in place, GQA, and its inverse, bit for bit: " .. fmt, function()
      local B, T, H, G, D = 3, 37, 8, 2, 64
      local heads = H + 2 * G
      for _, dt in ipairs { "f32", "bf16" } do
        local ref, dev = pair(D, { dtype = dt, qkv_format = fmt, rotary_dim = 48 })
        ref:set_offset(5)
        dev:set_offset(5)
        local shape = fmt == "sbhd" and { T, B, heads * D } or { B, T, heads * D }
        local qr, qd = S.randn_pair(shape, dt, 31)
        ref:apply_qkv(qr, H, G)
        dev:apply_qkv(qd, H, G)
        S.assert_same_tensor(qd, qr, dt .. " " .. fmt .. " apply_qkv")
        ref:apply_qkv(qr, H, G, true)
        dev:apply_qkv(qd, H, G, true)
        S.assert_same_tensor(qd, qr, dt .. " " .. fmt .. " apply_qkv inverse")
        -- v untouched: the last third of each token's heads has the input's bits
        local orig = lutra.tensor(shape, dt, DEV):randn(31):to_table()
        local after = qd:to_table()
        for tok = 0, B * T - 1 do
          for e = (H + G) * D, heads * D - 1 do
            local i = tok * heads * D + e + 1
            assert.are.equal(orig[i], after[i], "v element " .. i)
          end
        end
      end
    end)
  end

  test("tensors on another device than the module are refused, naming the call", function()
    if DEV == "cpu" then return end
    local on_dev = nn.RotaryEmbedding(8, { device = DEV })
    E.expect_error(function() on_dev:forward(lutra.tensor({ 1, 2, 1, 8 })) end,
                   "lutra_rope_forward", "another device")
    E.expect_error(function() on_dev:apply_qkv(lutra.tensor({ 1, 2, 24 }), 1, 1) end,
                   "lutra_rope_apply_qkv", "another device")
  end)

  test("a captured training step with apply_qkv and a module forward/backward replays equal to "
       .. "eager steps, bit for bit", function()
    local B, T, H, G, D, steps = 2, 33, 4, 2, 16, 5
    local width = (H + 2 * G) * D
    local feed = S.batch_feed(steps, { B, T, width }, { B, T, width }, 50, 60)
    local function trainer()
      local t = {
        net = nn.Linear(width, width, { seed = 1, device = DEV }),
        rope = nn.RotaryEmbedding(D, { device = DEV, rotary_dim = 12 }),
        rope_q = nn.RotaryEmbedding(D, { device = DEV, qkv_format = "sbhd" }),
        q = lutra.tensor({ T, B, H, D }, "f32", DEV):randn(7),
        x = lutra.tensor({ B, T, width }, "f32", DEV),
        target = lutra.tensor({ B, T, width }, "f32", DEV),
        loss = nn.MSELoss(),
      }
      t.rope:set_offset(3)
      t.opt = lutra.optim.AdamW(t.net, { lr = 1e-2 })
      t.step = function()
        local qkv = t.rope:apply_qkv(t.net:forward(t.x), H, G)
        t.loss:forward(qkv, t.target)
        t.net:backward(t.rope:apply_qkv(t.loss:backward(), H, G, true))
        t.dq = t.rope_q:backward(t.rope_q:forward(t.q))
        t.opt:step()
      end
      return t
    end
    local eager = trainer()
    S.eager_steps(eager, steps, feed)
    if DEV == "cpu" then return end -- graphs are CUDA's
    local graphed = trainer()
    local g = S.replayed_steps(graphed, steps, feed)
    S.assert_same_params(eager, graphed, "rope step")
    assert.are.equal(eager.loss:value(), graphed.loss:value(), "last loss")
    S.assert_same_tensor(graphed.dq, eager.dq, "the module's backward in the graph")
    g:destroy()
  end)
end)
