/* PPO trained inside a game's frame loop, in plain C through lutra.h.
 *
 *   make examples/embed/ppo/ppo
 *   ./examples/embed/ppo/ppo [--env cartpole|pendulum] [--budget-us 2000] [--seed 1]
 *                            [--steps N] [--updates N] [--until-solved] [--every 10] [--hash]
 *
 * Each frame gets a time budget (--budget-us, the part of a frame the game gives to learning).
 * The loop first collects a rollout (one step of all N environments per work unit) and then
 * runs the update in slices, one minibatch each, fitting as many units into the frame as the
 * budget allows: a unit runs while the frame's time so far plus the recent cost of that kind of
 * unit stays within the budget (at least one unit per frame, so that learning never stalls).
 * Nothing sleeps: the game's own work would fill the rest of the frame.
 *
 * It prints the return curve (the mean return of the last 100 episodes after each update), the
 * frames' work time against the budget, and the heap allocations per frame after warm-up (the
 * first update), counted by interposing malloc (../alloc_count.h). It exits 1 if a frame
 * allocated after warm-up, or, with --until-solved, if the run ended unsolved. */
#include "../alloc_count.h"

#include "agent.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

typedef struct options {
  const char *env;
  double budget_us;
  uint64_t seed;
  long steps, updates, every;
  int until_solved, hash;
} options;

static int parse(int argc, char **argv, options *o) {
  *o = (options){.env = "cartpole", .budget_us = 2000.0, .seed = 1, .every = 10};
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(f, "--until-solved") == 0) {
      o->until_solved = 1;
    } else if (strcmp(f, "--hash") == 0) {
      o->hash = 1;
    } else if (v && strcmp(f, "--env") == 0) {
      o->env = v, i++;
    } else if (v && strcmp(f, "--budget-us") == 0) {
      o->budget_us = atof(v), i++;
    } else if (v && strcmp(f, "--seed") == 0) {
      o->seed = strtoull(v, NULL, 10), i++;
    } else if (v && strcmp(f, "--steps") == 0) {
      o->steps = atol(v), i++;
    } else if (v && strcmp(f, "--updates") == 0) {
      o->updates = atol(v), i++;
    } else if (v && strcmp(f, "--every") == 0) {
      o->every = atol(v), i++;
    } else {
      return -1;
    }
  }
  if (strcmp(o->env, "cartpole") != 0 && strcmp(o->env, "pendulum") != 0) return -1;
  return o->budget_us > 0.0 && o->every > 0 && o->steps >= 0 && o->updates >= 0 ? 0 : -1;
}

