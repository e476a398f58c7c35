-- The optimizer's learning-rate schedule, global-norm gradient clipping and weight-decay groups
-- (issue 42), on the CPU backend: the lr each step takes against a Lua reimplementation of
-- lutra/train.h's formula, clipping against a hand computation on fresh random gradients, decay
-- groups, checkpoint resume bit for bit with the settings carried by the file, and bad input.
local lutra = require("lutra")
local ffi = lutra.ffi
local nn = lutra.nn
local E = require("spec.support.errors")
local f32 = require("spec.support.f32")
local fresh = require("spec.support.fresh_random")
local st = require("spec.support.st_edit")

-- lutra/train.h's schedule in double, rounded once to f32 (base, min_lr: the f32 values)
local function lr_ref(kind, base, warmup, total, min_lr, t)
  base, min_lr = f32(base), f32(min_lr)
  local s = t - 1
  if s < warmup then return f32(base * (s + 1) / warmup) end
  if kind == "constant" then return base end
  if s >= total then return min_lr end
  local p = (s - warmup) / (total - warmup)
  local frac = kind == "cosine" and 0.5 * (1 + math.cos(math.pi * p)) or 1 - p
  return f32(min_lr + (base - min_lr) * frac)
end

-- the values of every parameter of m, flattened, and the gradients set from fresh draws
local values = require("spec.support.param_values")

local function set_grads(m, seed, std)
  for i, p in ipairs(m:parameters()) do p.grad:randn(seed + i, 0, std or 1) end
end

