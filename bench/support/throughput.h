/* The harness of bench/cuda_throughput.c: ops (lutra's and the raw library calls beside them)
 * timed on their own streams in alternating batches of host wall time, with CUDA events on the
 * raw stream as a check; the markdown result table; the bf16 tensors and E4M3 recipes the
 * figures use. Included once, by that program (its static state lives here). */
#ifndef LUTRA_BENCH_THROUGHPUT_H
#define LUTRA_BENCH_THROUGHPUT_H

#include "lutra.h"

#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checks.h"

/* ---- status checks: CK, CB, LU (support/checks.h), and die ----------------------------- */

static _Noreturn void die(const char *msg) {
  fprintf(stderr, "cuda_throughput: %s\n", msg);
  exit(1);
}

/* ---- timing --------------------------------------------------------------------------- */

enum { BATCHES = 9, MIN_REPS = 20, MAX_REPS = 100000, MAX_OPS = 8 };
static const double TARGET_BATCH_S = 10e-3;
static const size_t RAW_WORKSPACE = (size_t)32 << 20;

static cudaStream_t raw_stream;
static cudaEvent_t ev0, ev1;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct bench_op {
  const char *name;
  void (*run)(void *ctx); /* issues one op; exits on failure */
  void *ctx;
  int on_lutra; /* 1: lutra's stream, 0: the raw stream */
  int reps;
  double sec[BATCHES];     /* host-timed seconds per call, per batch */
  double ev_sec[BATCHES];  /* raw ops: event-timed seconds per call, per batch */
  double median, min, max; /* host-timed, seconds per call */
  double ev_median;        /* raw ops only */
} bench_op;

static void sync_all(void) {
  LU(lutra_device_synchronize(LUTRA_CUDA));
  CK(cudaStreamSynchronize(raw_stream));
}

static void sync_own(const bench_op *o) {
  if (o->on_lutra)
    LU(lutra_device_synchronize(LUTRA_CUDA));
  else
    CK(cudaStreamSynchronize(raw_stream));
}

/* One batch of reps calls: host seconds per call; *ev gets event seconds per call (raw ops). */
static double run_batch(bench_op *o, int reps, double *ev) {
  sync_all();
  if (!o->on_lutra) CK(cudaEventRecord(ev0, raw_stream));
  double t0 = now_s();
  for (int i = 0; i < reps; i++)
    o->run(o->ctx);
  if (!o->on_lutra) CK(cudaEventRecord(ev1, raw_stream));
  sync_own(o);
  double t1 = now_s();
  if (ev) {
    *ev = 0;
    if (!o->on_lutra) {
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, ev0, ev1));
      *ev = (double)ms * 1e-3 / reps;
    }
  }
  return (t1 - t0) / reps;
}

static double median_of(const double *v, int n) {
  double s[BATCHES];
  memcpy(s, v, (size_t)n * sizeof *v);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  return s[n / 2];
}

/* Warm up every op, pick one batch size for the group, then time BATCHES rounds in which the
 * ops take turns. */
static void bench_group(bench_op *ops, int n) {
  double tmin = 1e30;
  for (int i = 0; i < n; i++) {
    run_batch(&ops[i], 3, NULL); /* warm-up: plans, allocations, clocks */
    double t = run_batch(&ops[i], 3, NULL);
    if (t < tmin) tmin = t;
  }
  double want = ceil(TARGET_BATCH_S / (tmin > 0 ? tmin : 1e-9));
  int reps = want < MIN_REPS ? MIN_REPS : want > MAX_REPS ? MAX_REPS : (int)want;
  for (int b = 0; b < BATCHES; b++)
    for (int i = 0; i < n; i++)
      ops[i].sec[b] = run_batch(&ops[i], reps, &ops[i].ev_sec[b]);
  for (int i = 0; i < n; i++) {
    bench_op *o = &ops[i];
    o->reps = reps;
    o->median = median_of(o->sec, BATCHES);
    o->min = o->max = o->sec[0];
    for (int b = 1; b < BATCHES; b++) {
      if (o->sec[b] < o->min) o->min = o->sec[b];
      if (o->sec[b] > o->max) o->max = o->sec[b];
    }
    o->ev_median = o->on_lutra ? 0 : median_of(o->ev_sec, BATCHES);
  }
}

