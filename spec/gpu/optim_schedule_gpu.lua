-- The optimizer's schedule, clipping and decay groups on the device (issue 42) against the CPU
-- backend: the same lr at every step (the kernel computes it from the device step counter), the
-- gradient norm and the clipped update within a bound (the device adds the squares in another
-- order: the f64 sums differ in their last bits, the f32 clipping factor by at most an ulp), and
-- a captured step (schedule, clipping and all) replayed N times equal to N eager steps, bit for
-- bit, with more than one launch's worth of tensors too.
local lutra = require("lutra")
local nn = lutra.nn
local S = require("spec.gpu.support")
local DEV, REF, hold = S.DEV, S.REF, S.hold
local function test(name, fn) S.test(it, name, fn) end

-- every parameter's values, flattened
local values = require("spec.support.param_values")

-- the same fresh gradients into every parameter of a (on REF) and b (on DEV)
local function same_grads(a, b, seed, std)
  local pa, pb = a:parameters(), b:parameters()
  for i = 1, #pa do
    pa[i].grad:randn(seed + i, 0, std or 1)
    pb[i].grad:set(pa[i].grad:to_table())
  end
end

local function max_rel(got, want)
  local worst = 0
  for i = 1, #want do
    local d = math.abs(got[i] - want[i]) / math.max(math.abs(want[i]), 1e-30)
    if d > worst then worst = d end
  end
  return worst
end

