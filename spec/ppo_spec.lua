-- PPO (examples/embed/ppo in C, examples/ppo.lua in Lua): its arithmetic against hand-computed
-- references and finite differences, the C pieces (examples/embed/ppo/ppo.c, loaded through the
-- FFI from a shared build of that one file) and the Lua pieces (examples/ppo/ppo_math.lua) alike;
-- the frame loop's budget slicing, its zero allocations per frame after warm-up, and short
-- training runs that repeat bit for bit under one seed and differ under another.
local ffi = require("ffi")
local sh = require("spec.support.shell").sh
local L = require("examples.ppo.ppo_math")

local FLAGS = "-std=c11 -O2 -g -Wall -Wextra -Werror -D_GNU_SOURCE -Isrc"
local function cc()
  local c = os.getenv("CC")
  return (c and c ~= "") and c or "cc"
end

ffi.cdef [[
void ppo_gae(int T, int N, const float *rewards, const float *values, const float *dones,
             const float *next_values, const float *next_dones, float gamma, float lambda,
             float *adv, float *ret);
void ppo_normalize(int M, float *adv);
float ppo_categorical_loss(int M, int K, const float *logits, const float *actions,
                           const float *old_logp, const float *adv, float clip, float ent_coef,
                           float *dlogits, void *stats);
float ppo_gaussian_loss(int M, int D, const float *mean, const float *log_std,
                        const float *actions, const float *old_logp, const float *adv, float clip,
                        float ent_coef, float *dmean, float *dlog_std, void *stats);
float ppo_value_loss(int M, const float *v, const float *old_v, const float *ret, float clip,
                     float vf_coef, float *dv, void *stats);
float ppo_categorical_logp(int K, const float *logits, int action);
]]

