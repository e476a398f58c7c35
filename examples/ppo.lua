-- PPO on cart-pole from Lua: the agent of examples/embed/ppo (CleanRL ppo.py's hyper-parameters:
-- 4 envs x 128 steps, 4 minibatches x 4 epochs, AdamW lr 2.5e-4 annealed, eps 1e-5, gradient
-- norm clipped at 0.5, clip 0.2, entropy 0.01, value 0.5, clipped value loss, observation
-- normalisation), with actor and critic MLPs (Linear + Tanh, 64-64) as lutra modules and the
-- environment (gym's CartPole-v1 dynamics, 500-step cap) written in Lua.
--   luajit examples/ppo.lua [--seed 1] [--steps 500000] [--updates N] [--until-solved]
--                           [--every 10] [--hash]
-- Solved: a mean return of 475 or more over the last 100 episodes. PPO's arithmetic (GAE, the
-- clipped loss and its gradient) is examples/ppo/ppo_math.lua, which spec/ppo_spec.lua checks.
local lutra = require("lutra")
local ffi = require("ffi")
local nn = lutra.nn

local dir = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = dir .. "/?.lua;" .. package.path
local P = require("ppo.ppo_math")

local function parse(argv)
  local argparse = require("lutra.cli").argparse("ppo.lua")
  local p = argparse("ppo.lua", "PPO on cart-pole with lutra modules.")
  p:option("--seed", "seed of the networks, the environments and the sampling", "1", tonumber)
  p:option("--steps", "env steps of the run (the lr anneals to 0 over them)", "500000", tonumber)
  p:option("--updates", "stop after this many updates (0: the run's)", "0", tonumber)
  p:flag("--until-solved", "stop once solved; exit 1 if the run ends unsolved")
  p:option("--every", "print the return curve every N updates", "10", tonumber)
  p:flag("--hash", "print a hash of the parameters at the end")
  return p:parse(argv)
end
local opt = parse(arg)

local N, T, MINIBATCHES, EPOCHS, HIDDEN = 4, 128, 4, 4, 64
local LR, GAMMA, LAMBDA, CLIP, ENT, VF, MAX_NORM = 2.5e-4, 0.99, 0.95, 0.2, 0.01, 0.5, 0.5
local OBS, ACTIONS, THRESHOLD, RECENT = 4, 2, 475, 100
local B = N * T
local MB = B / MINIBATCHES
local num_updates = math.floor(opt.steps / B)
local last_update = opt.updates > 0 and opt.updates or num_updates
math.randomseed(opt.seed)

