-- nn.MoEMLP (the mixture-of-experts feed-forward) on the device in bf16 against the CPU module
-- in f32 with the same weights (the device's bf16 weights copied to the CPU as f32), and CUDA
-- graph replay against eager calls. Bounds and why:
--   * every expert chosen (top_k = experts): the routing cannot differ, so y and dx must be
--     within NMSE 1e-3 and every parameter's gradient within 1e-2 (each bf16 tensor the chain
--     writes, norm output, logits, expert hidden, is rounded to 2^-9 relative, NMSE ~1e-6
--     each; the gated and softmax backwards and the sums over tokens of the weight gradients
--     multiply that by cancellation, as in spec/gpu/transformer_gpu.lua);
--   * top 2 of 8: a token whose logits are within a bf16 rounding of a tie may pick another
--     expert on the device than in f32 (a different output for that token, not an error), so
--     the tokens whose chosen set is the CPU's are compared (y and dx rows: NMSE 1e-3) and at
--     most 5% may have another set (a near-tie within 2^-8 of the logits' spread: ~1% of
--     tokens at these shapes);
--   * under an FP8 autocast (current scaling) the router stays in bf16: the routing equals the
--     high-precision forward's bit for bit, and y is within NMSE 5e-2 of it (E4M3 inputs and
--     weights: 2^-4 relative per element, ~3e-3 NMSE per GEMM, two GEMMs);
--   * a captured forward + backward replays on new inputs to the eager step's y and dx bits
--     (every kernel in it is deterministic), its parameter gradients within NMSE 1e-6.
-- Smoke test without a GPU: LUTRA_TEST_DEVICE=cpu (the graph case is skipped there).
local lutra = require("lutra")
local nn = lutra.nn
local S = require("spec.gpu.support")
local DEV, REF = S.DEV, S.REF
local function test(name, fn) S.test(it, name, fn) end

local SEED, seed = S.clock_seeds()
local function check_nmse(got, want, bound, what)
  return S.check_nmse(got, want, bound, what, SEED)
end
-- a bf16 input on DEV and its exact f32 copy on the CPU
local function input_pair(shape) return S.bf16_pair(shape, seed()) end

local function module(c, dtype, device, s)
  return nn.MoEMLP(c.hidden, c.ffn, c.E, c.k, { normalization = c.norm, activation = c.act,
                                                dtype = dtype, device = device, seed = s })
end

-- the bf16 module on DEV and the f32 one on the CPU with its weights
local function pair(c)
  local s = seed()
  local dev, ref = module(c, "bf16", DEV, s), module(c, "f32", REF, s)
  local rp = ref:parameters()
  for i, p in ipairs(dev:parameters()) do rp[i].value:set(p.value:read()) end
  return dev, ref
end

-- per token, its chosen experts as a sorted key
local function chosen_sets(m, k)
  local _, idx = m:routing()
  local v, sets = idx:to_table(), {}
  for t = 0, #v / k - 1 do
    local row = {}
    for i = 1, k do row[i] = v[t * k + i] end
    table.sort(row)
    sets[t + 1] = table.concat(row, ",")
  end
  return sets
end

-- NMSE of the rows where keep[row] over [rows, cols] tensors
local function rows_nmse(got, want, keep, cols, bound, what)
  local g, w = got:to_table(), want:to_table()
  local err, norm = 0, 0
  for r, ok in ipairs(keep) do
    if ok then
      for j = (r - 1) * cols + 1, r * cols do
        err, norm = err + (g[j] - w[j]) ^ 2, norm + w[j] ^ 2
      end
    end
  end
  local e = err / math.max(norm, 1e-30)
  S.note("NMSE %.3e (bound %.0e) over the rows routed alike  %s", e, bound, what)
  if not (e <= bound) then S.fail("%s: NMSE %.3e > %.0e (seed %d)", what, e, bound, SEED) end
end

local DENSE = { hidden = 256, ffn = 512, E = 4, k = 4, shape = { 2, 64, 256 } }
local SPARSE = { hidden = 256, ffn = 256, E = 8, k = 2, shape = { 4, 32, 256 }, norm = "RMSNorm",
                 act = "swiglu" }

