"""A CleanRL-style PyTorch PPO (ppo.py / ppo_continuous_action.py, one file, no frameworks) with the
hyper-parameters, networks and normalisations of examples/embed/ppo, on gymnasium's CartPole-v1
and Pendulum-v1 (the dynamics examples/embed/ppo/cartpole.c and pendulum.c reimplement), for
PERFORMANCE.md's PPO comparison: env steps and wall time to the solve threshold.

    python3 bench/ppo_cleanrl.py [--env cartpole|pendulum] [--seed 1] [--threads 1]
                                 [--until-solved] [--every 10]

Identical to the lutra agent (agent.c): actor and critic MLPs Linear + Tanh (64-64), PyTorch's
default Linear init with the actor's last layer scaled by 0.01 and last biases zeroed (lutra has
no orthogonal init; CleanRL's orthogonal init is --cleanrl-net), a
state-independent log-std for the pendulum, one Adam (eps 1e-5, no weight decay) with the global
gradient norm clipped at 0.5, lr annealed linearly per update, advantages normalised per
minibatch, observations normalised by a running mean/var (clipped at 10), the pendulum's rewards
by the running std of the discounted return. The vector env steps with same-step autoreset (the
observation after a done is the next episode's first, as CleanRL's gym 0.23 envs did and the C
envs do). torch.set_num_threads(--threads): 1 matches lutra's single OpenBLAS thread. Needs
torch and gymnasium (a venv outside the repository: pip install torch gymnasium).
"""
import argparse
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Categorical, Normal

PRESETS = {
    # CleanRL ppo.py's cart-pole settings (agent.c ppo_config_cartpole)
    "cartpole": dict(gym_id="CartPole-v1", num_envs=4, num_steps=128, minibatches=4, epochs=4,
                     lr=2.5e-4, gamma=0.99, lam=0.95, clip=0.2, ent=0.01, vf=0.5,
                     clip_value=True, norm_reward=False, total_steps=500_000, threshold=475.0),
    # rl-baselines3-zoo's pendulum settings (agent.c ppo_config_pendulum)
    "pendulum": dict(gym_id="Pendulum-v1", num_envs=4, num_steps=1024, minibatches=64, epochs=10,
                     lr=3e-4, gamma=0.9, lam=0.95, clip=0.2, ent=0.0, vf=0.5,
                     clip_value=False, norm_reward=True, total_steps=200_000, threshold=-200.0),
}


class RunningMeanStd:
    """gym's RunningMeanStd (the C agent's ppo_running)."""

    def __init__(self, shape):
        self.mean, self.var, self.count = np.zeros(shape), np.ones(shape), 1e-4

    def update(self, x):
        bm, bv, bc = x.mean(0), x.var(0), x.shape[0]
        delta, total = bm - self.mean, self.count + bc
        m2 = self.var * self.count + bv * bc + delta**2 * self.count * bc / total
        self.mean, self.var, self.count = self.mean + delta * bc / total, m2 / total, total