-- ---- cart-pole (gym's CartPole-v1), N copies, reset in place when an episode ends ----
local GRAVITY, MASS_CART, MASS_POLE, HALF_LENGTH, FORCE, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
local TOTAL_MASS, POLE_ML = MASS_CART + MASS_POLE, MASS_POLE * HALF_LENGTH
local X_LIMIT, THETA_LIMIT = 2.4, 12 * 2 * math.pi / 360
local state, steps, ep_return = {}, {}, {}
local recent, episodes = ffi.new("float[?]", RECENT), 0

local function spawn(n, obs)
  local s = state[n]
  for k = 1, 4 do
    s[k] = -0.05 + 0.1 * math.random()
    obs[n * OBS + k - 1] = s[k]
  end
  steps[n], ep_return[n] = 0, 0
end

local function env_step(actions, obs, rewards, dones)
  for n = 0, N - 1 do
    local s = state[n]
    local x, x_dot, theta, theta_dot = s[1], s[2], s[3], s[4]
    local force = actions[n] >= 0.5 and FORCE or -FORCE
    local c, sn = math.cos(theta), math.sin(theta)
    local temp = (force + POLE_ML * theta_dot * theta_dot * sn) / TOTAL_MASS
    local theta_acc = (GRAVITY * sn - c * temp) /
                      (HALF_LENGTH * (4 / 3 - MASS_POLE * c * c / TOTAL_MASS))
    local x_acc = temp - POLE_ML * theta_acc * c / TOTAL_MASS
    s[1], s[2] = x + TAU * x_dot, x_dot + TAU * x_acc
    s[3], s[4] = theta + TAU * theta_dot, theta_dot + TAU * theta_acc
    steps[n], ep_return[n] = steps[n] + 1, ep_return[n] + 1
    local done = s[1] < -X_LIMIT or s[1] > X_LIMIT or s[3] < -THETA_LIMIT or s[3] > THETA_LIMIT
                 or steps[n] >= 500
    rewards[n], dones[n] = 1, done and 1 or 0
    if done then
      recent[episodes % RECENT] = ep_return[n]
      episodes = episodes + 1
      spawn(n, obs)
    else
      for k = 1, 4 do obs[n * OBS + k - 1] = s[k] end
    end
  end
end

local function recent_mean()
  local count = math.min(episodes, RECENT)
  local s = 0
  for i = 0, count - 1 do s = s + recent[i] end
  return count > 0 and s / count or 0
end

-- ---- the networks: the actor's last layer scaled by 0.01 (a near-uniform first policy) ----
local function mlp(out, seed, last_scale)
  local net = nn.Sequential(nn.Linear(OBS, HIDDEN, { seed = seed }), nn.Tanh(),
                            nn.Linear(HIDDEN, HIDDEN, { seed = seed + 1 }), nn.Tanh(),
                            nn.Linear(HIDDEN, out, { seed = seed + 2 }))
  local params = net:parameters()
  params[5].value:scale_(last_scale)
  params[6].value:fill(0)
  return net
end
local actor = mlp(ACTIONS, opt.seed * 1000 + 1, 0.01)
local critic = mlp(1, opt.seed * 1000 + 11, 1.0)
local both = nn.Sequential(actor, critic) -- for the optimizer: both networks' parameters
local optim = lutra.optim.AdamW(both, { lr = LR, eps = 1e-5, weight_decay = 0,
                                         max_grad_norm = MAX_NORM })

-- ---- buffers: the rollout, the current step's, a minibatch's; tensors wrap them ----
local function floats(n) return ffi.new("float[?]", n) end
local obs, actions, logp, rewards = floats(B * OBS), floats(B), floats(B), floats(B)
local dones, values, adv, ret = floats(B), floats(B), floats(B), floats(B)
local raw_obs, cur_obs, cur_done, step_actions = floats(N * OBS), floats(N * OBS), floats(N), floats(N)
local step_logits, step_v = floats(N * ACTIONS), floats(N)
local mb_obs, mb_act, mb_logp, mb_adv = floats(MB * OBS), floats(MB), floats(MB), floats(MB)
local mb_ret, mb_oldv, mb_logits, mb_v = floats(MB), floats(MB), floats(MB * ACTIONS), floats(MB)
local d_logits, d_v = floats(MB * ACTIONS), floats(MB)
local perm = ffi.new("int32_t[?]", B)
local x_step, x_mb = lutra.wrap(cur_obs, { N, OBS }), lutra.wrap(mb_obs, { MB, OBS })
local d_logits_t, d_v_t = lutra.wrap(d_logits, { MB, ACTIONS }), lutra.wrap(d_v, { MB, 1 })
-- the networks' outputs are copied into these (Tensor:copy into a wrapped tensor: no allocation)
local step_logits_t, step_v_t = lutra.wrap(step_logits, { N, ACTIONS }), lutra.wrap(step_v, { N, 1 })
local mb_logits_t, mb_v_t = lutra.wrap(mb_logits, { MB, ACTIONS }), lutra.wrap(mb_v, { MB, 1 })
local inference = { grad = false }
local obs_rms = P.running(OBS)

local function evaluate(x, grad_opts, logits_out, v_out)
  logits_out:copy(actor:forward(x, grad_opts))
  v_out:copy(critic:forward(x, grad_opts))
end

local function observe()
  P.running_update(obs_rms, N, raw_obs)
  P.running_apply(obs_rms, N, raw_obs, cur_obs)
end

local function collect()
  for t = 0, T - 1 do
    evaluate(x_step, inference, step_logits_t, step_v_t)
    for n = 0, N - 1 do
      local i = t * N + n
      local a = P.categorical_sample(ACTIONS, step_logits, n, math.random())
      step_actions[n], actions[i] = a, a
      logp[i] = P.categorical_logp(ACTIONS, step_logits, n, a)
      values[i], dones[i] = step_v[n], cur_done[n]
    end
    ffi.copy(obs + t * N * OBS, cur_obs, ffi.sizeof("float") * N * OBS)
    env_step(step_actions, raw_obs, rewards + t * N, cur_done)
    observe()
  end
  evaluate(x_step, inference, step_logits_t, step_v_t) -- the value after the rollout
  P.gae(T, N, rewards, values, dones, step_v, cur_done, GAMMA, LAMBDA, adv, ret)
end

local stats = { loss = 0, pg = 0, entropy = 0, kl = 0, v = 0 }
local function update(u)
  optim:set_lr(LR * (1 - (u - 1) / num_updates))
  for _ = 1, EPOCHS do
    for i = 0, B - 1 do perm[i] = i end
    for i = B - 1, 1, -1 do
      local j = math.random(0, i)
      perm[i], perm[j] = perm[j], perm[i]
    end
    for s = 0, MINIBATCHES - 1 do
      for i = 0, MB - 1 do
        local k = perm[s * MB + i]
        for d = 0, OBS - 1 do mb_obs[i * OBS + d] = obs[k * OBS + d] end
        mb_act[i], mb_logp[i], mb_adv[i] = actions[k], logp[k], adv[k]
        mb_ret[i], mb_oldv[i] = ret[k], values[k]
      end
      evaluate(x_mb, nil, mb_logits_t, mb_v_t)
      P.normalize(MB, mb_adv)
      stats.loss, stats.pg, stats.entropy, stats.kl =
        P.categorical_loss(MB, ACTIONS, mb_logits, mb_act, mb_logp, mb_adv, CLIP, ENT, d_logits)
      stats.v = P.value_loss(MB, mb_v, mb_oldv, mb_ret, CLIP, VF, d_v) / VF
      actor:backward(d_logits_t, false)
      critic:backward(d_v_t, false)
      optim:step()
    end
  end
end

-- FNV-1a over the bits of every parameter
local function parameter_hash()
  local h = 0xcbf29ce484222325ULL
  for _, p in ipairs(both:parameters()) do
    local buf = p.value:read()
    local bytes = ffi.cast("const uint8_t *", buf)
    for i = 0, p.value:size() * 4 - 1 do h = bit.bxor(h, bytes[i]) * 0x100000001b3ULL end
  end
  return bit.tohex(h)
end

print(string.format("ppo.lua: cartpole, %d envs x %d steps, %d minibatches x %d epochs, %d updates, seed %d",
                    N, T, MINIBATCHES, EPOCHS, last_update, opt.seed))
for n = 0, N - 1 do
  state[n] = { 0, 0, 0, 0 }
  spawn(n, raw_obs)
end
observe()
local start, solved = os.clock(), nil
for u = 1, last_update do
  collect()
  update(u)
  local mean = recent_mean()
  if not solved and episodes >= RECENT and mean >= THRESHOLD then
    solved = u
    print(string.format("solved: mean return %.1f over the last 100 episodes at update %d, %d env steps, %.1f s CPU",
                        mean, u, u * B, os.clock() - start))
  end
  if u % opt.every == 0 or u == last_update then
    print(string.format("update %d: env steps %d, episodes %d, mean return (last 100) %.1f, pg %.4f, value %.4f, entropy %.3f, kl %.5f, %.1f s CPU",
                        u, u * B, episodes, mean, stats.pg, stats.v, stats.entropy, stats.kl,
                        os.clock() - start))
  end
  if solved and opt.until_solved then break end
end
print(string.format("mean return of the last 100 episodes %.1f (threshold %d), %d episodes, %.1f s CPU",
                    recent_mean(), THRESHOLD, episodes, os.clock() - start))
if opt.hash then print("parameter hash: " .. parameter_hash()) end
if opt.until_solved and not solved then
  print("FAIL: not solved")
  os.exit(1)
end