describe("nn.MoEMLP on " .. DEV .. " against the CPU in f32", function()
  test("every expert chosen: y, dx and the parameters' gradients within their bounds", function()
    local dev, ref = pair(DENSE)
    local xr, xd = input_pair(DENSE.shape)
    local dr, dd = input_pair(DENSE.shape)
    check_nmse(dev:forward(xd), ref:forward(xr), 1e-3, "y")
    check_nmse(dev:backward(dd), ref:backward(dr), 1e-3, "dx")
    local rp = ref:parameters()
    for i, p in ipairs(dev:parameters()) do
      check_nmse(p.grad, rp[i].grad, 1e-2, "parameter " .. i .. "'s gradient")
    end
  end)

  test("top 2 of 8: tokens routed alike give y and dx within the bound, few route otherwise", function()
    local c = SPARSE
    local dev, ref = pair(c)
    local xr, xd = input_pair(c.shape)
    local dr, dd = input_pair(c.shape)
    local yd, yr = dev:forward(xd), ref:forward(xr)
    local sd, sr = chosen_sets(dev, c.k), chosen_sets(ref, c.k)
    local keep, other = {}, 0
    for t = 1, #sr do
      keep[t] = sd[t] == sr[t]
      if not keep[t] then other = other + 1 end
    end
    S.note("%d of %d tokens chose other experts on %s", other, #sr, DEV)
    if other > 0.05 * #sr then
      S.fail("%d of %d tokens chose other experts (more than 5%%; seed %d)", other, #sr, SEED)
    end
    rows_nmse(yd, yr, keep, c.hidden, 1e-3, "y")
    rows_nmse(dev:backward(dd), ref:backward(dr), keep, c.hidden, 1e-3, "dx")
  end)

  test("under an FP8 autocast the experts run FP8 and the router stays high precision", function()
    local c = SPARSE
    local s = seed()
    local hp, fp8 = module(c, "bf16", DEV, s), module(c, "bf16", DEV, s)
    local _, x = input_pair(c.shape)
    local _, dy = input_pair(c.shape)
    local want = hp:forward(x)
    local want_probs, want_idx = hp:routing()
    local scope = lutra.autocast { recipe = lutra.recipe.current() }
    scope:enter()
    local ok, y, dx = pcall(function() return fp8:forward(x), fp8:backward(dy) end)
    scope:exit() -- also after an error: later specs must not run inside it
    assert(ok, y)
    local probs, idx = fp8:routing()
    assert.are.equal(want_idx:bytes(), idx:bytes(), "the routing changed under autocast")
    assert.are.equal(want_probs:bytes(), probs:bytes(), "the probabilities changed under autocast")
    assert.are_not.equal(want:bytes(), y:bytes(), "the experts did not run FP8")
    check_nmse(y, want, 5e-2, "FP8 y against bf16")
    check_nmse(dx, hp:backward(dy), 5e-2, "FP8 dx against bf16")
  end)

  test("a captured forward + backward replays to the eager step's bits", function()
    if DEV == "cpu" then return end -- CUDA graphs need cuda
    local c, s = SPARSE, seed()
    local graphed, eager = module(c, "bf16", DEV, s), module(c, "bf16", DEV, s)
    local _, x = input_pair(c.shape)
    local _, dy = input_pair(c.shape)
    local y, dx
    local g = lutra.graph.capture(function()
      y = graphed:forward(x)
      dx = graphed:backward(dy)
    end, { warmup = 1 })
    local gp, ep = graphed:parameters(), eager:parameters()
    for round = 1, 2 do
      local _, fx = input_pair(c.shape)
      local _, fdy = input_pair(c.shape)
      x:copy(fx)
      dy:copy(fdy)
      g:replay()
      assert.are.equal(eager:forward(fx):bytes(), y:bytes(), "replay " .. round .. ": y differs")
      assert.are.equal(eager:backward(fdy):bytes(), dx:bytes(), "replay " .. round .. ": dx differs")
      for i = 1, #gp do
        check_nmse(gp[i].grad, ep[i].grad, 1e-6, "replay " .. round .. ": parameter " .. i)
      end
    end
    g:destroy()
  end)
end)
