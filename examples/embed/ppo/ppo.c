/* PPO's arithmetic (ppo.h). Sums run in double so that the result does not depend on how a
 * compiler orders float additions; everything is a fixed sequence of operations, so a run with
 * one seed repeats bit for bit. */
#include "ppo.h"

#include <math.h>

static const double LOG_SQRT_2PI = 0.91893853320467274178;

void ppo_gae(int T, int N, const float *rewards, const float *values, const float *dones,
             const float *next_values, const float *next_dones, float gamma, float lambda,
             float *adv, float *ret) {
  for (int n = 0; n < N; n++) {
    float last = 0.0f;
    for (int t = T - 1; t >= 0; t--) {
      float nonterminal = 1.0f - (t == T - 1 ? next_dones[n] : dones[(t + 1) * N + n]);
      float next_value = t == T - 1 ? next_values[n] : values[(t + 1) * N + n];
      int i = t * N + n;
      float delta = rewards[i] + gamma * next_value * nonterminal - values[i];
      last = delta + gamma * lambda * nonterminal * last;
      adv[i] = last;
      ret[i] = last + values[i];
    }
  }
}

void ppo_normalize(int M, float *adv) {
  double sum = 0.0, sq = 0.0;
  for (int i = 0; i < M; i++)
    sum += adv[i];
  double mean = sum / M;
  for (int i = 0; i < M; i++)
    sq += (adv[i] - mean) * (adv[i] - mean);
  double std = M > 1 ? sqrt(sq / (M - 1)) : 0.0;
  for (int i = 0; i < M; i++)
    adv[i] = (float)((adv[i] - mean) / (std + 1e-8));
}

/* d loss / d logp of one row of the clipped surrogate: the unclipped branch's -A r / M where it
 * is the max (inside the clip range both branches are equal and the clamp passes the gradient),
 * 0 where the clipped constant wins */
static double surrogate(double ratio, double a, float clip, int M, double *loss, int *clipped) {
  double clamped = ratio < 1.0 - clip ? 1.0 - clip : ratio > 1.0 + clip ? 1.0 + clip : ratio;
  double l1 = -a * ratio, l2 = -a * clamped;
  *loss = l1 > l2 ? l1 : l2;
  *clipped = fabs(ratio - 1.0) > clip;
  return (clamped == ratio || l1 > l2) ? -a * ratio / M : 0.0;
}

/* the sums over a minibatch's rows that the loss and the stats are made of */
typedef struct row_sums {
  double pg, ent, kl;
  int clipped;
} row_sums;

static void add_row(row_sums *s, double row_loss, double h, double ratio, double logr,
                    int clipped) {
  s->pg += row_loss;
  s->ent += h;
  s->kl += (ratio - 1.0) - logr;
  s->clipped += clipped;
}

/* the policy loss pg - ent_coef * entropy (means over M rows), and the stats */
static float finish(const row_sums *s, int M, float ent_coef, ppo_stats *stats) {
  if (stats) {
    stats->pg_loss = (float)(s->pg / M);
    stats->entropy = (float)(s->ent / M);
    stats->approx_kl = (float)(s->kl / M);
    stats->clipfrac = (float)s->clipped / (float)M;
  }
  return (float)(s->pg / M - (double)ent_coef * s->ent / M);
}

float ppo_categorical_logp(int K, const float *z, int action) {
  double mx = z[0], sum = 0.0;
  for (int j = 1; j < K; j++)
    mx = z[j] > mx ? z[j] : mx;
  for (int j = 0; j < K; j++)
    sum += exp(z[j] - mx);
  return (float)(z[action] - mx - log(sum));
}

int ppo_categorical_sample(int K, const float *z, float u) {
  double mx = z[0], sum = 0.0, acc = 0.0;
  for (int j = 1; j < K; j++)
    mx = z[j] > mx ? z[j] : mx;
  for (int j = 0; j < K; j++)
    sum += exp(z[j] - mx);
  for (int j = 0; j < K - 1; j++) {
    acc += exp(z[j] - mx) / sum;
    if (u < acc) return j;
  }
  return K - 1;
}

float ppo_categorical_loss(int M, int K, const float *logits, const float *actions,
                           const float *old_logp, const float *adv, float clip, float ent_coef,
                           float *dlogits, ppo_stats *stats) {
  row_sums sums = {0};
  for (int i = 0; i < M; i++) {
    const float *z = logits + (size_t)i * K;
    float *dz = dlogits + (size_t)i * K;
    int a = (int)actions[i];
    double mx = z[0], sum = 0.0;
    for (int j = 1; j < K; j++)
      mx = z[j] > mx ? z[j] : mx;
    for (int j = 0; j < K; j++)
      sum += exp(z[j] - mx);
    double lse = mx + log(sum), h = 0.0;
    for (int j = 0; j < K; j++) {
      double lp = z[j] - lse;
      h -= exp(lp) * lp;
    }
    double logr = (z[a] - lse) - old_logp[i], ratio = exp(logr), row_loss;
    int clipped;
    double g = surrogate(ratio, adv[i], clip, M, &row_loss, &clipped);
    /* d logp_a / d z_j = [j = a] - p_j; d H / d z_j = -p_j (log p_j + H) */
    for (int j = 0; j < K; j++) {
      double lp = z[j] - lse, p = exp(lp);
      dz[j] = (float)(g * ((j == a) - p) + (double)ent_coef / M * p * (lp + h));
    }
    add_row(&sums, row_loss, h, ratio, logr, clipped);
  }
  return finish(&sums, M, ent_coef, stats);
}

