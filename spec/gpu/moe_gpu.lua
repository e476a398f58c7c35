-- MoE routing (lutra.moe) on the device under test against the CPU backend, with the same
-- inputs. Bounds:
--   bit for bit: the router's indices, the row map, m_splits, the permuted rows, the unpermute's
--     combine, the permute backward and the unpermute backward's rows (all f32 operations in
--     the CPU's order, or copies);
--   router probs and dlogits: NMSE <= 1e-12 and |diff| <= 1e-6 (f32; bf16 and f16 dlogits:
--     NMSE <= 1e-8, room for one element a 16-bit ulp apart): both compute in double and round
--     once, and differ only where CUDA's double exp differs from libm's in the last bit, which
--     the final rounding almost always absorbs (spec/native/sim_moe.cpp, on the host's exp,
--     gets the same bits);
--   dprobs: NMSE <= 1e-12 (exact products summed in double in another order, rounded once).
-- A CUDA graph of router + permute + unpermute and their backwards, replayed with new logits
-- and inputs each replay, equals eager calls bit for bit. Smoke test on a machine without a GPU:
-- LUTRA_TEST_DEVICE=cpu make test-gpu CUDA=0 (the graph case then checks that capture is
-- refused).
local lutra = require("lutra")
local S = require("spec.gpu.support")
local R = require("spec.support.moe_ref")
local moe = lutra.moe
local DEV, REF = S.DEV, S.REF
local function test(name, fn) S.test(it, name, fn) end

local function ints_pair(values, shape)
  return lutra.from_table(values, shape, "i32", REF), lutra.from_table(values, shape, "i32", DEV)
end

local function same_ints(got, want, what)
  S.assert_same_bytes(got:bytes(), want:bytes(), what, 4)
end

describe("moe router on " .. DEV, function()
  for _, c in ipairs {
    { T = 1000, E = 8, k = 2, renorm = true }, { T = 513, E = 64, k = 8, renorm = false },
    { T = 300, E = 128, k = 1, renorm = true, dtype = "bf16" },
    { T = 77, E = 4096, k = 4, renorm = false, dtype = "f16" },
    { T = 256, E = 16, k = 6, renorm = true, scale = 2.5 },
  } do
    local name = string.format("T=%d E=%d k=%d %s %s", c.T, c.E, c.k,
                               c.renorm and "renormalized" or "pre-softmax", c.dtype or "f32")
    test("forward and backward match the CPU: " .. name, function()
      local dtype = c.dtype or "f32"
      local lr, ld = S.randn_pair({ c.T, c.E }, dtype, c.T + c.E, 2)
      -- rows with exact ties too
      if c.T > 10 then
        local v = lr:to_table()
        for t = 0, c.T - 1, 7 do
          for j = 1, c.E do v[t * c.E + j] = (j % 3 == 0) and 1.25 or v[t * c.E + j] end
        end
        lr:set(v)
        ld:set(v)
      end
      local opts = { renormalize = c.renorm, scaling_factor = c.scale }
      local rr = S.hold(moe.TopK(c.E, c.k, opts))
      opts.device = DEV
      local rd = S.hold(moe.TopK(c.E, c.k, opts))
      opts.device = nil
      local pr, ir = rr:forward(lr)
      local pd, id = rd:forward(ld)
      same_ints(id, ir, "indices")
      S.assert_nmse(pd, pr, 1e-12, "probs", 1e-6)
      local gr, gd = S.randn_pair({ c.T, c.k }, "f32", 5)
      local dr, dd = rr:backward(gr), rd:backward(gd)
      S.assert_nmse(dd, dr, dtype == "f32" and 1e-12 or 1e-8, "dlogits",
                    dtype == "f32" and 1e-6 or nil)
    end)
  end
end)