local function floats(values)
  local a = ffi.new("float[?]", #values)
  for i, v in ipairs(values) do a[i - 1] = v end
  return a
end

local function close(got, want, tol, what)
  assert(math.abs(got - want) <= tol,
         string.format("%s: got %.7g, want %.7g (tolerance %g)", what, got, want, tol))
end

-- the C pieces behind the Lua pieces' interface
local libpath = "build/ppo_math_spec.so"
local ok_build, build_out = sh(string.format("mkdir -p build && %s %s -fPIC -shared -o %s " ..
                                             "examples/embed/ppo/ppo.c -lm", cc(), FLAGS, libpath))
assert(ok_build, "building ppo.c failed:\n" .. build_out)
local CP = ffi.load("./" .. libpath)
local C_impl = {
  name = "C",
  gae = function(...) CP.ppo_gae(...) end,
  normalize = function(m, a) CP.ppo_normalize(m, a) end,
  categorical_loss = function(m, k, z, a, old, adv, clip, ent, dz)
    return CP.ppo_categorical_loss(m, k, z, a, old, adv, clip, ent, dz, nil)
  end,
  value_loss = function(m, v, old, ret, clip, vf, dv)
    return CP.ppo_value_loss(m, v, old, ret, clip, vf, dv, nil)
  end,
}
local L_impl = { name = "Lua", gae = L.gae, normalize = L.normalize,
                 categorical_loss = L.categorical_loss, value_loss = L.value_loss }

-- logits of M rows and per-row old log-probabilities chosen so that each row's ratio is
-- ratios[i]: the clipped objective's branches picked by construction
local function policy_case(ratios, advs, k)
  local m = #ratios
  local z, actions, old = ffi.new("float[?]", m * k), ffi.new("float[?]", m), ffi.new("float[?]", m)
  for i = 0, m - 1 do
    for j = 0, k - 1 do z[i * k + j] = math.sin(1.7 * i + 0.9 * j) end
    actions[i] = i % k
    old[i] = L.categorical_logp(k, z, i, actions[i]) - math.log(ratios[i + 1])
  end
  return m, z, actions, old, floats(advs)
end

for _, impl in ipairs({ C_impl, L_impl }) do
  describe("PPO arithmetic (" .. impl.name .. ")", function()
    it("GAE matches a hand-computed trajectory with an episode end in the middle", function()
      -- gamma 0.9, lambda 0.8; dones[2] = 1: obs[2] starts a new episode, so step 1 is terminal
      local adv, ret = ffi.new("float[4]"), ffi.new("float[4]")
      impl.gae(4, 1, floats({ 1, 2, 3, 4 }), floats({ 0.5, 1, 1.5, 2 }), floats({ 0, 0, 1, 0 }),
               floats({ 3 }), floats({ 0 }), 0.9, 0.8, adv, ret)
      -- t=3: 4 + 0.9*3 - 2 = 4.7; t=2: 3 + 0.9*2 - 1.5 + 0.72*4.7 = 6.684; t=1: 2 - 1 = 1 (no
      -- bootstrap, no carry); t=0: 1 + 0.9*1 - 0.5 + 0.72*1 = 2.12
      local want = { 2.12, 1, 6.684, 4.7 }
      local values = { 0.5, 1, 1.5, 2 }
      for t = 0, 3 do
        close(adv[t], want[t + 1], 1e-5, "adv[" .. t .. "]")
        close(ret[t], want[t + 1] + values[t + 1], 1e-5, "ret[" .. t .. "]")
      end
      -- a final done cuts the bootstrap from the next value
      impl.gae(1, 1, floats({ 1 }), floats({ 0.5 }), floats({ 0 }), floats({ 100 }), floats({ 1 }),
               0.9, 0.8, adv, ret)
      close(adv[0], 0.5, 1e-6, "adv with next_done")
    end)

    it("GAE over N envs treats each column as its own trajectory", function()
      local T, N = 5, 3
      local r, v, d = ffi.new("float[15]"), ffi.new("float[15]"), ffi.new("float[15]")
      for i = 0, T * N - 1 do
        r[i], v[i], d[i] = math.random() * 2 - 1, math.random(), math.random() < 0.3 and 1 or 0
      end
      local nv, nd = floats({ 0.3, -0.2, 0.7 }), floats({ 0, 1, 0 })
      local adv, ret = ffi.new("float[15]"), ffi.new("float[15]")
      impl.gae(T, N, r, v, d, nv, nd, 0.99, 0.95, adv, ret)
      for n = 0, N - 1 do
        local r1, v1, d1 = ffi.new("float[5]"), ffi.new("float[5]"), ffi.new("float[5]")
        for t = 0, T - 1 do r1[t], v1[t], d1[t] = r[t * N + n], v[t * N + n], d[t * N + n] end
        local a1, g1 = ffi.new("float[5]"), ffi.new("float[5]")
        impl.gae(T, 1, r1, v1, d1, floats({ nv[n] }), floats({ nd[n] }), 0.99, 0.95, a1, g1)
        for t = 0, T - 1 do close(adv[t * N + n], a1[t], 1e-6, "env " .. n .. " step " .. t) end
      end
    end)

    it("normalises advantages to mean 0 and unbiased std 1", function()
      local a = floats({ 1, 2, 3, 4, 10 })
      impl.normalize(5, a)
      local s, sq = 0, 0
      for i = 0, 4 do s = s + a[i] end
      for i = 0, 4 do sq = sq + (a[i] - s / 5) ^ 2 end
      close(s / 5, 0, 1e-6, "mean")
      close(math.sqrt(sq / 4), 1, 1e-5, "std")
    end)

    it("the clipped loss and its gradient match hand values on both branches", function()
      -- uniform logits over 2 actions: p = 0.5; old p 0.4 gives ratio 1.25, outside clip 0.2
      local z, dz, a = floats({ 0, 0 }), ffi.new("float[2]"), floats({ 0 })
      local old = floats({ math.log(0.4) })
      -- A = 2: max(-2.5, -2.4) = -2.4, the clipped constant: no gradient
      local loss = impl.categorical_loss(1, 2, z, a, old, floats({ 2 }), 0.2, 0, dz)
      close(loss, -2.4, 1e-5, "clipped loss")
      assert.are.equal(0, dz[0])
      assert.are.equal(0, dz[1])
      -- A = -2: max(2.5, 2.4) = 2.5, unclipped: d/dlogp = -A r = 2.5, d logp / dz = (0.5, -0.5)
      loss = impl.categorical_loss(1, 2, z, a, old, floats({ -2 }), 0.2, 0, dz)
      close(loss, 2.5, 1e-5, "unclipped loss")
      close(dz[0], 1.25, 1e-5, "dz0")
      close(dz[1], -1.25, 1e-5, "dz1")
      -- inside the range (old p 0.45, ratio 10/9), A = 1: loss -r, d/dz0 = -r * 0.5
      old[0] = math.log(0.45)
      loss = impl.categorical_loss(1, 2, z, a, old, floats({ 1 }), 0.2, 0, dz)
      close(loss, -10 / 9, 1e-5, "in-range loss")
      close(dz[0], -5 / 9, 1e-5, "in-range dz0")
      close(dz[1], 5 / 9, 1e-5, "in-range dz1")
    end)

    it("the entropy bonus and its gradient match the closed form", function()
      -- logits (1, 0), A = 0, ratio 1: the loss is -c H, d/dz_j = c p_j (log p_j + H)
      local z, dz, a = floats({ 1, 0 }), ffi.new("float[2]"), floats({ 0 })
      local p0 = math.exp(1) / (math.exp(1) + 1)
      local p = { p0, 1 - p0 }
      local h = -(p[1] * math.log(p[1]) + p[2] * math.log(p[2]))
      local old = floats({ math.log(p0) })
      local loss = impl.categorical_loss(1, 2, z, a, old, floats({ 0 }), 0.2, 0.1, dz)
      close(loss, -0.1 * h, 1e-6, "entropy loss")
      for j = 0, 1 do
        close(dz[j], 0.1 * p[j + 1] * (math.log(p[j + 1]) + h), 1e-6, "dz" .. j)
      end
    end)

    it("the policy loss's gradient matches finite differences on every branch", function()
      -- rows: clipped above (A > 0, no gradient), unclipped above (A < 0), clipped below
      -- (A < 0, no gradient), unclipped below (A > 0), and four inside the range
      local m, z, actions, old, adv = policy_case({ 1.3, 1.3, 0.7, 0.7, 1.05, 0.93, 1.1, 1.0 },
                                                  { 1.5, -0.8, -1.2, 0.6, 0.4, -2.0, 1.1, -0.3 }, 3)
      local dz = ffi.new("float[?]", m * 3)
      impl.categorical_loss(m, 3, z, actions, old, adv, 0.2, 0.05, dz)
      -- the clipped rows' gradient is the entropy's alone: compare with ent_coef 0
      local dz0 = ffi.new("float[?]", m * 3)
      impl.categorical_loss(m, 3, z, actions, old, adv, 0.2, 0, dz0)
      for j = 0, 2 do
        assert.are.equal(0, dz0[j])
        assert.are.equal(0, dz0[2 * 3 + j])
        assert.is_true(math.abs(dz0[3 + j]) > 1e-3 and math.abs(dz0[3 * 3 + j]) > 1e-3)
      end
      local eps = 1e-3
      for i = 0, m * 3 - 1 do
        local saved = z[i]
        z[i] = saved + eps
        local up = impl.categorical_loss(m, 3, z, actions, old, adv, 0.2, 0.05, dz0)
        z[i] = saved - eps
        local down = impl.categorical_loss(m, 3, z, actions, old, adv, 0.2, 0.05, dz0)
        z[i] = saved
        close(dz[i], (up - down) / (2 * eps), 2e-4, "d loss / d logit " .. i)
      end
    end)

    it("the value loss's gradient matches finite differences, clipped and not", function()
      -- rows: inside the clip range, and outside it above and below, the unclipped error larger
      local v, old, ret = floats({ 1.1, 2.0, 0.2 }), floats({ 1.0, 1.0, 1.0 }), floats({ 1.5, 0.5, 3.0 })
      local dv, scratch = ffi.new("float[3]"), ffi.new("float[3]")
      for _, clip in ipairs({ 0.2, 0 }) do
        local loss = impl.value_loss(3, v, old, ret, clip, 0.5, dv)
        -- by hand: (v - ret)^2 = 0.16, 2.25, 7.84; clipped: (1.1-1.5)^2 = 0.16, (1.2-0.5)^2 = 0.49,
        -- (0.8-3)^2 = 4.84; the max is the unclipped error in every row
        close(loss, 0.5 * 0.5 * (0.16 + 2.25 + 7.84) / 3, 1e-5, "value loss, clip " .. clip)
        for i = 0, 2 do
          local saved = v[i]
          v[i] = saved + 1e-3
          local up = impl.value_loss(3, v, old, ret, clip, 0.5, scratch)
          v[i] = saved - 1e-3
          local down = impl.value_loss(3, v, old, ret, clip, 0.5, scratch)
          v[i] = saved
          close(dv[i], (up - down) / 2e-3, 2e-4, "d v_loss / d v" .. i .. ", clip " .. clip)
        end
      end
      -- the clipped branch winning: v far from both old and ret on the same side
      v[0], old[0], ret[0] = 3.0, 1.0, 3.5
      impl.value_loss(1, v, old, ret, 0.2, 0.5, dv)
      -- unclipped (3 - 3.5)^2 = 0.25 < clipped (1.2 - 3.5)^2 = 5.29: constant in v
      assert.are.equal(0, dv[0])
      close(impl.value_loss(1, v, old, ret, 0.2, 0.5, dv), 0.25 * 5.29, 1e-5, "clipped value loss")
    end)
  end)
end

describe("PPO arithmetic, C and Lua together", function()
  it("give the same loss and gradients on random minibatches", function()
    local m, k = 16, 3
    local ratios, advs = {}, {}
    for i = 1, m do ratios[i], advs[i] = 0.6 + 0.8 * math.random(), math.random() * 4 - 2 end
    local _, z, actions, old, adv = policy_case(ratios, advs, k)
    local dz_c, dz_l = ffi.new("float[?]", m * k), ffi.new("float[?]", m * k)
    close(C_impl.categorical_loss(m, k, z, actions, old, adv, 0.2, 0.01, dz_c),
          L.categorical_loss(m, k, z, actions, old, adv, 0.2, 0.01, dz_l), 1e-6, "loss")
    for i = 0, m * k - 1 do close(dz_c[i], dz_l[i], 1e-6, "dz " .. i) end
  end)

  it("the C Gaussian policy loss's gradients match finite differences", function()
    local m, d = 6, 2
    local mean, ls, act = ffi.new("float[12]"), ffi.new("float[12]"), ffi.new("float[12]")
    local old, adv = ffi.new("float[6]"), ffi.new("float[6]")
    for i = 0, m * d - 1 do
      mean[i], ls[i], act[i] = math.random() - 0.5, -0.5 + 0.3 * math.random(), math.random() * 2 - 1
    end
    for i = 0, m - 1 do
      -- old log-probabilities near the current ones: ratios inside and outside the clip
      local lp = 0
      for j = 0, d - 1 do
        local zz = (act[i * d + j] - mean[i * d + j]) / math.exp(ls[i * d + j])
        lp = lp - 0.5 * zz * zz - ls[i * d + j] - 0.5 * math.log(2 * math.pi)
      end
      old[i] = lp - math.log(({ 1.3, 0.7, 1.05, 0.95, 1.3, 0.7 })[i + 1])
      adv[i] = ({ 1, -1, 0.5, -0.5, -1, 1 })[i + 1]
    end
    local dm, dls = ffi.new("float[12]"), ffi.new("float[12]")
    local s1, s2 = ffi.new("float[12]"), ffi.new("float[12]")
    CP.ppo_gaussian_loss(m, d, mean, ls, act, old, adv, 0.2, 0.01, dm, dls, nil)
    for _, which in ipairs({ { mean, dm, "mean" }, { ls, dls, "log_std" } }) do
      local x, g = which[1], which[2]
      for i = 0, m * d - 1 do
        local saved = x[i]
        x[i] = saved + 1e-3
        local up = CP.ppo_gaussian_loss(m, d, mean, ls, act, old, adv, 0.2, 0.01, s1, s2, nil)
        x[i] = saved - 1e-3
        local down = CP.ppo_gaussian_loss(m, d, mean, ls, act, old, adv, 0.2, 0.01, s1, s2, nil)
        x[i] = saved
        close(g[i], (up - down) / 2e-3, 3e-4, "d loss / d " .. which[3] .. " " .. i)
      end
    end
    -- rows 0 (A > 0, ratio 1.3) and 1 (A < 0, ratio 0.7) are clipped: only the entropy's -c/M
    for j = 0, d - 1 do
      assert.are.equal(0, dm[j])
      assert.are.equal(0, dm[d + j])
      close(dls[j], -0.01 / m, 1e-7, "clipped row's dlog_std")
    end
  end)
end)

describe("examples/embed/ppo", function()
  if not io.open("liblutra.so", "rb") then
    pending("skipped: liblutra.so is not built (make)")
    return
  end
  local exe = "build/ppo_spec"
  local built, why = sh(string.format("mkdir -p build && %s %s -o %s examples/embed/ppo/main.c " ..
                                      "examples/embed/ppo/agent.c examples/embed/ppo/ppo.c " ..
                                      "examples/embed/ppo/cartpole.c examples/embed/ppo/pendulum.c " ..
                                      "-L. -llutra -Wl,-rpath,\"$PWD\" -lm", cc(), FLAGS, exe))
  -- as README runs it, without a preloaded allocator (ASan's) that would bypass the counter
  local function run(args)
    assert(built, "building the PPO example failed:\n" .. tostring(why))
    local ok, out = sh("env -u LD_PRELOAD -u OPENBLAS_NUM_THREADS -u OMP_NUM_THREADS " ..
                       "-u LUTRA_CPU_THREADS " .. exe .. " " .. args)
    assert(ok, out)
    assert.is_nil(out:find("FAIL", 1, true), out)
    return out
  end
  local function hash(out) return assert(out:match("parameter hash: (%x+)"), out) end

  it("trains in budgeted frames with no allocation per frame after warm-up", function()
    local out = run("--updates 3 --budget-us 3000 --hash --seed 5")
    local per, total, frames, before = out:match(
      "allocations per frame: (%d+) %((%d+) heap allocations over (%d+) frames after warm%-up, (%d+) before")
    assert(per, out)
    assert.are.equal("0", total)
    assert.is_true(tonumber(frames) > 0 and tonumber(before) > 0, out)
    -- a 1 us budget runs one unit (an env step or a minibatch) per frame; 3 ms runs several
    local f1, u1 = run("--updates 2 --budget-us 1"):match("ran (%d+) frames %((%d+) work units%)")
    assert.are.equal(f1, u1)
    assert.are.equal(2 * (128 + 16), tonumber(u1))
    local f2, u2 = out:match("ran (%d+) frames %((%d+) work units%)")
    assert.is_true(tonumber(f2) < tonumber(u2) / 4, out)
  end)

  it("refuses a bad command line with its usage", function()
    assert(built, "building the PPO example failed:\n" .. tostring(why))
    for _, args in ipairs({ "--env walker", "--budget-us 0", "--updates", "--bogus 1" }) do
      local ok, out, status = sh("env -u LD_PRELOAD " .. exe .. " " .. args)
      assert.is_false(ok, args)
      assert.are.equal(2, status, args)
      assert(out:find("usage: ppo [--env cartpole|pendulum]", 1, true), out)
    end
  end)

  it("repeats bit for bit under one seed and differs under another", function()
    local a = hash(run("--updates 3 --hash --seed 5"))
    local b = hash(run("--updates 3 --hash --seed 5 --budget-us 100"))
    local c = hash(run("--updates 3 --hash --seed 6"))
    assert.are.equal(a, b) -- the frame budget changes when work runs, not what it computes
    assert.are_not.equal(a, c)
  end)

  it("learns cart-pole and runs the pendulum's Gaussian policy", function()
    local out = run("--updates 30 --every 30")
    local mean = tonumber(out:match("mean return of the last 100 episodes (%-?[%d.]+)"))
    assert(mean and mean > 35, out) -- a random policy's mean return is about 22
    out = run("--env pendulum --updates 2 --every 1 --hash")
    assert(out:find("update 2: env steps 8192", 1, true), out)
    assert(out:find("allocations per frame: 0 (0 heap allocations", 1, true), out)
  end)
end)

describe("examples/ppo.lua", function()
  local function run(args)
    local ok, out = sh("LUA_PATH='lua/?.lua;lua/?/init.lua;;' luajit examples/ppo.lua " .. args)
    assert(ok, out)
    return assert(out:match("parameter hash: (%x+)"), out), out
  end

  it("repeats bit for bit under one seed and differs under another", function()
    local a, out = run("--updates 3 --hash --seed 5")
    assert(out:find("update 3: env steps 1536", 1, true), out)
    assert.are.equal(a, (run("--updates 3 --hash --seed 5")))
    assert.are_not.equal(a, (run("--updates 3 --hash --seed 6")))
  end)

  -- setup's trace aborts aside: argparse's (the command line) and lutra.wrap's argument checks
  -- (the buffers are wrapped once, before training), which abort on a ctype now and then
  it("trains without a trace abort", function()
    local log = os.tmpname()
    local ok, out = sh("LUA_PATH='lua/?.lua;lua/?/init.lua;;' luajit -jv=" .. log ..
                       " examples/ppo.lua --updates 4")
    assert(ok, out)
    local f = assert(io.open(log))
    local trace = f:read("*a")
    f:close()
    os.remove(log)
    local aborts, traces = {}, 0
    for line in trace:gmatch("[^\n]+") do
      if line:find("^%[TRACE%s+%d+ .*ppo") then traces = traces + 1 end
      -- a root trace stopping at a loop's edge is LuaJIT forming its traces, and a C symbol
      -- met before its first call is resolved and the trace retried: not aborts
      if line:find("^%[TRACE %-%-%-") and not line:find("argparse.lua", 1, true) and
         not line:find("at wrap.lua", 1, true) and
         not line:find("leaving loop in root trace", 1, true) and
         not line:find("inner loop in root trace", 1, true) and
         not line:find("loop unroll limit reached", 1, true) and
         not line:find("symbol not in cache", 1, true) then
        aborts[#aborts + 1] = line
      end
    end
    assert.are.same({}, aborts)
    assert.is_true(traces > 5, trace)
  end)
end)
