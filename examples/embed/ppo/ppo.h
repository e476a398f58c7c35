/* PPO's arithmetic on host arrays, with no lutra call: generalized advantage estimation, the
 * clipped policy objective with its entropy bonus, the (clipped) value loss, the gradients of
 * these with respect to what the networks output (logits, Gaussian mean and log-std, value), and
 * the running normalisers of observations and rewards. The agent (agent.c) feeds the gradients
 * to lutra's modules' backward; ppo_check.c tests every function here.
 *
 * Conventions follow CleanRL's ppo.py / ppo_continuous_action.py: arrays are [T][N] (step-major,
 * N environments), dones[t] marks obs[t] as the first observation of a new episode, losses are
 * means over the minibatch and the total loss is pg - ent_coef * entropy + vf_coef * v_loss. */
#ifndef PPO_H
#define PPO_H

#include <stddef.h>
#include <stdint.h>

/* adv[t][n] and ret = adv + values for a rollout of T steps of N envs; next_values / next_dones
 * are the critic's value of (and the done flag of) the observation after the last step. */
void ppo_gae(int T, int N, const float *rewards, const float *values, const float *dones,
             const float *next_values, const float *next_dones, float gamma, float lambda,
             float *adv, float *ret);

/* adv = (adv - mean) / (std + 1e-8), std unbiased (torch.std) */
void ppo_normalize(int M, float *adv);

/* What one minibatch's loss was made of, for printing. */
typedef struct ppo_stats {
  float pg_loss, entropy, v_loss, approx_kl, clipfrac;
} ppo_stats;

/* The clipped surrogate (mean over M rows of max(-A r, -A clip(r, 1 - eps, 1 + eps)), r =
 * exp(logp - old_logp)) minus ent_coef * the mean entropy, for a categorical policy over K
 * actions given logits [M][K] and actions [M] (as floats). Returns that loss and writes its
 * gradient with respect to the logits into dlogits [M][K]. */
float ppo_categorical_loss(int M, int K, const float *logits, const float *actions,
                           const float *old_logp, const float *adv, float clip, float ent_coef,
                           float *dlogits, ppo_stats *stats);

/* The same for a diagonal Gaussian policy over D dims: mean [M][D], log_std [M][D] (a
 * state-independent log-std broadcast over the rows), actions [M][D]. Writes dmean, dlog_std. */
float ppo_gaussian_loss(int M, int D, const float *mean, const float *log_std, const float *actions,
                        const float *old_logp, const float *adv, float clip, float ent_coef,
                        float *dmean, float *dlog_std, ppo_stats *stats);

/* vf_coef * 0.5 * mean of (v - ret)^2, or with clip > 0 of max((v - ret)^2, (old_v + clip(v -
 * old_v, -clip, clip) - ret)^2); writes d loss / d v into dv [M]. */
float ppo_value_loss(int M, const float *v, const float *old_v, const float *ret, float clip,
                     float vf_coef, float *dv, ppo_stats *stats);

/* log-probabilities and sampling. u, u2: uniform numbers in [0, 1). */
float ppo_categorical_logp(int K, const float *logits, int action);
int ppo_categorical_sample(int K, const float *logits, float u);
float ppo_gaussian_logp(int D, const float *mean, const float *log_std, const float *action);

/* Running mean and variance over a stream of vectors (Welford's parallel update, as gym's
 * RunningMeanStd), used to normalise observations (and, through ppo_reward_scaler, rewards). */
enum { PPO_NORM_MAX_DIM = 16 };
typedef struct ppo_running {
  int dim;
  double count, mean[PPO_NORM_MAX_DIM], var[PPO_NORM_MAX_DIM];
} ppo_running;
void ppo_running_init(ppo_running *r, int dim);
void ppo_running_update(ppo_running *r, int rows, const float *x); /* x [rows][dim] */
/* out = clip((x - mean) / sqrt(var + 1e-8), -10, 10) */
void ppo_running_apply(const ppo_running *r, int rows, const float *x, float *out);

/* gym's NormalizeReward: rewards divided by the running std of each env's discounted return,
 * clipped to +-10. */
enum { PPO_MAX_ENVS = 256 };
typedef struct ppo_reward_scaler {
  float gamma;
  double returns[PPO_MAX_ENVS];
  ppo_running stats;
} ppo_reward_scaler;
void ppo_reward_scaler_init(ppo_reward_scaler *s, float gamma);
/* rewards [N] scaled in place; dones [N] end the discounted returns */
void ppo_reward_scale(ppo_reward_scaler *s, int N, float *rewards, const float *dones);

/* A small seeded generator (splitmix64) for sampling and shuffles. */
static inline uint64_t ppo_rand_u64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static inline float ppo_rand_uniform(uint64_t *state) {
  return (float)(ppo_rand_u64(state) >> 40) / 16777216.0f;
}
float ppo_rand_normal(uint64_t *state);

#endif