describe("moe permute and unpermute on " .. DEV, function()
  for _, c in ipairs {
    { T = 4096, k = 2, E = 64, H = 256, routing = "random" },
    { T = 3000, k = 4, E = 8, H = 64, routing = "skewed", dtype = "bf16" },
    { T = 700, k = 1, E = 4096, H = 8, routing = "random" },
    { T = 1025, k = 3, E = 5, H = 5, routing = "random", dtype = "bf16" }, -- unaligned rows
    { T = 2048, k = 8, E = 32, H = 33, routing = "one", dtype = "f16" },
    { T = 9, k = 2, E = 16, H = 4, routing = "random" },
  } do
    local dtype = c.dtype or "f32"
    local name = string.format("T=%d k=%d E=%d H=%d %s routing, %s", c.T, c.k, c.E, c.H,
                               c.routing, dtype)
    test("match the CPU bit for bit: " .. name, function()
      local n = c.T * c.k
      local idx = R.random_indices(n, c.E, c.T + c.E)
      if c.routing == "skewed" then -- most slots to expert 0, some experts empty
        for s = 1, n do if s % 5 ~= 0 then idx[s] = 0 else idx[s] = idx[s] % 3 end end
      elseif c.routing == "one" then
        for s = 1, n do idx[s] = c.E - 1 end
      end
      local ir, id = ints_pair(idx, { c.T, c.k })
      local xr, xd = S.randn_pair({ c.T, c.H }, dtype, 3)
      local dr, dd = S.hold(moe.Dispatcher(c.E)), S.hold(moe.Dispatcher(c.E, { device = DEV }))
      local pr, sr = dr:permute(xr, ir)
      local pd, sd = dd:permute(xd, id)
      same_ints(sd, sr, "m_splits")
      same_ints(dd:row_map(), dr:row_map(), "row_map")
      S.assert_same_tensor(pd, pr, "permuted")
      -- the experts' output: another width than x
      local O = c.H + 3
      local er, ed = S.randn_pair({ n, O }, dtype, 4)
      local qr, qd = S.randn_pair({ c.T, c.k }, "f32", 6, 0.5)
      S.assert_same_tensor(dd:unpermute(ed, qd), dr:unpermute(er, qr), "unpermuted")
      local gr, gd = S.randn_pair({ c.T, O }, dtype, 7)
      local xer, pgr = dr:unpermute_backward(gr)
      local xed, pgd = dd:unpermute_backward(gd)
      S.assert_same_tensor(xed, xer, "dexpert_out")
      S.assert_nmse(pgd, pgr, 1e-12, "dprobs")
      local br, bd = S.randn_pair({ n, c.H }, dtype, 8)
      S.assert_same_tensor(dd:permute_backward(bd), dr:permute_backward(br), "dx")
      dd:check()
    end)
  end

  test("an out-of-range index is flagged on the device and refused on the CPU", function()
    local T, E = 64, 8
    local idx = R.random_indices(2 * T, E, 3)
    idx[77] = E
    local x = lutra.tensor({ T, 4 }, "f32", DEV):randn(1)
    local d = S.hold(moe.Dispatcher(E, { device = DEV }))
    local bad = lutra.from_table(idx, { T, 2 }, "i32", DEV)
    if DEV == "cpu" then
      local ok, err = pcall(d.permute, d, x, bad)
      assert.is_false(ok)
      assert.matches("lutra_moe_permute: ", err, 1, true)
      assert.matches("index 8 of token 38", err, 1, true)
      return
    end
    local _, splits = d:permute(x, bad) -- queued: no synchronization here
    local ok, err = pcall(d.check, d)
    assert.is_false(ok)
    assert.matches("lutra_moe_dispatch_check: an expert index", err, 1, true)
    d:check() -- the read that reported it cleared the flag
    local total = 0
    for _, v in ipairs(R.ints(splits)) do total = total + v end
    assert.are.equal(2 * T - 1, total) -- the bad slot is in no split
    assert.are.equal(-1, R.ints(d:row_map())[77])
  end)
end)

describe("moe CUDA graph on " .. DEV, function()
  if DEV ~= "cuda" then
    test("capture is refused on the " .. DEV .. " device", function()
      local ok = pcall(lutra.graph.capture, function() end, { device = DEV })
      assert.is_false(ok)
    end)
    return
  end

  test("router + permute + unpermute + backwards replayed with new logits equals eager", function()
    local T, E, k, H = 512, 16, 2, 64
    local function make()
      return { router = moe.TopK(E, k, { renormalize = false, device = DEV }),
               disp = moe.Dispatcher(E, { device = DEV }) }
    end
    local function step(m, logits, x, dy)
      local probs, idx = m.router:forward(logits)
      local xp, splits = m.disp:permute(x, idx)
      local y = m.disp:unpermute(xp, probs)
      local dxe, dprobs = m.disp:unpermute_backward(dy)
      local dx = m.disp:permute_backward(dxe)
      local dl = m.router:backward(dprobs)
      return { probs = probs, idx = idx, splits = splits, y = y, dx = dx, dl = dl }
    end
    local g_m, e_m = make(), make()
    local logits = lutra.tensor({ T, E }, "f32", DEV):randn(1)
    local x = lutra.tensor({ T, H }, "f32", DEV):randn(2)
    local dy = lutra.tensor({ T, H }, "f32", DEV):randn(3)
    local out
    local graph = lutra.graph.capture(function() out = step(g_m, logits, x, dy) end)
    local last_splits
    for replay = 1, 4 do
      logits:randn(100 + replay)
      x:randn(200 + replay)
      dy:randn(300 + replay)
      graph:replay()
      local want = step(e_m, logits, x, dy)
      for _, key in ipairs { "probs", "y", "dx", "dl" } do
        S.assert_same_tensor(out[key], want[key], string.format("replay %d: %s", replay, key))
      end
      same_ints(out.idx, want.idx, "replay " .. replay .. ": indices")
      same_ints(out.splits, want.splits, "replay " .. replay .. ": m_splits")
      local splits = out.splits:bytes()
      assert.are_not.equal(last_splits, splits, "the routing changed between replays")
      last_splits = splits
    end
    local nodes = graph:info()
    assert.is_true(nodes >= 9, "router, 4 permute kernels, unpermute and 3 backward kernels")
    -- the graph holds the router and the dispatcher: once one is freed, it refuses to replay
    g_m.disp:destroy()
    local ok, err = pcall(graph.replay, graph)
    assert.is_false(ok)
    assert.matches("MoE dispatcher this graph uses was freed", err, 1, true)
  end)
end)