describe("optimizer schedule and clipping on " .. DEV, function()
  for _, kind in ipairs { "cosine", "linear", "constant" } do
    test(kind .. ": every step takes the CPU's lr", function()
      -- SGD lr schedule from w = 0, g = 1: each step writes -lr
      local sched = { kind = kind, warmup = 3, total = 9, min_lr = 1e-3 }
      local a = hold(nn.Linear(4, 2, { device = REF }))
      local b = hold(nn.Linear(4, 2, { device = DEV }))
      local oa = hold(lutra.optim.SGD(a, { lr = 0.1, weight_decay = 0, schedule = sched }))
      local ob = hold(lutra.optim.SGD(b, { lr = 0.1, weight_decay = 0, schedule = sched }))
      for t = 1, 12 do
        assert.are.equal(oa:lr(), ob:lr(), "lr before step " .. t)
        for _, m in ipairs { a, b } do
          m:parameters()[1].value:fill(0)
          m:parameters()[1].grad:fill(1)
        end
        oa:step()
        ob:step()
        -- equal bits: both round the same double formula once (a device cos an ulp off in
        -- double changes the f32 only at a rounding midpoint, odds about 2^-29 a step)
        assert.are.equal(a:parameters()[1].value:to_table()[1],
                         b:parameters()[1].value:to_table()[1], "step " .. t)
      end
    end)
  end

  -- a model with more tensors than one launch packs (128): the norm adds over launches
  for _, case in ipairs { { "one launch", 2 }, { "several launches", 70 } } do
    test("clipping matches the CPU within a bound: " .. case[1], function()
      local function build(dev)
        local mods = {}
        for i = 1, case[2] do mods[i] = nn.Linear(16, 16, { seed = i, device = dev }) end
        return hold(nn.Sequential(unpack(mods)))
      end
      local a, b = build(REF), build(DEV)
      local opts = { lr = 1e-2, max_grad_norm = 0.7,
                     schedule = { warmup = 2, total = 6, min_lr = 1e-3 } }
      local oa = hold(lutra.optim.AdamW(a, opts))
      local ob = hold(lutra.optim.AdamW(b, opts))
      for step = 1, 4 do
        same_grads(a, b, 1000 * step, 2)
        oa:step()
        ob:step()
        local na, nb = oa:grad_norm(), ob:grad_norm()
        assert.is_true(na > 0.7, "the norm is above the threshold")
        -- f64 sums in two orders, each rounded to f32: within an f32 ulp or two
        assert.is_true(math.abs(na - nb) <= 2.4e-7 * na, string.format("norm %.9g vs %.9g", na, nb))
      end
      -- a clipping factor an ulp apart moves an AdamW update far less than it: bound the
      -- difference of the weights by the lr times 1e-4
      local va, vb = values(a), values(b)
      local worst = 0
      for i = 1, #va do worst = math.max(worst, math.abs(va[i] - vb[i])) end
      S.note("clipping %s: max |cpu - %s| = %g", case[1], DEV, worst)
      assert.is_true(worst <= 1e-6, "max weight difference " .. worst)
    end)
  end

  test("SGD clipping: the update is -(g * factor) as the CPU's within an ulp", function()
    local a = hold(nn.Sequential(nn.Linear(32, 16, { device = REF }), nn.LayerNorm(16, { device = REF })))
    local b = hold(nn.Sequential(nn.Linear(32, 16, { device = DEV }), nn.LayerNorm(16, { device = DEV })))
    local oa = hold(lutra.optim.SGD(a, { lr = 1, weight_decay = 0, max_grad_norm = 1 }))
    local ob = hold(lutra.optim.SGD(b, { lr = 1, weight_decay = 0, max_grad_norm = 1 }))
    for _, m in ipairs { a, b } do
      for _, p in ipairs(m:parameters()) do p.value:fill(0) end
    end
    same_grads(a, b, 77, 3)
    oa:step()
    ob:step()
    local worst = max_rel(values(b), values(a))
    assert.is_true(worst <= 2.4e-7, "max relative difference " .. worst)
  end)

  test("decay groups: the device decays what the CPU decays, bit for bit", function()
    for _, rule in ipairs { "matrices", "all" } do
      local a = hold(nn.Sequential(nn.Linear(8, 8, { seed = 3, device = REF }),
                                   nn.LayerNorm(8, { device = REF })))
      local b = hold(nn.Sequential(nn.Linear(8, 8, { seed = 3, device = DEV }),
                                   nn.LayerNorm(8, { device = DEV })))
      local oa = hold(lutra.optim.AdamW(a, { lr = 0.1, weight_decay = 0.5, decay = rule }))
      local ob = hold(lutra.optim.AdamW(b, { lr = 0.1, weight_decay = 0.5, decay = rule }))
      local pa, pb = a:parameters(), b:parameters()
      for i = 1, #pa do
        pa[i].value:randn(50 + i)
        pb[i].value:set(pa[i].value:to_table())
      end
      same_grads(a, b, 9)
      oa:step()
      ob:step()
      for i = 1, #pa do
        assert.are.equal(pa[i].value:bytes(), pb[i].value:bytes(), rule .. ": parameter " .. i)
      end
    end
  end)

  if DEV ~= "cuda" then return end

  local B, IN, H, OUT = 32, 48, 64, 16
  local function trainer(optim, many)
    local t = {}
    local mods = { nn.Linear(IN, H, { seed = 1, device = DEV }), nn.GELU() }
    for i = 1, many or 1 do
      mods[#mods + 1] = nn.Linear(H, H, { seed = 1 + i, device = DEV })
      mods[#mods + 1] = nn.LayerNorm(H, { device = DEV })
    end
    mods[#mods + 1] = nn.Linear(H, OUT, { seed = 99, device = DEV })
    t.net = hold(nn.Sequential(unpack(mods)))
    t.loss = hold(nn.MSELoss())
    local sched = { warmup = 2, total = 7, min_lr = 1e-4 }
    t.opt = hold(optim == "adamw"
                 and lutra.optim.AdamW(t.net, { lr = 3e-3, weight_decay = 0.1,
                                                max_grad_norm = 0.05, schedule = sched })
                 or lutra.optim.SGD(t.net, { lr = 3e-2, momentum = 0.9, max_grad_norm = 0.05,
                                             schedule = sched }))
    t.x = lutra.tensor({ B, IN }, "f32", DEV)
    t.target = lutra.tensor({ B, OUT }, "f32", DEV)
    t.step = S.training_step(t)
    return t
  end

  for _, case in ipairs { { "AdamW", "adamw" }, { "SGD momentum", "sgd" },
                          { "AdamW, several launches", "adamw", 70 } } do
    test(case[1] .. " with schedule and clipping: N replays equal N eager steps, bit for bit",
         function()
      local N = 9 -- past the schedule's end (total 7)
      local feed = S.batch_feed(N, { B, IN }, { B, OUT }, 700, 800)
      local eager = trainer(case[2], case[3])
      local graphed = trainer(case[2], case[3])
      S.eager_steps(eager, N, feed)
      local g = S.replayed_steps(graphed, N, feed)
      S.assert_same_params(eager, graphed, case[1])
      assert.are.equal(eager.opt:grad_norm(), graphed.opt:grad_norm(), "last norm")
      assert.is_true(eager.opt:grad_norm() > 0.05, "the steps were clipped")
      -- the lr read from the device's count: the replays advanced it
      assert.are.equal(eager.opt:lr(), graphed.opt:lr(), "next lr")
      assert.are.same({ N, N }, { eager.opt:steps() })
      assert.are.same({ 2, N }, { graphed.opt:steps() })
      g:destroy()
    end)
  end
end)
