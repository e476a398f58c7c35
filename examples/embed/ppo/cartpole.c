/* CartPole-v1 vectorised (env.h): gym's classic_control/cartpole.py, equation for equation. */
#include "env.h"

#include <math.h>

static const float GRAVITY = 9.8f, MASS_CART = 1.0f, MASS_POLE = 0.1f, HALF_LENGTH = 0.5f;
static const float FORCE = 10.0f, TAU = 0.02f, X_LIMIT = 2.4f;
static const float THETA_LIMIT = 12.0f * 2.0f * 3.14159265358979f / 360.0f;

static void spawn(ppo_env *e, int n, float *obs) {
  for (int k = 0; k < 4; k++) {
    e->state[n][k] = -0.05f + 0.1f * ppo_rand_uniform(&e->rng);
    obs[k] = e->state[n][k];
  }
  e->steps[n] = 0;
}

static void reset(ppo_env *e, float *obs) {
  for (int n = 0; n < e->num_envs; n++)
    spawn(e, n, obs + 4 * n);
}

static void step(ppo_env *e, const float *actions, float *obs, float *rewards, float *dones) {
  const float total_mass = MASS_CART + MASS_POLE, pole_ml = MASS_POLE * HALF_LENGTH;
  for (int n = 0; n < e->num_envs; n++) {
    float *s = e->state[n];
    float x = s[0], x_dot = s[1], theta = s[2], theta_dot = s[3];
    float force = actions[n] >= 0.5f ? FORCE : -FORCE;
    float c = cosf(theta), sn = sinf(theta);
    float temp = (force + pole_ml * theta_dot * theta_dot * sn) / total_mass;
    float theta_acc =
        (GRAVITY * sn - c * temp) / (HALF_LENGTH * (4.0f / 3.0f - MASS_POLE * c * c / total_mass));
    float x_acc = temp - pole_ml * theta_acc * c / total_mass;
    s[0] = x + TAU * x_dot;
    s[1] = x_dot + TAU * x_acc;
    s[2] = theta + TAU * theta_dot;
    s[3] = theta_dot + TAU * theta_acc;
    e->steps[n]++;
    int fell = s[0] < -X_LIMIT || s[0] > X_LIMIT || s[2] < -THETA_LIMIT || s[2] > THETA_LIMIT;
    int done = fell || e->steps[n] >= e->max_steps;
    rewards[n] = 1.0f;
    dones[n] = (float)done;
    env_track(e, n, 1.0f, done);
    if (done)
      spawn(e, n, obs + 4 * n);
    else
      for (int k = 0; k < 4; k++)
        obs[4 * n + k] = s[k];
  }
}

int cartpole_init(ppo_env *e, int num_envs, uint64_t seed) {
  if (num_envs < 1 || num_envs > PPO_MAX_ENVS) return -1;
  *e = (ppo_env){.name = "cartpole",
                 .num_envs = num_envs,
                 .obs_dim = 4,
                 .num_actions = 2,
                 .act_dim = 1,
                 .max_steps = 500,
                 .reset = reset,
                 .step = step,
                 .rng = seed};
  return 0;
}