float ppo_gaussian_logp(int D, const float *mean, const float *log_std, const float *action) {
  double lp = 0.0;
  for (int d = 0; d < D; d++) {
    double z = (action[d] - mean[d]) / exp(log_std[d]);
    lp += -0.5 * z * z - log_std[d] - LOG_SQRT_2PI;
  }
  return (float)lp;
}

float ppo_gaussian_loss(int M, int D, const float *mean, const float *log_std, const float *actions,
                        const float *old_logp, const float *adv, float clip, float ent_coef,
                        float *dmean, float *dlog_std, ppo_stats *stats) {
  row_sums sums = {0};
  for (int i = 0; i < M; i++) {
    size_t o = (size_t)i * D;
    double lp = ppo_gaussian_logp(D, mean + o, log_std + o, actions + o), h = 0.0;
    for (int d = 0; d < D; d++)
      h += 0.5 + LOG_SQRT_2PI + log_std[o + d];
    double logr = lp - old_logp[i], ratio = exp(logr), row_loss;
    int clipped;
    double g = surrogate(ratio, adv[i], clip, M, &row_loss, &clipped);
    /* d logp / d mean = (a - mean) / var; d logp / d log_std = z^2 - 1; d H / d log_std = 1 */
    for (int d = 0; d < D; d++) {
      double var = exp(2.0 * log_std[o + d]), diff = actions[o + d] - mean[o + d];
      dmean[o + d] = (float)(g * diff / var);
      dlog_std[o + d] = (float)(g * (diff * diff / var - 1.0) - (double)ent_coef / M);
    }
    add_row(&sums, row_loss, h, ratio, logr, clipped);
  }
  return finish(&sums, M, ent_coef, stats);
}

float ppo_value_loss(int M, const float *v, const float *old_v, const float *ret, float clip,
                     float vf_coef, float *dv, ppo_stats *stats) {
  double sum = 0.0;
  for (int i = 0; i < M; i++) {
    double err = (double)v[i] - ret[i], loss = err * err, grad = err;
    if (clip > 0.0f) {
      double step = (double)v[i] - old_v[i];
      double clamped = step < -clip ? -clip : step > clip ? clip : step;
      double err_c = old_v[i] + clamped - ret[i];
      /* outside the clip range the clipped branch is constant in v: no gradient where it wins */
      if (err_c * err_c > loss) {
        loss = err_c * err_c;
        grad = clamped == step ? err_c : 0.0;
      }
    }
    sum += loss;
    dv[i] = (float)(vf_coef * grad / M);
  }
  float l = (float)(0.5 * vf_coef * sum / M);
  if (stats) stats->v_loss = (float)(0.5 * sum / M);
  return l;
}

void ppo_running_init(ppo_running *r, int dim) {
  r->dim = dim;
  r->count = 1e-4;
  for (int d = 0; d < PPO_NORM_MAX_DIM; d++) {
    r->mean[d] = 0.0;
    r->var[d] = 1.0;
  }
}

void ppo_running_update(ppo_running *r, int rows, const float *x) {
  double total = r->count + rows;
  for (int d = 0; d < r->dim; d++) {
    double bm = 0.0, bv = 0.0;
    for (int i = 0; i < rows; i++)
      bm += x[(size_t)i * r->dim + d];
    bm /= rows;
    for (int i = 0; i < rows; i++) {
      double e = x[(size_t)i * r->dim + d] - bm;
      bv += e * e;
    }
    bv /= rows;
    double delta = bm - r->mean[d];
    double m2 = r->var[d] * r->count + bv * rows + delta * delta * r->count * rows / total;
    r->mean[d] += delta * rows / total;
    r->var[d] = m2 / total;
  }
  r->count = total;
}

void ppo_running_apply(const ppo_running *r, int rows, const float *x, float *out) {
  for (int i = 0; i < rows; i++)
    for (int d = 0; d < r->dim; d++) {
      size_t k = (size_t)i * r->dim + d;
      double y = (x[k] - r->mean[d]) / sqrt(r->var[d] + 1e-8);
      out[k] = (float)(y < -10.0 ? -10.0 : y > 10.0 ? 10.0 : y);
    }
}

void ppo_reward_scaler_init(ppo_reward_scaler *s, float gamma) {
  s->gamma = gamma;
  for (int n = 0; n < PPO_MAX_ENVS; n++)
    s->returns[n] = 0.0;
  ppo_running_init(&s->stats, 1);
}

void ppo_reward_scale(ppo_reward_scaler *s, int N, float *rewards, const float *dones) {
  /* the returns of the N envs, one row each, update the running variance together */
  float returns[PPO_MAX_ENVS];
  for (int n = 0; n < N; n++) {
    s->returns[n] = s->returns[n] * s->gamma + rewards[n];
    returns[n] = (float)s->returns[n];
  }
  ppo_running_update(&s->stats, N, returns);
  double std = sqrt(s->stats.var[0] + 1e-8);
  for (int n = 0; n < N; n++) {
    double y = rewards[n] / std;
    rewards[n] = (float)(y < -10.0 ? -10.0 : y > 10.0 ? 10.0 : y);
    if (dones[n] != 0.0f) s->returns[n] = 0.0;
  }
}

float ppo_rand_normal(uint64_t *state) {
  /* Box-Muller; 1 - u keeps the log's argument in (0, 1] */
  double u1 = 1.0 - ppo_rand_uniform(state), u2 = ppo_rand_uniform(state);
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
