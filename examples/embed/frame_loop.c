/* A particle simulation that learns its own physics, one training step per frame, in plain C
 * through lutra.h: what an engine embedding lutra does in its frame loop.
 *
 *   make examples/embed/frame_loop && ./examples/embed/frame_loop [frames] [particles]
 *
 * Each frame the simulation moves its particles (a spring to the centre, a vortex, drag and a
 * cubic stiffening) and a small MLP (16 -> 64 -> 64 -> 16) takes one step towards predicting
 * each particle's acceleration from its position and velocity, read from the simulation's own
 * state arrays. The middle Linear computes in FP8 (delayed scaling) and the first and last stay
 * in f32: the layers next to the data and the loss are the ones FP8 hurts most. One optimizer
 * (AdamW) covers the three parts through a Sequential holding them.
 *
 * The state lives in arrays the host owns; it is copied into lutra tensors with
 * lutra_tensor_set_f32 (a copy of 256 x 16 floats per frame). lutra_tensor_wrap, when it lands,
 * will let the tensors sit on those arrays instead.
 *
 * At the end it prints the frame budget: the mean and worst time of a training step against a
 * 60 Hz frame (16.7 ms), and the heap allocations per step after warm-up, counted by
 * interposing malloc and its relatives in this executable (alloc_count.h): every library in the
 * process allocates through them (the CPU backend's GEMMs run on one OpenBLAS thread unless
 * LUTRA_CPU_THREADS says otherwise: lutra/base.h). It exits 1 if a step allocated or the loss did
 * not fall to a tenth of its start. LUTRA_DEVICE=cuda runs the model on the GPU. */
#include "alloc_count.h"

#include <lutra.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { FEATURES = 16, HIDDEN = 64, MAX_PARTICLES = 4096, WARMUP = 20 };
static const double FRAME_MS = 1000.0 / 60.0;

