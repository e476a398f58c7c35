/* Pendulum-v1 vectorised (env.h): gym's classic_control/pendulum.py, equation for equation. */
#include "env.h"

#include <math.h>

static const float MAX_SPEED = 8.0f, MAX_TORQUE = 2.0f, DT = 0.05f, G = 10.0f;
static const float PI = 3.14159265358979f;

static void observe(const float *s, float *obs) {
  obs[0] = cosf(s[0]);
  obs[1] = sinf(s[0]);
  obs[2] = s[1];
}

static void spawn(ppo_env *e, int n, float *obs) {
  e->state[n][0] = -PI + 2.0f * PI * ppo_rand_uniform(&e->rng);
  e->state[n][1] = -1.0f + 2.0f * ppo_rand_uniform(&e->rng);
  e->steps[n] = 0;
  observe(e->state[n], obs);
}

static void reset(ppo_env *e, float *obs) {
  for (int n = 0; n < e->num_envs; n++)
    spawn(e, n, obs + 3 * n);
}

static float angle_normalize(float x) {
  float y = fmodf(x + PI, 2.0f * PI);
  if (y < 0.0f) y += 2.0f * PI;
  return y - PI;
}

static void step(ppo_env *e, const float *actions, float *obs, float *rewards, float *dones) {
  for (int n = 0; n < e->num_envs; n++) {
    float *s = e->state[n];
    float u = fminf(fmaxf(actions[n], -MAX_TORQUE), MAX_TORQUE);
    float th = angle_normalize(s[0]);
    float cost = th * th + 0.1f * s[1] * s[1] + 0.001f * u * u;
    /* mass 1 and length 1 */
    float thdot = s[1] + (3.0f * G / 2.0f * sinf(s[0]) + 3.0f * u) * DT;
    thdot = fminf(fmaxf(thdot, -MAX_SPEED), MAX_SPEED);
    s[0] += thdot * DT;
    s[1] = thdot;
    e->steps[n]++;
    int done = e->steps[n] >= e->max_steps;
    rewards[n] = -cost;
    dones[n] = (float)done;
    env_track(e, n, -cost, done);
    if (done)
      spawn(e, n, obs + 3 * n);
    else
      observe(s, obs + 3 * n);
  }
}

int pendulum_init(ppo_env *e, int num_envs, uint64_t seed) {
  if (num_envs < 1 || num_envs > PPO_MAX_ENVS) return -1;
  *e = (ppo_env){.name = "pendulum",
                 .num_envs = num_envs,
                 .obs_dim = 3,
                 .num_actions = 0,
                 .act_dim = 1,
                 .act_low = -MAX_TORQUE,
                 .act_high = MAX_TORQUE,
                 .max_steps = 200,
                 .reset = reset,
                 .step = step,
                 .rng = seed};
  return 0;
}
