/* The PPO agent on lutra's C API: an actor and a critic (Sequentials of Linear + Tanh, 64-64),
 * for continuous actions a state-independent log-std, one AdamW over all of them with global
 * gradient-norm clipping, a rollout buffer of T steps of N environments, and the update cut
 * into slices of one minibatch each so that a frame loop can spread it over frames.
 *
 * Every buffer (host arrays, lutra tensors wrapping them, the modules' own outputs) is made at
 * creation or during the first rollout and update: after that, collecting and updating
 * allocate nothing. */
#ifndef PPO_AGENT_H
#define PPO_AGENT_H

#include "env.h"
#include "ppo.h"

#include <lutra.h>

typedef struct ppo_config {
  int num_envs, num_steps, minibatches, epochs, hidden;
  float lr, adam_eps, gamma, lambda, clip, ent_coef, vf_coef, max_grad_norm;
  int clip_value;   /* clip the value loss too (CleanRL's clip_vloss) */
  int anneal_lr;    /* lr falls linearly to 0 over the run, set at each update's start */
  int norm_obs;     /* running mean/var observation normalisation */
  int norm_reward;  /* rewards scaled by the running std of the discounted return */
  long total_steps; /* env steps of the run (for the lr schedule) */
  uint64_t seed;
} ppo_config;

/* CleanRL ppo.py's cart-pole hyper-parameters (4 envs x 128 steps, 4 minibatches, 4 epochs, lr
 * 2.5e-4 annealed, ent 0.01, clip 0.2, 500k steps) with observation normalisation on. */
void ppo_config_cartpole(ppo_config *c);
/* Pendulum: rl-baselines3-zoo's PPO settings (4 envs x 1024 steps, minibatch 64, 10 epochs,
 * gamma 0.9, no entropy bonus, no value clipping) without its state-dependent exploration, with
 * CleanRL's continuous lr (3e-4, annealed: zoo's 1e-3 collapsed the policy in one seed of six)
 * and observation and reward normalisation; 200k steps. */
void ppo_config_pendulum(ppo_config *c);

typedef struct ppo_agent ppo_agent;

/* 0, or -1 after printing why to stderr; env is borrowed and must outlive the agent */
int ppo_agent_new(const ppo_config *c, ppo_env *env, ppo_agent **out);
void ppo_agent_free(ppo_agent *a);

/* One env step of all N envs: act (sample from the policy), step, store. Returns 1 when the
 * rollout is full (the advantages are then computed and the update may start), 0 otherwise,
 * -1 on a lutra error. */
int ppo_agent_collect(ppo_agent *a);
/* One minibatch of the update: returns 1 when the last epoch's last minibatch ran (the next
 * call to collect starts a new rollout), 0 otherwise, -1 on an error. */
int ppo_agent_update_slice(ppo_agent *a);

long ppo_agent_env_steps(const ppo_agent *a);
long ppo_agent_updates(const ppo_agent *a);
long ppo_agent_num_updates(const ppo_agent *a); /* total_steps / (N T) */
ppo_stats ppo_agent_last_stats(const ppo_agent *a);
/* FNV-1a over the bits of every parameter, for reproducibility checks */
uint64_t ppo_agent_hash(const ppo_agent *a);

#endif