def mlp(obs_dim, out, last_scale, cleanrl):
    layers = [nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, out)]
    if cleanrl:
        for i, layer in enumerate(l for l in layers if isinstance(l, nn.Linear)):
            nn.init.orthogonal_(layer.weight, last_scale if i == 2 else np.sqrt(2))
            nn.init.zeros_(layer.bias)
    else:
        with torch.no_grad():
            layers[-1].weight.mul_(last_scale)
            layers[-1].bias.zero_()
    return nn.Sequential(*layers)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env", choices=sorted(PRESETS), default="cartpole")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--until-solved", action="store_true")
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--cleanrl-net", action="store_true", help="CleanRL's orthogonal init")
    a = p.parse_args()
    c = PRESETS[a.env]
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    N, T = c["num_envs"], c["num_steps"]
    B = N * T
    MB = B // c["minibatches"]
    num_updates = c["total_steps"] // B
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(c["gym_id"]) for _ in range(N)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    discrete = isinstance(envs.single_action_space, gym.spaces.Discrete)
    obs_dim = envs.single_observation_space.shape[0]
    out = envs.single_action_space.n if discrete else envs.single_action_space.shape[0]
    actor = mlp(obs_dim, out, 0.01, a.cleanrl_net)
    critic = mlp(obs_dim, 1, 1.0, a.cleanrl_net)
    log_std = nn.Parameter(torch.zeros(1, out))
    params = list(actor.parameters()) + list(critic.parameters()) + ([] if discrete else [log_std])
    opt = torch.optim.Adam(params, lr=c["lr"], eps=1e-5)

    def dist(x):
        z = actor(x)
        return Categorical(logits=z) if discrete else Normal(z, log_std.expand_as(z).exp())

    obs_rms, ret_rms = RunningMeanStd(obs_dim), RunningMeanStd(())
    disc_ret = np.zeros(N)

    def normalize(o):
        obs_rms.update(o)
        return np.clip((o - obs_rms.mean) / np.sqrt(obs_rms.var + 1e-8), -10, 10)

    obs_b = torch.zeros(T, N, obs_dim)
    act_b = torch.zeros(T, N) if discrete else torch.zeros(T, N, out)
    logp_b, rew_b, done_b, val_b = (torch.zeros(T, N) for _ in range(4))
    raw, _ = envs.reset(seed=a.seed)
    next_obs = torch.tensor(normalize(raw), dtype=torch.float32)
    next_done = torch.zeros(N)
    ep_ret, recent, episodes, steps = np.zeros(N), [], 0, 0
    start, solved = time.perf_counter(), None
    print(f"ppo_cleanrl: {a.env}, {N} envs x {T} steps, {c['minibatches']} minibatches x "
          f"{c['epochs']} epochs, {num_updates} updates, torch {torch.__version__}, "
          f"{a.threads} thread(s)")
    for update in range(1, num_updates + 1):
        opt.param_groups[0]["lr"] = c["lr"] * (1.0 - (update - 1.0) / num_updates)
        for t in range(T):
            obs_b[t], done_b[t] = next_obs, next_done
            with torch.no_grad():
                d = dist(next_obs)
                action = d.sample()
                logp = d.log_prob(action) if discrete else d.log_prob(action).sum(1)
                val_b[t] = critic(next_obs).flatten()
            act_b[t], logp_b[t] = action, logp
            raw, reward, term, trunc, _ = envs.step(action.numpy())
            done = np.logical_or(term, trunc)
            ep_ret += reward
            for n in np.nonzero(done)[0]:
                recent = (recent + [ep_ret[n]])[-100:]
                episodes += 1
                ep_ret[n] = 0.0
            if c["norm_reward"]:
                disc_ret = disc_ret * c["gamma"] + reward
                ret_rms.update(disc_ret[:, None].reshape(-1))
                reward = np.clip(reward / np.sqrt(ret_rms.var + 1e-8), -10, 10)
                disc_ret[done] = 0.0
            rew_b[t] = torch.tensor(reward, dtype=torch.float32)
            next_obs = torch.tensor(normalize(raw), dtype=torch.float32)
            next_done = torch.tensor(done, dtype=torch.float32)
            steps += N
        with torch.no_grad():  # GAE
            next_value = critic(next_obs).flatten()
            adv_b, last = torch.zeros(T, N), 0
            for t in reversed(range(T)):
                nonterminal = 1.0 - (next_done if t == T - 1 else done_b[t + 1])
                nv = next_value if t == T - 1 else val_b[t + 1]
                delta = rew_b[t] + c["gamma"] * nv * nonterminal - val_b[t]
                adv_b[t] = last = delta + c["gamma"] * c["lam"] * nonterminal * last
            ret_b = adv_b + val_b
        b_obs, b_act = obs_b.reshape(B, obs_dim), act_b.reshape(B, *act_b.shape[2:])
        b_logp, b_adv, b_ret, b_val = (x.reshape(B) for x in (logp_b, adv_b, ret_b, val_b))
        for _ in range(c["epochs"]):
            perm = rng.permutation(B)
            for s in range(0, B, MB):
                i = perm[s:s + MB]
                d = dist(b_obs[i])
                logp = d.log_prob(b_act[i]) if discrete else d.log_prob(b_act[i]).sum(1)
                ent = d.entropy() if discrete else d.entropy().sum(1)
                ratio = (logp - b_logp[i]).exp()
                adv = b_adv[i]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg = torch.max(-adv * ratio, -adv * ratio.clamp(1 - c["clip"], 1 + c["clip"])).mean()
                v = critic(b_obs[i]).flatten()
                v_loss = (v - b_ret[i]) ** 2
                if c["clip_value"]:
                    v_c = b_val[i] + (v - b_val[i]).clamp(-c["clip"], c["clip"])
                    v_loss = torch.max(v_loss, (v_c - b_ret[i]) ** 2)
                loss = pg - c["ent"] * ent.mean() + c["vf"] * 0.5 * v_loss.mean()
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params, 0.5)
                opt.step()
        mean = float(np.mean(recent)) if recent else 0.0
        wall = time.perf_counter() - start
        if solved is None and len(recent) >= 100 and mean >= c["threshold"]:
            solved = update
            print(f"solved: mean return {mean:.1f} over the last 100 episodes at update {update}, "
                  f"{steps} env steps, {wall:.1f} s")
        if update % a.every == 0 or update == num_updates:
            print(f"update {update}: env steps {steps}, episodes {episodes}, mean return (last 100) "
                  f"{mean:.1f}, {wall:.1f} s")
        if solved and a.until_solved:
            break
    print(f"mean return of the last 100 episodes {np.mean(recent):.1f} (threshold "
          f"{c['threshold']:.0f}), {episodes} episodes, {steps} env steps, "
          f"{time.perf_counter() - start:.1f} s")
    return 0 if solved or not a.until_solved else 1


if __name__ == "__main__":
    raise SystemExit(main())
