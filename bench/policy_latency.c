/* Per-action latency of a small policy's inference forward on the CPU backend, from C (what an
 * engine embedding lutra pays to pick an action): an MLP obs 32 -> 64 -> ReLU -> 64 -> ReLU -> 8
 * (a "64-64" policy, Stable-Baselines' default width), forward with grad = 0 (nothing kept for a
 * backward) at batch 1 (one agent) and batch 64 (a vector of environments), with the weights as
 * trained and packed for inference (lutra_cpu_set_inference_pack). The same model is
 * exported to ONNX (lutra_export_onnx) for bench/policy_latency_ort.py, which times ONNX Runtime
 * on it; the input and lutra's output at batch 64 are written beside it so that the script checks
 * both give the same actions' logits.
 *
 * Method: 2000 warm-up calls, then ROUNDS rounds of CALLS calls each, timed with CLOCK_MONOTONIC
 * around the round; a call's time is its round's mean and the figure is the median over rounds.
 * One thread (lutra_cpu_set_threads(1), lutra's default: the GEMMs of these shapes are far too
 * small to split).
 *
 * Build and run (make build/policy_latency does the same):
 *   cc -std=c11 -O2 -Isrc bench/policy_latency.c -o build/policy_latency -L. -llutra \
 *     -Wl,-rpath,$PWD
 *   build/policy_latency [OUT_DIR]   # writes OUT_DIR/policy.onnx, x64.bin, y64.bin (default build)
 *   python3 bench/policy_latency_ort.py [OUT_DIR] */
#define _POSIX_C_SOURCE 200809L
#include "lutra.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { OBS = 32, HIDDEN = 64, ACT = 8, ROUNDS = 41, WARMUP = 2000 };

#define CHECK(call)                                                                                \
  do {                                                                                             \
    if ((call) != LUTRA_OK) {                                                                      \
      fprintf(stderr, "%s: %s\n", #call, lutra_last_error());                                      \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static lutra_module *policy(void) {
  lutra_module *layers[5];
  const int64_t dims[][2] = {{OBS, HIDDEN}, {HIDDEN, HIDDEN}, {HIDDEN, ACT}};
  for (int i = 0; i < 3; i++) {
    lutra_linear_desc d;
    lutra_linear_defaults(&d);
    d.in_features = dims[i][0];
    d.out_features = dims[i][1];
    d.seed = 100 + (uint64_t)i;
    CHECK(lutra_linear_new(&d, &layers[2 * i]));
    if (i < 2) CHECK(lutra_activation_new(LUTRA_ACTIVATION_RELU, &layers[2 * i + 1]));
  }
  lutra_module *net;
  CHECK(lutra_sequential_new(layers, 5, &net));
  for (int i = 0; i < 5; i++)
    CHECK(lutra_module_unref(layers[i]));
  return net;
}

/* the median over ROUNDS of the mean time of one forward in a round of calls calls, in us */
static double fastest_us; /* the fastest round of the last median_us */

static double median_us(lutra_module *net, const lutra_tensor *x, int calls) {
  lutra_forward_args a;
  lutra_forward_defaults(&a);
  a.grad = 0;
  lutra_tensor *y;
  for (int i = 0; i < WARMUP; i++)
    CHECK(lutra_module_forward_ex(net, x, &a, &y));
  double t[ROUNDS];
  for (int r = 0; r < ROUNDS; r++) {
    double t0 = now();
    for (int i = 0; i < calls; i++)
      lutra_module_forward_ex(net, x, &a, &y);
    t[r] = (now() - t0) / calls * 1e6;
  }
  qsort(t, ROUNDS, sizeof *t, by_value);
  fastest_us = t[0];
  return t[ROUNDS / 2];
}

static void write_file(const char *dir, const char *name, const void *data, size_t bytes) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, bytes, f) != bytes || fclose(f) != 0) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(1);
  }
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : "build";
  CHECK(lutra_cpu_set_threads(1));
  lutra_module *net = policy();
  char model[512];
  snprintf(model, sizeof model, "%s/policy.onnx", dir);
  lutra_onnx_options o;
  lutra_onnx_defaults(&o);
  o.input_shape[0] = 0; /* a dynamic batch: one file for both sizes */
  o.input_shape[1] = OBS;
  CHECK(lutra_export_onnx(net, model, &o));
  printf("policy %d -> %d -> %d -> %d (ReLU), f32, 1 thread; exported to %s\n", OBS, HIDDEN, HIDDEN,
         ACT, model);
  const int batches[] = {1, 64}, calls[] = {20000, 2000};
  for (int k = 0; k < 2; k++) {
    const int64_t shape[2] = {batches[k], OBS};
    lutra_tensor *x;
    CHECK(lutra_tensor_new(LUTRA_F32, 2, shape, LUTRA_CPU, &x));
    CHECK(lutra_tensor_randn(x, 7, 0.0f, 1.0f));
    /* the weights as trained, then packed for inference (lutra_cpu_set_inference_pack) */
    for (int pack = 0; pack < 2; pack++) {
      CHECK(lutra_cpu_set_inference_pack(pack));
      const double median = median_us(net, x, calls[k]);
      printf("lutra %sbatch %2d: %.3f us per forward (median of %d rounds of %d; fastest %.3f)\n",
             pack ? "packed " : "", batches[k], median, ROUNDS, calls[k], fastest_us);
    }
    CHECK(lutra_cpu_set_inference_pack(0));
    if (batches[k] == 64) {
      static float xs[64 * OBS], ys[64 * ACT];
      lutra_forward_args a;
      lutra_forward_defaults(&a);
      a.grad = 0;
      lutra_tensor *y;
      CHECK(lutra_module_forward_ex(net, x, &a, &y));
      CHECK(lutra_tensor_get_f32(x, xs, 64 * OBS));
      CHECK(lutra_tensor_get_f32(y, ys, 64 * ACT));
      write_file(dir, "x64.bin", xs, sizeof xs);
      write_file(dir, "y64.bin", ys, sizeof ys);
    }
    CHECK(lutra_tensor_unref(x));
  }
  CHECK(lutra_module_unref(net));
  return 0;
}
