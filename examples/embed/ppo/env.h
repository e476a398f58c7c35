/* A vectorised environment: N copies of one task stepped together, seeded, resetting each copy
 * itself when its episode ends (the observation returned for it is then the new episode's
 * first, as gym's vector envs do). Fixed-size state: no allocation. cartpole.c and pendulum.c
 * fill it in. */
#ifndef PPO_ENV_H
#define PPO_ENV_H

#include "ppo.h"

enum { ENV_MAX_STATE = 4, ENV_RECENT = 100 };

typedef struct ppo_env ppo_env;
struct ppo_env {
  const char *name;
  int num_envs, obs_dim;
  int num_actions;         /* > 0: discrete actions 0..num_actions-1; 0: continuous */
  int act_dim;             /* 1 for discrete, the action vector's length otherwise */
  float act_low, act_high; /* continuous actions are clipped to this range when applied */
  int max_steps;           /* episode length cap (truncation) */
  /* obs [N][obs_dim]; actions [N][act_dim]; rewards and dones [N] */
  void (*reset)(ppo_env *e, float *obs);
  void (*step)(ppo_env *e, const float *actions, float *obs, float *rewards, float *dones);
  uint64_t rng;
  float state[PPO_MAX_ENVS][ENV_MAX_STATE];
  int steps[PPO_MAX_ENVS];
  double episode_return[PPO_MAX_ENVS];
  /* the returns of the last ENV_RECENT finished episodes (a ring), and how many finished */
  float recent[ENV_RECENT];
  long episodes;
};

/* Counts reward r for env n; done ends its episode: the return joins the ring. */
static inline void env_track(ppo_env *e, int n, float r, int done) {
  e->episode_return[n] += r;
  if (!done) return;
  e->recent[e->episodes % ENV_RECENT] = (float)e->episode_return[n];
  e->episodes++;
  e->episode_return[n] = 0.0;
}

/* mean return of the last min(episodes, ENV_RECENT) episodes (0 when none finished) */
static inline double env_recent_mean(const ppo_env *e) {
  long n = e->episodes < ENV_RECENT ? e->episodes : ENV_RECENT;
  double s = 0.0;
  for (long i = 0; i < n; i++)
    s += e->recent[i];
  return n ? s / (double)n : 0.0;
}

/* CartPole-v1 (gym's classic dynamics, Euler steps of 0.02 s, 500-step cap): 4 observations,
 * 2 actions, reward 1 per step. Solved: mean return >= 475 over 100 episodes. */
int cartpole_init(ppo_env *e, int num_envs, uint64_t seed);

/* Pendulum-v1 (gym's dynamics, 200 steps): observation (cos, sin, angular velocity), one torque
 * in [-2, 2], reward -(angle^2 + 0.1 velocity^2 + 0.001 torque^2). */
int pendulum_init(ppo_env *e, int num_envs, uint64_t seed);

#endif