int main(int argc, char **argv) {
  options o;
  if (parse(argc, argv, &o)) {
    fprintf(stderr, "usage: ppo [--env cartpole|pendulum] [--budget-us 2000] [--seed 1] "
                    "[--steps N] [--updates N] [--until-solved] [--every 10] [--hash]\n");
    return 2;
  }
  int cartpole = strcmp(o.env, "cartpole") == 0;
  double threshold = cartpole ? 475.0 : -200.0;
  ppo_config c;
  if (cartpole)
    ppo_config_cartpole(&c);
  else
    ppo_config_pendulum(&c);
  c.seed = o.seed;
  if (o.steps) c.total_steps = o.steps;
  static ppo_env env;
  if ((cartpole ? cartpole_init : pendulum_init)(&env, c.num_envs, o.seed * 7919 + 13)) return 2;
  ppo_agent *agent = NULL;
  if (ppo_agent_new(&c, &env, &agent)) {
    ppo_agent_free(agent);
    return 2;
  }
  long last_update = o.updates ? o.updates : ppo_agent_num_updates(agent);
  printf("ppo: %s, %d envs x %d steps, %d minibatches x %d epochs, %ld updates, frame budget "
         "%.0f us, seed %llu\n",
         env.name, c.num_envs, c.num_steps, c.minibatches, c.epochs, last_update, o.budget_us,
         (unsigned long long)o.seed);

  enum { COLLECT = 0, UPDATE = 1 };
  int phase = COLLECT;
  double unit_cost[2] = {0.0, 0.0}, start = now_us(), solved_at_s = -1.0;
  double work_sum = 0.0, work_max = 0.0;
  long frames = 0, frames_timed = 0, over_budget = 0, units_total = 0, solved_steps = -1;
  unsigned long allocs_at_warmup = 0;
  int warm = 0, failed = 0, done = 0;
  while (!done && !failed) {
    if (!warm && ppo_agent_updates(agent) >= 1) {
      warm = 1;
      allocs_at_warmup = alloc_count();
    }
    double frame_start = now_us(), t = frame_start;
    do {
      int r = phase == COLLECT ? ppo_agent_collect(agent) : ppo_agent_update_slice(agent);
      double t1 = now_us(), cost = t1 - t;
      /* the recent cost of this kind of unit: its worst, fading */
      unit_cost[phase] = cost > 0.95 * unit_cost[phase] ? cost : 0.95 * unit_cost[phase];
      t = t1;
      units_total++;
      if (r < 0) {
        failed = 1;
        break;
      }
      if (r == 1 && phase == UPDATE) {
        long u = ppo_agent_updates(agent);
        double mean = env_recent_mean(&env);
        if (solved_steps < 0 && env.episodes >= ENV_RECENT && mean >= threshold) {
          solved_steps = ppo_agent_env_steps(agent);
          solved_at_s = (now_us() - start) * 1e-6;
          printf("solved: mean return %.1f over the last 100 episodes at update %ld, %ld env "
                 "steps, %.1f s\n",
                 mean, u, solved_steps, solved_at_s);
        }
        if (u % o.every == 0 || u == last_update) {
          ppo_stats s = ppo_agent_last_stats(agent);
          printf("update %ld: env steps %ld, episodes %ld, mean return (last 100) %.1f, pg %.4f, "
                 "value %.4f, entropy %.3f, kl %.5f, %.1f s\n",
                 u, ppo_agent_env_steps(agent), env.episodes, mean, s.pg_loss, s.v_loss, s.entropy,
                 s.approx_kl, (now_us() - start) * 1e-6);
        }
        if (u >= last_update || (o.until_solved && solved_steps >= 0)) done = 1;
      }
      if (r == 1) phase = 1 - phase;
    } while (!done && t - frame_start + unit_cost[phase] <= o.budget_us);
    double work = t - frame_start;
    frames++;
    if (warm) {
      frames_timed++;
      work_sum += work;
      if (work > work_max) work_max = work;
      if (work > o.budget_us) over_budget++;
    }
  }
  unsigned long allocs = warm ? alloc_count() - allocs_at_warmup : 0;
  double wall = (now_us() - start) * 1e-6;
  printf("ran %ld frames (%ld work units), %ld env steps, %ld episodes in %.1f s; mean return of "
         "the last 100 episodes %.1f (threshold %.0f)\n",
         frames, units_total, ppo_agent_env_steps(agent), env.episodes, wall, env_recent_mean(&env),
         threshold);
  if (frames_timed > 0)
    printf("frame budget %.0f us: work per frame mean %.0f us, max %.0f us; frames over budget: "
           "%ld of %ld\n",
           o.budget_us, work_sum / (double)frames_timed, work_max, over_budget, frames_timed);
  printf("allocations per frame: %lu (%lu heap allocations over %ld frames after warm-up, %lu "
         "before, counted by interposing malloc)\n",
         frames_timed ? allocs / (unsigned long)frames_timed : 0, allocs, frames_timed,
         allocs_at_warmup);
  if (o.hash) printf("parameter hash: %016llx\n", (unsigned long long)ppo_agent_hash(agent));
  ppo_agent_free(agent);
  int ok = !failed && warm && allocs == 0 && (!o.until_solved || solved_steps >= 0);
  if (warm && allocs != 0) printf("FAIL: the frame loop allocated after warm-up\n");
  if (o.until_solved && solved_steps < 0) printf("FAIL: not solved\n");
  return ok ? 0 : 1;
}
