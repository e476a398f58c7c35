/* The PPO agent on lutra's C API (agent.h). */
#include "agent.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call)                                                                                   \
  do {                                                                                             \
    if ((call) != LUTRA_OK) {                                                                      \
      fprintf(stderr, "ppo: %s failed: %s\n", #call, lutra_last_error());                          \
      return -1;                                                                                   \
    }                                                                                              \
  } while (0)

struct ppo_agent {
  ppo_config cfg;
  ppo_env *env;
  int obs_dim, act_dim, out_dim, batch, mb;
  long updates, env_steps;
  int t, epoch, slice;
  lutra_module *actor, *critic, *log_std, *all;
  lutra_optim *opt;
  ppo_running obs_rms;
  ppo_reward_scaler rew_scaler;
  uint64_t rng;
  ppo_stats last;
  /* the rollout, [T][N][...] */
  float *obs, *actions, *logp, *rewards, *dones, *values, *adv, *ret;
  /* the current step's: raw and normalised observations, done flags, network outputs */
  float *raw_obs, *cur_obs, *cur_done, *env_actions, *step_out, *step_ls, *step_v, *zeros;
  /* a minibatch gathered from the rollout, and the gradients fed to backward */
  float *mb_obs, *mb_act, *mb_logp, *mb_adv, *mb_ret, *mb_oldv, *mb_out, *mb_ls, *mb_v;
  float *d_out, *d_ls, *d_v;
  int *perm;
  lutra_tensor *x_step, *x_mb, *zero_step, *zero_mb, *d_out_t, *d_ls_t, *d_v_t;
};

void ppo_config_cartpole(ppo_config *c) {
  *c = (ppo_config){0};
  c->num_envs = 4;
  c->num_steps = 128;
  c->minibatches = 4;
  c->epochs = 4;
  c->hidden = 64;
  c->lr = 2.5e-4f;
  c->adam_eps = 1e-5f;
  c->gamma = 0.99f;
  c->lambda = 0.95f;
  c->clip = 0.2f;
  c->ent_coef = 0.01f;
  c->vf_coef = 0.5f;
  c->max_grad_norm = 0.5f;
  c->clip_value = 1;
  c->anneal_lr = 1;
  c->norm_obs = 1;
  c->total_steps = 500000;
  c->seed = 1;
}

/* cart-pole's, but for these */
void ppo_config_pendulum(ppo_config *c) {
  ppo_config_cartpole(c);
  c->num_steps = 1024;
  c->minibatches = 64;
  c->epochs = 10;
  c->lr = 3e-4f;
  c->gamma = 0.9f;
  c->ent_coef = 0.0f;
  c->clip_value = 0;
  c->norm_reward = 1;
  c->total_steps = 200000;
}

static int linear(int64_t in, int64_t out, uint64_t seed, lutra_module **m) {
  lutra_linear_desc d;
  lutra_linear_defaults(&d);
  d.in_features = in;
  d.out_features = out;
  d.seed = seed;
  CK(lutra_linear_new(&d, m));
  return 0;
}

/* Linear(in, h) Tanh Linear(h, h) Tanh Linear(h, out) (CleanRL's activation); the last layer's
 * weight scaled by last_scale and its bias zeroed (CleanRL's small initial policy: near-uniform
 * actions) */
static int mlp(int64_t in, int64_t h, int64_t out, uint64_t seed, float last_scale,
               lutra_module **net) {
  lutra_module *m[5] = {0};
  int bad = linear(in, h, seed, &m[0]) || linear(h, h, seed + 1, &m[2]) ||
            linear(h, out, seed + 2, &m[4]) ||
            lutra_activation_new(LUTRA_ACTIVATION_TANH, &m[1]) != LUTRA_OK ||
            lutra_activation_new(LUTRA_ACTIVATION_TANH, &m[3]) != LUTRA_OK ||
            lutra_sequential_new(m, 5, net) != LUTRA_OK;
  for (int i = 0; i < 5; i++)
    lutra_module_unref(m[i]);
  if (bad) {
    fprintf(stderr, "ppo: building an MLP failed: %s\n", lutra_last_error());
    return -1;
  }
  lutra_param w, b;
  CK(lutra_module_param(*net, 4, &w));
  CK(lutra_module_param(*net, 5, &b));
  CK(lutra_tensor_scale(w.value, last_scale));
  CK(lutra_tensor_fill(b.value, 0.0f));
  return 0;
}

static int wrap(float *data, int64_t rows, int64_t cols, lutra_tensor **t) {
  const int64_t shape[2] = {rows, cols};
  CK(lutra_tensor_wrap(data, LUTRA_F32, 2, shape, LUTRA_CPU, sizeof(float) * rows * cols, t));
  return 0;
}

/* the host arrays: one block, carved */
static int carve(ppo_agent *a) {
  size_t B = (size_t)a->batch, N = (size_t)a->cfg.num_envs, M = (size_t)a->mb;
  size_t O = (size_t)a->obs_dim, A = (size_t)a->act_dim, K = (size_t)a->out_dim;
  size_t rows = N > M ? N : M;
  struct {
    float **p;
    size_t n;
  } parts[] = {
      {&a->obs, B * O},      {&a->actions, B * A}, {&a->logp, B},       {&a->rewards, B},
      {&a->dones, B},        {&a->values, B},      {&a->adv, B},        {&a->ret, B},
      {&a->raw_obs, N * O},  {&a->cur_obs, N * O}, {&a->cur_done, N},   {&a->env_actions, N * A},
      {&a->step_out, N * K}, {&a->step_ls, N * A}, {&a->step_v, N},     {&a->zeros, rows},
      {&a->mb_obs, M * O},   {&a->mb_act, M * A},  {&a->mb_logp, M},    {&a->mb_adv, M},
      {&a->mb_ret, M},       {&a->mb_oldv, M},     {&a->mb_out, M * K}, {&a->mb_ls, M * A},
      {&a->mb_v, M},         {&a->d_out, M * K},   {&a->d_ls, M * A},   {&a->d_v, M},
  };
  size_t total = 0, count = sizeof parts / sizeof parts[0];
  for (size_t i = 0; i < count; i++)
    total += parts[i].n;
  float *block = calloc(total, sizeof(float));
  a->perm = malloc(sizeof(int) * B);
  if (!block || !a->perm) return -1;
  for (size_t i = 0; i < count; i++) {
    *parts[i].p = block;
    block += parts[i].n;
  }
  return 0;
}

int ppo_agent_new(const ppo_config *c, ppo_env *env, ppo_agent **out) {
  *out = NULL;
  if (c->num_envs != env->num_envs || c->num_steps < 1 || c->minibatches < 1 ||
      (c->num_envs * c->num_steps) % c->minibatches != 0 || env->obs_dim > PPO_NORM_MAX_DIM) {
    fprintf(stderr,
            "ppo: num_envs must be the env's, num_envs * num_steps a multiple of "
            "minibatches, obs_dim <= %d\n",
            PPO_NORM_MAX_DIM);
    return -1;
  }
  ppo_agent *a = calloc(1, sizeof *a);
  if (!a) return -1;
  *out = a;
  a->cfg = *c;
  a->env = env;
  a->obs_dim = env->obs_dim;
  a->act_dim = env->act_dim;
  a->out_dim = env->num_actions > 0 ? env->num_actions : env->act_dim;
  a->batch = c->num_envs * c->num_steps;
  a->mb = a->batch / c->minibatches;
  a->rng = c->seed * 0x2545F4914F6CDD1Dull + 7;
  ppo_running_init(&a->obs_rms, a->obs_dim);
  ppo_reward_scaler_init(&a->rew_scaler, c->gamma);
  if (carve(a)) return -1;

  uint64_t s = c->seed * 1000;
  if (mlp(a->obs_dim, c->hidden, a->out_dim, s + 1, 0.01f, &a->actor) ||
      mlp(a->obs_dim, c->hidden, 1, s + 11, 1.0f, &a->critic))
    return -1;
  /* the log-std: a Linear(1 -> act_dim) fed zeros, so that its output is its bias (zeros at
   * the start: std 1), trained by the same optimizer */
  if (linear(1, a->act_dim, s + 21, &a->log_std)) return -1;
  lutra_param w, b;
  CK(lutra_module_param(a->log_std, 0, &w));
  CK(lutra_module_param(a->log_std, 1, &b));
  CK(lutra_tensor_fill(w.value, 0.0f));
  CK(lutra_tensor_fill(b.value, 0.0f));
  lutra_module *parts[3] = {a->actor, a->critic, a->log_std};
  CK(lutra_sequential_new(parts, env->num_actions > 0 ? 2 : 3, &a->all)); /* for the optimizer */

  lutra_optim_desc od;
  lutra_optim_defaults(LUTRA_OPTIM_ADAMW, &od);
  od.lr = c->lr;
  od.eps = c->adam_eps;
  od.weight_decay = 0.0f;
  od.max_grad_norm = c->max_grad_norm;
  CK(lutra_optim_new(&od, a->all, &a->opt));

  int N = c->num_envs, M = a->mb;
  if (wrap(a->cur_obs, N, a->obs_dim, &a->x_step) || wrap(a->mb_obs, M, a->obs_dim, &a->x_mb) ||
      wrap(a->zeros, N, 1, &a->zero_step) || wrap(a->zeros, M, 1, &a->zero_mb) ||
      wrap(a->d_out, M, a->out_dim, &a->d_out_t) || wrap(a->d_ls, M, a->act_dim, &a->d_ls_t) ||
      wrap(a->d_v, M, 1, &a->d_v_t))
    return -1;

  env->reset(env, a->raw_obs);
  if (c->norm_obs) ppo_running_update(&a->obs_rms, N, a->raw_obs);
  ppo_running_apply(&a->obs_rms, N, a->raw_obs, a->cur_obs);
  return 0;
}

void ppo_agent_free(ppo_agent *a) {
  if (!a) return;
  lutra_tensor *ts[] = {a->x_step,  a->x_mb,   a->zero_step, a->zero_mb,
                        a->d_out_t, a->d_ls_t, a->d_v_t};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    if (ts[i]) lutra_tensor_unref(ts[i]);
  lutra_optim_unref(a->opt);
  lutra_module_unref(a->all);
  lutra_module_unref(a->actor);
  lutra_module_unref(a->critic);
  lutra_module_unref(a->log_std);
  free(a->obs);
  free(a->perm);
  free(a);
}

/* the networks' outputs for rows of x, copied into the host arrays out, ls (continuous) and v */
static int evaluate(ppo_agent *a, lutra_tensor *x, lutra_tensor *zero, int rows, int grad,
                    float *out, float *ls, float *v) {
  lutra_forward_args fa;
  lutra_forward_defaults(&fa);
  fa.grad = grad;
  lutra_tensor *y;
  CK(lutra_module_forward_ex(a->actor, x, &fa, &y));
  CK(lutra_tensor_get_f32(y, out, (int64_t)rows * a->out_dim));
  CK(lutra_module_forward_ex(a->critic, x, &fa, &y));
  CK(lutra_tensor_get_f32(y, v, rows));
  if (a->env->num_actions == 0) {
    CK(lutra_module_forward_ex(a->log_std, zero, &fa, &y));
    CK(lutra_tensor_get_f32(y, ls, (int64_t)rows * a->act_dim));
  }
  return 0;
}

static void start_update(ppo_agent *a) {
  int N = a->cfg.num_envs;
  /* the value of the observation after the rollout: step_v from the last evaluate */
  ppo_gae(a->cfg.num_steps, N, a->rewards, a->values, a->dones, a->step_v, a->cur_done,
          a->cfg.gamma, a->cfg.lambda, a->adv, a->ret);
  a->epoch = 0;
  a->slice = 0;
  if (a->cfg.anneal_lr) {
    long total = ppo_agent_num_updates(a);
    float frac = 1.0f - (float)a->updates / (float)(total > 0 ? total : 1);
    lutra_optim_set_lr(a->opt, a->cfg.lr * (frac > 0.0f ? frac : 0.0f));
  }
}

int ppo_agent_collect(ppo_agent *a) {
  ppo_env *e = a->env;
  int N = a->cfg.num_envs, O = a->obs_dim, A = a->act_dim, K = a->out_dim, t = a->t;
  if (evaluate(a, a->x_step, a->zero_step, N, 0, a->step_out, a->step_ls, a->step_v)) return -1;
  for (int n = 0; n < N; n++) {
    float *act = a->actions + ((size_t)t * N + n) * A;
    if (e->num_actions > 0) {
      int k = ppo_categorical_sample(K, a->step_out + n * K, ppo_rand_uniform(&a->rng));
      act[0] = (float)k;
      a->logp[t * N + n] = ppo_categorical_logp(K, a->step_out + n * K, k);
    } else {
      for (int d = 0; d < A; d++)
        act[d] = a->step_out[n * A + d] + expf(a->step_ls[n * A + d]) * ppo_rand_normal(&a->rng);
      a->logp[t * N + n] = ppo_gaussian_logp(A, a->step_out + n * A, a->step_ls + n * A, act);
    }
    memcpy(a->env_actions + n * A, act, sizeof(float) * A);
  }
  memcpy(a->obs + (size_t)t * N * O, a->cur_obs, sizeof(float) * N * O);
  memcpy(a->dones + t * N, a->cur_done, sizeof(float) * N);
  memcpy(a->values + t * N, a->step_v, sizeof(float) * N);

  e->step(e, a->env_actions, a->raw_obs, a->rewards + t * N, a->cur_done);
  if (a->cfg.norm_reward) ppo_reward_scale(&a->rew_scaler, N, a->rewards + t * N, a->cur_done);
  if (a->cfg.norm_obs) ppo_running_update(&a->obs_rms, N, a->raw_obs);
  ppo_running_apply(&a->obs_rms, N, a->raw_obs, a->cur_obs);
  a->env_steps += N;
  if (++a->t < a->cfg.num_steps) return 0;
  a->t = 0;
  /* the critic's value of the next observation bootstraps the advantages */
  if (evaluate(a, a->x_step, a->zero_step, N, 0, a->step_out, a->step_ls, a->step_v)) return -1;
  start_update(a);
  return 1;
}

static void shuffle(ppo_agent *a) {
  for (int i = 0; i < a->batch; i++)
    a->perm[i] = i;
  for (int i = a->batch - 1; i > 0; i--) {
    int j = (int)(ppo_rand_u64(&a->rng) % (uint64_t)(i + 1)), tmp = a->perm[i];
    a->perm[i] = a->perm[j];
    a->perm[j] = tmp;
  }
}

static void gather(ppo_agent *a) {
  int O = a->obs_dim, A = a->act_dim;
  for (int i = 0; i < a->mb; i++) {
    int k = a->perm[a->slice * a->mb + i];
    memcpy(a->mb_obs + (size_t)i * O, a->obs + (size_t)k * O, sizeof(float) * O);
    memcpy(a->mb_act + (size_t)i * A, a->actions + (size_t)k * A, sizeof(float) * A);
    a->mb_logp[i] = a->logp[k];
    a->mb_adv[i] = a->adv[k];
    a->mb_ret[i] = a->ret[k];
    a->mb_oldv[i] = a->values[k];
  }
}

int ppo_agent_update_slice(ppo_agent *a) {
  const ppo_config *c = &a->cfg;
  int M = a->mb;
  if (a->slice == 0) shuffle(a);
  gather(a);
  if (evaluate(a, a->x_mb, a->zero_mb, M, 1, a->mb_out, a->mb_ls, a->mb_v)) return -1;
  ppo_normalize(M, a->mb_adv);
  if (a->env->num_actions > 0)
    ppo_categorical_loss(M, a->out_dim, a->mb_out, a->mb_act, a->mb_logp, a->mb_adv, c->clip,
                         c->ent_coef, a->d_out, &a->last);
  else
    ppo_gaussian_loss(M, a->act_dim, a->mb_out, a->mb_ls, a->mb_act, a->mb_logp, a->mb_adv, c->clip,
                      c->ent_coef, a->d_out, a->d_ls, &a->last);
  ppo_value_loss(M, a->mb_v, a->mb_oldv, a->mb_ret, c->clip_value ? c->clip : 0.0f, c->vf_coef,
                 a->d_v, &a->last);
  CK(lutra_module_backward(a->actor, a->d_out_t, NULL));
  CK(lutra_module_backward(a->critic, a->d_v_t, NULL));
  if (a->env->num_actions == 0) CK(lutra_module_backward(a->log_std, a->d_ls_t, NULL));
  CK(lutra_optim_step(a->opt));
  if (++a->slice < c->minibatches) return 0;
  a->slice = 0;
  if (++a->epoch < c->epochs) return 0;
  a->updates++;
  return 1;
}

long ppo_agent_env_steps(const ppo_agent *a) {
  return a->env_steps;
}
long ppo_agent_updates(const ppo_agent *a) {
  return a->updates;
}
long ppo_agent_num_updates(const ppo_agent *a) {
  return a->cfg.total_steps / a->batch;
}
ppo_stats ppo_agent_last_stats(const ppo_agent *a) {
  return a->last;
}

uint64_t ppo_agent_hash(const ppo_agent *a) {
  uint64_t h = 1469598103934665603ull;
  int n = 0;
  if (lutra_module_num_params(a->all, &n) != LUTRA_OK) return 0;
  for (int i = 0; i < n; i++) {
    lutra_param p;
    if (lutra_module_param(a->all, i, &p) != LUTRA_OK || !p.value) return 0;
    float buf[64 * 64];
    int64_t count = p.value->numel;
    if (count > (int64_t)(sizeof buf / sizeof buf[0])) return 0;
    if (lutra_tensor_get_f32(p.value, buf, count) != LUTRA_OK) return 0;
    const unsigned char *bytes = (const unsigned char *)buf;
    for (size_t k = 0; k < sizeof(float) * (size_t)count; k++) {
      h ^= bytes[k];
      h *= 1099511628211ull;
    }
  }
  return h;
}