#define CK(call)                                                                                   \
  do {                                                                                             \
    if ((call) != LUTRA_OK) {                                                                      \
      fprintf(stderr, "frame_loop: %s failed: %s\n", #call, lutra_last_error());                   \
      exit(2);                                                                                     \
    }                                                                                              \
  } while (0)

/* the simulation's state, owned by the host */
static float pos[MAX_PARTICLES][2], vel[MAX_PARTICLES][2], acc[MAX_PARTICLES][2];
/* what the model reads and is trained towards, built from the state each frame */
static float features[MAX_PARTICLES * FEATURES], targets[MAX_PARTICLES * FEATURES];

static uint32_t rng = 12345u;
static float uniform(float lo, float hi) {
  rng = rng * 1664525u + 1013904223u;
  return lo + (hi - lo) * (float)(rng >> 8) / 16777216.0f;
}

static void spawn(int i) {
  pos[i][0] = uniform(-1.0f, 1.0f);
  pos[i][1] = uniform(-1.0f, 1.0f);
  vel[i][0] = uniform(-0.5f, 0.5f);
  vel[i][1] = uniform(-0.5f, 0.5f);
}

/* the physics the model has to learn */
static void accelerations(int n) {
  for (int i = 0; i < n; i++) {
    float x = pos[i][0], y = pos[i][1], r2 = x * x + y * y;
    acc[i][0] = -1.5f * x - 0.8f * y - 0.3f * vel[i][0] - x * r2;
    acc[i][1] = -1.5f * y + 0.8f * x - 0.3f * vel[i][1] - y * r2;
  }
}

static void simulate(int n, long frame) {
  const float dt = 1.0f / 60.0f;
  accelerations(n);
  for (int i = 0; i < n; i++) {
    vel[i][0] += dt * acc[i][0];
    vel[i][1] += dt * acc[i][1];
    pos[i][0] += dt * vel[i][0];
    pos[i][1] += dt * vel[i][1];
  }
  /* a few particles respawn every frame, so the state keeps covering the box */
  for (int i = (int)(frame % 32); i < n; i += 32) spawn(i);
  accelerations(n);
}

static void build_batch(int n) {
  memset(features, 0, sizeof(float) * (size_t)n * FEATURES);
  memset(targets, 0, sizeof(float) * (size_t)n * FEATURES);
  for (int i = 0; i < n; i++) {
    float *f = features + (size_t)i * FEATURES, *t = targets + (size_t)i * FEATURES;
    f[0] = pos[i][0];
    f[1] = pos[i][1];
    f[2] = vel[i][0];
    f[3] = vel[i][1];
    t[0] = acc[i][0];
    t[1] = acc[i][1];
  }
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static lutra_module *linear(int64_t in, int64_t out, int device, uint64_t seed) {
  lutra_linear_desc d;
  lutra_linear_defaults(&d);
  d.in_features = in;
  d.out_features = out;
  d.device = device;
  d.seed = seed;
  lutra_module *m = NULL;
  CK(lutra_linear_new(&d, &m));
  return m;
}

/* a Sequential of one or two modules; it holds them, so this function's references go */
static lutra_module *chain(lutra_module *a, lutra_module *b) {
  lutra_module *mods[2] = {a, b}, *seq = NULL;
  CK(lutra_sequential_new(mods, b ? 2 : 1, &seq));
  lutra_module_unref(a);
  lutra_module_unref(b);
  return seq;
}

int main(int argc, char **argv) {
  long frames = argc > 1 ? atol(argv[1]) : 600;
  int n = argc > 2 ? atoi(argv[2]) : 256;
  if (frames <= WARMUP || n < 16 || n > MAX_PARTICLES || n % 16 != 0) {
    fprintf(stderr, "usage: frame_loop [frames > %d] [particles: a multiple of 16, <= %d]\n",
            WARMUP, MAX_PARTICLES);
    return 2;
  }
  const char *dev = getenv("LUTRA_DEVICE");
  int device = dev && strcmp(dev, "cuda") == 0 ? LUTRA_CUDA : LUTRA_CPU;

  /* FP8 for the middle Linear only: the model is three parts, and the autocast scope is entered
   * around the middle one's forward */
  lutra_module *g1 = NULL, *g2 = NULL;
  CK(lutra_gelu_new(&g1));
  CK(lutra_gelu_new(&g2));
  lutra_module *head = chain(linear(FEATURES, HIDDEN, device, 1), g1);
  lutra_module *core = chain(linear(HIDDEN, HIDDEN, device, 2), g2);
  lutra_module *tail = chain(linear(HIDDEN, FEATURES, device, 3), NULL);
  lutra_module *parts[3] = {head, core, tail}, *model = NULL;
  CK(lutra_sequential_new(parts, 3, &model)); /* for the optimizer: every part's parameters */

  lutra_delayed_desc rd;
  lutra_delayed_defaults(&rd);
  rd.amax_history_len = 16;
  lutra_recipe *recipe = NULL;
  lutra_autocast *fp8 = NULL;
  CK(lutra_recipe_delayed(&rd, &recipe));
  CK(lutra_autocast_new(recipe, NULL, 1, 0, &fp8));
  lutra_optim_desc od;
  lutra_optim_defaults(LUTRA_OPTIM_ADAMW, &od);
  od.lr = 3e-3f;
  lutra_optim *opt = NULL;
  CK(lutra_optim_new(&od, model, &opt));
  lutra_loss *mse = NULL;
  CK(lutra_loss_new(LUTRA_LOSS_MSE, &mse));
  const int64_t shape[2] = {n, FEATURES};
  lutra_tensor *x = NULL, *target = NULL;
  CK(lutra_tensor_new(LUTRA_F32, 2, shape, device, &x));
  CK(lutra_tensor_new(LUTRA_F32, 2, shape, device, &target));

  for (int i = 0; i < n; i++) spawn(i);
  printf("frame_loop: %d particles, MLP %d-%d-%d-%d (middle Linear in FP8, delayed scaling), %s\n",
         n, FEATURES, HIDDEN, HIDDEN, FEATURES, device == LUTRA_CUDA ? "cuda" : "cpu");

  double step_total = 0.0, step_max = 0.0, sim_total = 0.0, first_loss = 0.0, last_loss = 0.0;
  long over_budget = 0;
  unsigned long allocs_at_warmup = 0;
  for (long frame = 0; frame < frames; frame++) {
    if (frame == WARMUP) allocs_at_warmup = alloc_count();
    double t0 = now_ms();
    simulate(n, frame);
    build_batch(n);
    double t1 = now_ms();

    lutra_tensor *h1, *h2, *y, *lv, *dy, *d2, *d1;
    CK(lutra_tensor_set_f32(x, features, (int64_t)n * FEATURES));
    CK(lutra_tensor_set_f32(target, targets, (int64_t)n * FEATURES));
    CK(lutra_module_forward(head, x, LUTRA_FIRST_MICROBATCH_NONE, &h1));
    CK(lutra_autocast_enter(fp8));
    int st = lutra_module_forward(core, h1, LUTRA_FIRST_MICROBATCH_NONE, &h2);
    CK(lutra_autocast_exit(fp8)); /* exited before a failure is reported: no scope left open */
    CK(st);
    CK(lutra_module_forward(tail, h2, LUTRA_FIRST_MICROBATCH_NONE, &y));
    CK(lutra_loss_forward(mse, y, target, &lv));
    CK(lutra_loss_backward(mse, &dy));
    CK(lutra_module_backward(tail, dy, &d2));
    CK(lutra_module_backward(core, d2, &d1));
    CK(lutra_module_backward(head, d1, NULL)); /* x is data: no gradient for it */
    CK(lutra_optim_step(opt));
    float loss = 0.0f;
    CK(lutra_loss_value(mse, &loss));
    double t2 = now_ms();

    if (frame >= WARMUP) {
      step_total += t2 - t1;
      sim_total += t1 - t0;
      if (t2 - t1 > step_max) step_max = t2 - t1;
      if (t2 - t0 > FRAME_MS) over_budget++;
    }
    if (frame < 10) first_loss += loss / 10.0;
    if (frame >= frames - 10) last_loss += loss / 10.0;
    if ((frame + 1) % 100 == 0) printf("frame %ld: loss %.5f\n", frame + 1, loss);
  }
  unsigned long allocs = alloc_count() - allocs_at_warmup;
  long timed = frames - WARMUP;

  printf("loss: %.5f over the first 10 frames, %.5f over the last 10\n", first_loss, last_loss);
  printf("frame budget %.1f ms (60 Hz): training step mean %.3f ms, max %.3f ms; simulation "
         "%.3f ms; frames over budget: %ld of %ld\n",
         FRAME_MS, step_total / (double)timed, step_max, sim_total / (double)timed, over_budget,
         timed);
  printf("allocations per step: %lu (%lu heap allocations over frames %d..%ld, %lu before them, "
         "counted by interposing malloc)\n",
         allocs / (unsigned long)timed, allocs, WARMUP + 1, frames, allocs_at_warmup);

  lutra_tensor_unref(x);
  lutra_tensor_unref(target);
  lutra_loss_unref(mse);
  lutra_optim_unref(opt);
  lutra_module_unref(model);
  lutra_module_unref(head);
  lutra_module_unref(core);
  lutra_module_unref(tail);
  lutra_autocast_unref(fp8);
  lutra_recipe_unref(recipe);
  int ok = allocs == 0 && last_loss < 0.1 * first_loss;
  if (allocs != 0)
    printf("FAIL: the frame loop allocated after warm-up%s\n",
           device == LUTRA_CPU && lutra_cpu_threads() > 1
               ? " (OpenBLAS's threaded GEMMs allocate per call: LUTRA_CPU_THREADS=1, the default)"
               : "");
  if (!(last_loss < 0.1 * first_loss)) printf("FAIL: the loss did not fall to a tenth\n");
  return ok ? 0 : 1;
}
