--- PPO's arithmetic for examples/ppo.lua, on FFI float arrays (0-based), with no lutra call:
-- generalized advantage estimation, advantage normalisation, the clipped policy objective of a
-- categorical policy with its entropy bonus, the (clipped) value loss, the gradients of these
-- with respect to the logits and the value, and a running mean/variance for observations.
-- The Lua twin of examples/embed/ppo/ppo.c (spec/ppo_spec.lua checks both against the same
-- references). Conventions of CleanRL's ppo.py: arrays [T][N] step-major, dones[t] marks obs[t]
-- as a new episode's first, losses are minibatch means, total = pg - ent_coef * entropy +
-- vf_coef * v_loss. Nothing here allocates: it runs inside the training loop.
local M = {}

local exp, log, sqrt = math.exp, math.log, math.sqrt

--- adv and ret (= adv + values) of a rollout of T steps of N envs.
function M.gae(T, N, rewards, values, dones, next_values, next_dones, gamma, lambda, adv, ret)
  for n = 0, N - 1 do
    local last = 0
    for t = T - 1, 0, -1 do
      local nonterminal, next_value
      if t == T - 1 then
        nonterminal, next_value = 1 - next_dones[n], next_values[n]
      else
        nonterminal, next_value = 1 - dones[(t + 1) * N + n], values[(t + 1) * N + n]
      end
      local i = t * N + n
      local delta = rewards[i] + gamma * next_value * nonterminal - values[i]
      last = delta + gamma * lambda * nonterminal * last
      adv[i] = last
      ret[i] = last + values[i]
    end
  end
end

--- adv = (adv - mean) / (std + 1e-8), std unbiased (torch.std).
function M.normalize(m, adv)
  local sum, sq = 0, 0
  for i = 0, m - 1 do sum = sum + adv[i] end
  local mean = sum / m
  for i = 0, m - 1 do sq = sq + (adv[i] - mean) ^ 2 end
  local std = m > 1 and sqrt(sq / (m - 1)) or 0
  for i = 0, m - 1 do adv[i] = (adv[i] - mean) / (std + 1e-8) end
end

-- log-sum-exp of row r (k logits)
local function lse(k, z, o)
  local mx = z[o]
  for j = 1, k - 1 do if z[o + j] > mx then mx = z[o + j] end end
  local s = 0
  for j = 0, k - 1 do s = s + exp(z[o + j] - mx) end
  return mx + log(s)
end

--- log p(action) of row r of logits [.][k].
function M.categorical_logp(k, z, r, action) return z[r * k + action] - lse(k, z, r * k) end

--- a draw from row r's softmax, u uniform in [0, 1).
function M.categorical_sample(k, z, r, u)
  local o = r * k
  local l, acc = lse(k, z, o), 0
  for j = 0, k - 2 do
    acc = acc + exp(z[o + j] - l)
    if u < acc then return j end
  end
  return k - 1
end

--- The clipped surrogate minus ent_coef * mean entropy over m rows (logits [m][k], actions,
-- old_logp, adv [m]); writes its gradient with respect to the logits into dlogits. Returns the
-- loss, the policy part, the mean entropy and the approximate KL.
function M.categorical_loss(m, k, z, actions, old_logp, adv, clip, ent_coef, dz)
  local pg, ent, kl = 0, 0, 0
  for i = 0, m - 1 do
    local o = i * k
    local l = lse(k, z, o)
    local h = 0
    for j = 0, k - 1 do
      local lp = z[o + j] - l
      h = h - exp(lp) * lp
    end
    local a = actions[i]
    local logr = z[o + a] - l - old_logp[i]
    local ratio = exp(logr)
    local clamped = ratio < 1 - clip and 1 - clip or (ratio > 1 + clip and 1 + clip or ratio)
    local l1, l2 = -adv[i] * ratio, -adv[i] * clamped
    -- the unclipped branch's gradient where it is the max; none where the clipped constant wins
    local g = 0
    if clamped == ratio or l1 > l2 then g = -adv[i] * ratio / m end
    pg = pg + (l1 > l2 and l1 or l2)
    for j = 0, k - 1 do
      local lp = z[o + j] - l
      local p = exp(lp)
      dz[o + j] = g * ((j == a and 1 or 0) - p) + ent_coef / m * p * (lp + h)
    end
    ent = ent + h
    kl = kl + (ratio - 1) - logr
  end
  return pg / m - ent_coef * ent / m, pg / m, ent / m, kl / m
end

--- vf_coef * 0.5 * mean (v - ret)^2, or with clip > 0 CleanRL's clipped value loss; writes
-- d loss / d v into dv. Returns the loss.
function M.value_loss(m, v, old_v, ret, clip, vf_coef, dv)
  local sum = 0
  for i = 0, m - 1 do
    local err = v[i] - ret[i]
    local loss, grad = err * err, err
    if clip > 0 then
      local step = v[i] - old_v[i]
      local clamped = step < -clip and -clip or (step > clip and clip or step)
      local err_c = old_v[i] + clamped - ret[i]
      if err_c * err_c > loss then
        loss = err_c * err_c
        grad = clamped == step and err_c or 0
      end
    end
    sum = sum + loss
    dv[i] = vf_coef * grad / m
  end
  return 0.5 * vf_coef * sum / m
end

--- A running mean and variance over rows of dim values (gym's RunningMeanStd).
function M.running(dim)
  local mean, var = {}, {}
  for d = 1, dim do mean[d], var[d] = 0, 1 end
  return { dim = dim, count = 1e-4, mean = mean, var = var }
end

--- Adds rows of x ([rows][dim]) to the statistics.
function M.running_update(r, rows, x)
  local dim, total = r.dim, r.count + rows
  for d = 1, dim do
    local bm, bv = 0, 0
    for i = 0, rows - 1 do bm = bm + x[i * dim + d - 1] end
    bm = bm / rows
    for i = 0, rows - 1 do bv = bv + (x[i * dim + d - 1] - bm) ^ 2 end
    bv = bv / rows
    local delta = bm - r.mean[d]
    local m2 = r.var[d] * r.count + bv * rows + delta * delta * r.count * rows / total
    r.mean[d] = r.mean[d] + delta * rows / total
    r.var[d] = m2 / total
  end
  r.count = total
end

--- out = clip((x - mean) / sqrt(var + 1e-8), -10, 10) for rows of x.
function M.running_apply(r, rows, x, out)
  local dim = r.dim
  for i = 0, rows - 1 do
    for d = 1, dim do
      local k = i * dim + d - 1
      local y = (x[k] - r.mean[d]) / sqrt(r.var[d] + 1e-8)
      out[k] = y < -10 and -10 or (y > 10 and 10 or y)
    end
  end
end

return M