/* ---- the result table ----------------------------------------------------------------- */

enum { MAX_ROWS = 32 };
typedef struct row {
  char what[192], lutra[64], ref[64], ratio[64];
} row;
static row rows[MAX_ROWS];
static int nrows;

static void add_row(const char *what, const char *lutra, const char *ref, const char *ratio) {
  if (nrows == MAX_ROWS) die("too many table rows");
  row *r = &rows[nrows++];
  snprintf(r->what, sizeof r->what, "%s", what);
  snprintf(r->lutra, sizeof r->lutra, "%s", lutra);
  snprintf(r->ref, sizeof r->ref, "%s", ref);
  snprintf(r->ratio, sizeof r->ratio, "%s", ratio);
}

static char header[512];

static void print_table(FILE *f) {
  fprintf(f, "%s\n\n", header);
  fprintf(f, "| what | lutra | raw / copy | ratio |\n|---|---:|---:|---:|\n");
  for (int i = 0; i < nrows; i++)
    fprintf(f, "| %s | %s | %s | %s |\n", rows[i].what, rows[i].lutra, rows[i].ref, rows[i].ratio);
}

/* ---- lutra objects -------------------------------------------------------------------- */

static lutra_tensor *new_randn(int64_t r, int64_t c, uint64_t seed) {
  int64_t shape[2] = {r, c};
  lutra_tensor *t;
  LU(lutra_tensor_new(LUTRA_BF16, 2, shape, LUTRA_CUDA, &t));
  LU(lutra_tensor_randn(t, seed, 0.0f, 1.0f));
  return t;
}

static lutra_tensor *new_empty(int64_t r, int64_t c) {
  int64_t shape[2] = {r, c};
  lutra_tensor *t;
  LU(lutra_tensor_new(LUTRA_BF16, 2, shape, LUTRA_CUDA, &t));
  return t;
}

static void expect_e4m3(const lutra_recipe *r, int role, const char *what) {
  int kind, dtype;
  LU(lutra_recipe_role(r, role, &kind, &dtype));
  if (dtype != LUTRA_E4M3) {
    fprintf(stderr, "cuda_throughput: the %s recipe quantizes to %s, not e4m3\n", what,
            lutra_dtype_name(dtype));
    exit(1);
  }
}

static lutra_recipe *recipe_current(void) {
  lutra_current_desc d;
  lutra_current_defaults(&d);
  d.fp8_format = LUTRA_FORMAT_E4M3;
  lutra_recipe *r;
  LU(lutra_recipe_current(&d, &r));
  expect_e4m3(r, LUTRA_ROLE_INPUT, "current-scaling");
  expect_e4m3(r, LUTRA_ROLE_WEIGHT, "current-scaling");
  return r;
}

static lutra_recipe *recipe_delayed(void) {
  lutra_delayed_desc d;
  lutra_delayed_defaults(&d);
  d.fp8_format = LUTRA_FORMAT_E4M3;
  lutra_recipe *r;
  LU(lutra_recipe_delayed(&d, &r));
  expect_e4m3(r, LUTRA_ROLE_INPUT, "delayed-scaling");
  return r;
}

static lutra_recipe *recipe_mxfp8(void) {
  lutra_mxfp8_desc d;
  lutra_mxfp8_defaults(&d);
  d.fp8_format = LUTRA_FORMAT_E4M3;
  lutra_recipe *r;
  LU(lutra_recipe_mxfp8(&d, &r));
  expect_e4m3(r, LUTRA_ROLE_INPUT, "MXFP8");
  return r;
}

#endif