describe("lr schedule", function()
  for _, case in ipairs { { "cosine", 4, 10, 1e-3 }, { "linear", 3, 9, 0 },
                          { "constant", 5, 0, 0 }, { "cosine", 0, 6, 2e-4 } } do
    local kind, warmup, total, min_lr = case[1], case[2], case[3], case[4]
    it(string.format("%s warmup %d total %d: every step's lr is the formula's", kind, warmup,
                     total), function()
      -- SGD without momentum or decay, w = 0 and g = 1 before each step: the step writes -lr
      local m = nn.Linear(4, 2)
      local base = 0.1
      local opt = lutra.optim.SGD(m, { lr = base, weight_decay = 0,
                                       schedule = { kind = kind, warmup = warmup, total = total,
                                                    min_lr = min_lr } })
      local W = m:parameters()[1]
      local seen = {}
      for t = 1, math.max(total, warmup) + 4 do
        local want = lr_ref(kind, base, warmup, total, min_lr, t)
        assert.are.equal(want, opt:lr(), "opt:lr() before step " .. t)
        W.value:fill(0)
        W.grad:fill(1)
        opt:step()
        assert.are.equal(-want, W.value:to_table()[1], "the lr step " .. t .. " took")
        seen[#seen + 1] = want
      end
      -- the schedule did what its kind says at the turning points
      if warmup > 0 then assert.are.equal(f32(base / warmup), seen[1]) end
      assert.are.equal(f32(base), seen[warmup + 1])
      if kind ~= "constant" then
        assert.are.equal(f32(min_lr), seen[total + 1])
        assert.are.equal(f32(min_lr), seen[#seen])
        assert.is_true(seen[total] > f32(min_lr))
      else
        assert.are.equal(f32(base), seen[#seen])
      end
    end)
  end

  it("reaches AdamW: each step's update is that of the scheduled lr", function()
    local rng = fresh.new()
    local sched = { warmup = 2, total = 6, min_lr = 1e-4 }
    local a, b = nn.Linear(8, 4, { seed = 5 }), nn.Linear(8, 4, { seed = 5 })
    local oa = lutra.optim.AdamW(a, { lr = 1e-2, schedule = sched })
    local ob = lutra.optim.AdamW(b, { lr = 1e-2 })
    for t = 1, 8 do
      local seed = rng.int(1, 1e6)
      set_grads(a, seed)
      set_grads(b, seed)
      ob:set_lr(lr_ref("cosine", 1e-2, 2, 6, 1e-4, t)) -- the host sets what the schedule computes
      oa:step()
      ob:step()
      assert.are.same(values(b), values(a), "step " .. t .. " (seed " .. rng.seed .. ")")
    end
  end)

  it("set_lr sets the base of the schedule; set_schedule replaces it", function()
    local m = nn.Linear(4, 2)
    local opt = lutra.optim.AdamW(m, { lr = 1, schedule = { warmup = 4, total = 8 } })
    assert.are.equal(f32(0.25), opt:lr())
    opt:set_lr(2)
    assert.are.equal(f32(0.5), opt:lr())
    opt:set_schedule { kind = "constant" }
    assert.are.equal(2, opt:lr())
  end)
end)

describe("global-norm clipping", function()
  -- SGD lr 1 without decay from w = 0: the step writes -(g * factor) for every element
  local function clipped_step(max_norm, std)
    local rng = fresh.new()
    local m = nn.Sequential(nn.Linear(16, 8), nn.LayerNorm(8), nn.Linear(8, 3))
    local opt = lutra.optim.SGD(m, { lr = 1, weight_decay = 0, max_grad_norm = max_norm })
    set_grads(m, rng.int(1, 1e6), std)
    local grads, sumsq = {}, 0
    for _, p in ipairs(m:parameters()) do
      p.value:fill(0)
      for _, g in ipairs(p.grad:to_table()) do
        grads[#grads + 1] = g
        sumsq = sumsq + g * g -- f64, in the order the CPU adds
      end
    end
    opt:step()
    return grads, math.sqrt(sumsq), values(m), opt, rng.seed
  end

  it("scales every gradient by max_norm / (norm + 1e-6) when the norm is larger", function()
    local grads, norm, w, opt, seed = clipped_step(1.5, 3)
    assert.is_true(norm > 10, "the gradients' norm is above the threshold")
    -- lutra_optim_grad_norm: the f64 norm rounded to f32
    assert.is_true(math.abs(opt:grad_norm() - norm) <= 1e-6 * norm, "seed " .. seed)
    local factor = f32(f32(1.5) / f32(f32(norm) + f32(1e-6)))
    local got_sumsq = 0
    for i, g in ipairs(grads) do
      -- the CPU adds the squares in this order, so the factor is this one's bit for bit; the
      -- stated tolerance (1 f32 ulp) covers a different rounding of the sum
      local want = -f32(g * factor)
      assert.is_true(math.abs(w[i] - want) <= 1.2e-7 * math.abs(want),
                     string.format("element %d: %.9g vs %.9g (seed %d)", i, w[i], want, seed))
      got_sumsq = got_sumsq + w[i] * w[i]
    end
    -- the update's norm is max_norm (within the 1e-6 of the denominator and f32 rounding)
    assert.is_true(math.abs(math.sqrt(got_sumsq) - 1.5) <= 1e-5, "clipped norm")
  end)

  it("leaves gradients under the threshold unscaled, bit for bit", function()
    local grads, norm, w, opt = clipped_step(1e6, 1)
    assert.is_true(norm > 0 and norm < 1e6)
    assert.is_true(math.abs(opt:grad_norm() - norm) <= 1e-6 * norm)
    for i, g in ipairs(grads) do assert.are.equal(-g, w[i]) end
  end)

  it("off (0) is the unclipped step bit for bit, and computes no norm", function()
    local rng = fresh.new()
    local a, b = nn.Linear(8, 8, { seed = 2 }), nn.Linear(8, 8, { seed = 2 })
    local oa = lutra.optim.AdamW(a, { lr = 1e-2, max_grad_norm = 0 })
    local ob = lutra.optim.AdamW(b, { lr = 1e-2, max_grad_norm = math.huge })
    for _ = 1, 3 do
      local seed = rng.int(1, 1e6)
      set_grads(a, seed)
      set_grads(b, seed)
      oa:step()
      ob:step()
    end
    assert.are.same(values(a), values(b))
    assert.are.equal(0, oa:grad_norm())
    assert.is_true(ob:grad_norm() > 0) -- math.huge measures without clipping
  end)

  it("clips AdamW too: a clipped step equals the unclipped one on pre-scaled gradients",
     function()
    local rng = fresh.new()
    local a, b = nn.Linear(8, 4, { seed = 9 }), nn.Linear(8, 4, { seed = 9 })
    local oa = lutra.optim.AdamW(a, { lr = 1e-2, max_grad_norm = 0.5 })
    local ob = lutra.optim.AdamW(b, { lr = 1e-2 })
    set_grads(a, rng.int(1, 1e6), 2)
    local sumsq = 0
    for i, p in ipairs(a:parameters()) do
      local g = p.grad:to_table()
      for _, v in ipairs(g) do sumsq = sumsq + v * v end
    end
    local factor = f32(f32(0.5) / f32(f32(math.sqrt(sumsq)) + f32(1e-6)))
    for i, p in ipairs(a:parameters()) do
      local g = p.grad:to_table()
      for k, v in ipairs(g) do g[k] = f32(v * factor) end
      b:parameters()[i].grad:set(g)
    end
    oa:step()
    ob:step()
    assert.are.same(values(b), values(a), "seed " .. rng.seed)
  end)
end)

describe("weight-decay groups", function()
  local function decayed(decay)
    local m = nn.Sequential(nn.Linear(6, 4), nn.LayerNorm(4))
    local opts = { lr = 0.1, weight_decay = 0.5, decay = decay }
    local opt = lutra.optim.AdamW(m, opts)
    local before = {}
    for i, p in ipairs(m:parameters()) do
      p.value:randn(40 + i)
      p.grad:fill(0) -- zero gradients: the step is the decay alone
      before[i] = p.value:to_table()
    end
    opt:step()
    local step = f32(f32(0.1) * f32(0.5))
    local out = {}
    for i, p in ipairs(m:parameters()) do
      local after, same, shrunk = p.value:to_table(), true, true
      for k, w in ipairs(before[i]) do
        same = same and after[k] == w
        shrunk = shrunk and after[k] == f32(w - f32(step * w))
      end
      out[i] = { ndim = tonumber(p.value.ndim), same = same, shrunk = shrunk }
    end
    return out
  end

  it("matrices (AdamW's default): 2-D weights decay, biases and norm weights do not", function()
    for _, rule in ipairs { "matrices", false } do
      local r = decayed(rule or nil)
      assert.are.equal(4, #r) -- weight, bias, gamma, beta
      for i, p in ipairs(r) do
        if p.ndim >= 2 then
          assert.is_true(p.shrunk and not p.same, "parameter " .. i .. " decayed")
        else
          assert.is_true(p.same, "parameter " .. i .. " untouched")
        end
      end
    end
  end)

  it("all: every parameter decays", function()
    for i, p in ipairs(decayed("all")) do
      assert.is_true(p.shrunk and not p.same, "parameter " .. i)
    end
  end)
end)

describe("checkpoint resume with schedule and clipping", function()
  local N = 4
  local settings = { lr = 2e-2, weight_decay = 0.1, max_grad_norm = 0.8,
                     schedule = { kind = "cosine", warmup = 3, total = 2 * N, min_lr = 1e-3 } }
  local function model() return nn.Sequential(nn.Linear(8, 16, { seed = 1 }), nn.LayerNorm(16),
                                              nn.Linear(16, 4, { seed = 2 })) end
  local function run(m, opt, from, to, seed)
    for t = from, to do
      set_grads(m, seed + 100 * t, 2)
      opt:step()
    end
  end

  it("is bit-identical to a straight run, the settings coming from the file", function()
    local seed = fresh.new().int(1, 1e6)
    local ms = model()
    local os_ = lutra.optim.AdamW(ms, settings)
    run(ms, os_, 1, 2 * N, seed)

    local dir = st.tempdir()
    local path = dir .. "/ck.safetensors"
    local m1 = model()
    local o1 = lutra.optim.AdamW(m1, settings)
    run(m1, o1, 1, N, seed)
    lutra.save(path, { model = m1, optim = o1 })
    -- fresh objects with other settings: the file's schedule, clip and lr replace them
    local m2 = model()
    local o2 = lutra.optim.AdamW(m2, { lr = 1, weight_decay = 0.1, max_grad_norm = 100,
                                       schedule = { kind = "linear", warmup = 1, total = 100 } })
    lutra.load(path, { model = m2, optim = o2 })
    assert.are.equal(lr_ref("cosine", 2e-2, 3, 2 * N, 1e-3, N + 1), o2:lr())
    run(m2, o2, N + 1, 2 * N, seed)
    assert.are.same(values(ms), values(m2), "seed " .. seed)
    assert.are.equal(os_:lr(), o2:lr())

    -- control: the same file without the new keys (as older lutra wrote it) loads, and the
    -- fresh optimizer's own settings then make the run differ
    local header, data = st.split(st.read(path))
    for _, key in ipairs { "optim.schedule", "optim.warmup_steps", "optim.total_steps",
                           "optim.min_lr", "optim.max_grad_norm" } do
      local n
      header, n = header:gsub('"' .. key:gsub("%p", "%%%0") .. '":"[^"]*",?', "", 1)
      assert.are.equal(1, n, key)
    end
    header = header:gsub(",}", "}")
    local old = dir .. "/old.safetensors"
    st.write(old, st.join(header, data))
    local m3 = model()
    local o3 = lutra.optim.AdamW(m3, { lr = 1, weight_decay = 0.1, max_grad_norm = 100,
                                       schedule = { kind = "linear", warmup = 1, total = 100 } })
    lutra.load(old, { model = m3, optim = o3 })
    assert.are.equal(lr_ref("linear", 2e-2, 1, 100, 0, N + 1), o3:lr()) -- file's lr, own schedule
    run(m3, o3, N + 1, 2 * N, seed)
    assert.are_not.same(values(ms), values(m3))
    os.execute("rm -rf " .. dir)
  end)

  it("refuses a file whose schedule metadata is bad, changing nothing", function()
    local dir = st.tempdir()
    local path = dir .. "/ck.safetensors"
    local m = model()
    local o = lutra.optim.AdamW(m, settings)
    run(m, o, 1, 2, 7)
    lutra.save(path, { model = m, optim = o })
    local header, data = st.split(st.read(path))
    local before, lr_before = values(m), o:lr()
    for _, c in ipairs { { "optim.schedule", "step", "is not constant" },
                         { "optim.warmup_steps", "-1", "is not a step count" },
                         { "optim.total_steps", "2", "total_steps (2) must be >= warmup_steps" },
                         { "optim.min_lr", "nan", "optim.min_lr 'nan' must be >= 0" },
                         { "optim.max_grad_norm", "-1", "optim.max_grad_norm '-1' must be >= 0" } } do
      local bad = dir .. "/bad.safetensors"
      st.write(bad, st.join(st.set_meta(header, c[1], c[2]), data))
      E.expect_error(function() lutra.load(bad, { model = m, optim = o }) end,
                     "lutra_checkpoint_load", c[3])
      assert.are.same(before, values(m))
      assert.are.equal(lr_before, o:lr())
    end
    -- some of the settings without the others: a damaged file
    local partial = header:gsub('"optim.max_grad_norm":"[^"]*",?', "", 1):gsub(",}", "}")
    local bad = dir .. "/partial.safetensors"
    st.write(bad, st.join(partial, data))
    E.expect_error(function() lutra.load(bad, { model = m, optim = o }) end,
                   "lutra_checkpoint_load", "has optimizer settings but no optim.max_grad_norm")
    assert.are.same(before, values(m))
    os.execute("rm -rf " .. dir)
  end)
end)

describe("optimizer settings: bad input", function()
  local m = nn.Linear(4, 4)
  local cases = {
    { { schedule = { warmup = -1, total = 10 } }, "lutra_optim_new", "warmup_steps must be >= 0" },
    { { schedule = { warmup = 5, total = 3 } }, "lutra_optim_new",
      "total_steps (3) must be >= warmup_steps (5)" },
    { { schedule = { warmup = 1, total = 3, min_lr = 0 / 0 } }, "lutra_optim_new",
      "min_lr must be finite" },
    { { schedule = { warmup = 1, total = 3, min_lr = -1 } }, "lutra_optim_new",
      "min_lr must be finite and >= 0" },
    { { max_grad_norm = -1 }, "lutra_optim_new", "max_grad_norm must be >= 0" },
    { { max_grad_norm = 0 / 0 }, "lutra_optim_new", "max_grad_norm must be >= 0" },
    { { schedule = { kind = "step", total = 3 } }, "lutra.optim.AdamW", "unknown schedule kind 'step'" },
    { { schedule = { warmup = 2 } }, "lutra.optim.AdamW", "schedule.total" },
    { { schedule = { warmup = 1.5, total = 3 } }, "lutra.optim.AdamW",
      "schedule.warmup must be an integer" },
    { { schedule = { warmup = 1, total = 3, steps = 2 } }, "lutra.optim.AdamW",
      "unknown schedule option 'steps'" },
    { { schedule = 3 }, "lutra.optim.AdamW", "schedule must be a table" },
    { { decay = "biases" }, "lutra.optim.AdamW", "unknown decay rule 'biases'" },
  }
  for _, c in ipairs(cases) do
    it("refuses " .. c[3], function()
      E.expect_error(function() lutra.optim.AdamW(m, c[1]) end, c[2], c[3])
    end)
  end

  it("the setters refuse bad values and change nothing", function()
    local opt = lutra.optim.AdamW(m, { lr = 1, max_grad_norm = 1,
                                       schedule = { warmup = 4, total = 8 } })
    local lr = opt:lr()
    E.expect_error(function() opt:set_schedule { warmup = 4, total = 2 } end,
                   "lutra_optim_set_schedule", "total_steps (2) must be >= warmup_steps (4)")
    E.expect_error(function() opt:set_schedule { warmup = -3, kind = "constant" } end,
                   "lutra_optim_set_schedule", "warmup_steps must be >= 0")
    assert.are.equal(lr, opt:lr())
    E.expect_error(function() opt:set_max_grad_norm(-0.5) end, "lutra_optim_set_max_grad_norm",
                   "must be >= 0")
    E.expect_error(function() opt:set_max_grad_norm(0 / 0) end, "lutra_optim_set_max_grad_norm",
                   "must be >= 0")
    local C = lutra.C
    E.expect_error(function() E.c_check(C.lutra_optim_set_schedule(opt, nil)) end,
                   "lutra_optim_set_schedule", "schedule is NULL")
    E.expect_error(function() E.c_check(C.lutra_optim_lr(opt, nil)) end, "lutra_optim_lr",
                   "lr is NULL")
    E.expect_error(function() E.c_check(C.lutra_optim_grad_norm(opt, nil)) end,
                   "lutra_optim_grad_norm", "norm is NULL")
    local s = ffi.new("lutra_lr_schedule", { kind = 7 })
    E.expect_error(function() E.c_check(C.lutra_optim_set_schedule(opt, s)) end,
                   "lutra_optim_set_schedule", "unknown schedule kind 7")
    assert.are.equal(lr, opt:lr())
  end)
end)
