/* Threads training their own models at once must get, bit for bit, what one thread gets alone.
 *
 *   threads_check cpu|cuda [steps]
 *
 * For each recipe (delayed, current, mxfp8, block) a model (Linear 128->256, GELU, Linear
 * 256->128, with biases: FP8 GEMMs, the fused GELU epilogues, bias gradients over enough rows
 * for the partial sums, an MSE loss, AdamW) is trained by one thread alone, then by 2 and by 4
 * threads at once, each thread its own model from the same seeds; every thread's final loss and
 * parameters must equal the lone thread's byte for byte. Then threads are started and joined one
 * after another: the per-thread caches (GEMM plans and workspaces; on cuda the thread's stream
 * and scratch) must all be released at their exit (lutra_thread_caches; the cuBLASLt handle goes
 * back to a list the next thread takes from), and the host heap must not grow with the number of
 * threads. LUTRA_GEMM_GRAPHS is read at load: run it once with LUTRA_GEMM_GRAPHS=0 and once
 * without to cover both GEMM paths on cuda.
 *
 * Prints one line per check ("ok ..." or "FAIL ...") and a summary; exits 1 on any failure. */
#include "lutra.h"

#include <execinfo.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* src/backend/device.h: exported for this check, not part of lutra.h */
int lutra_thread_caches(int *gemm, int *cuda);
/* src/fp8/autocast.h: threads whose autocast update lists are not released yet */
int lutra_autocast_live_threads(void);

enum { BATCH = 256, IN = 128, HIDDEN = 256, OUT = 128, MAX_THREADS = 4, MAX_PARAMS = 8 };

static int device = LUTRA_CPU;
static int steps = 6;

typedef struct result {
  int status; /* LUTRA_OK, or the failing call's status */
  char error[256];
  float loss;
  int nparams;
  size_t bytes[MAX_PARAMS];
  unsigned char *data[MAX_PARAMS];
} result;

typedef struct job {
  int recipe;
  result res;
} job;

#define TRY(call)                                                                                  \
  do {                                                                                             \
    int st_ = (call);                                                                              \
    if (st_ != LUTRA_OK) {                                                                         \
      r->status = st_;                                                                             \
      snprintf(r->error, sizeof r->error, "%s: %s", #call, lutra_last_error());                    \
      goto done;                                                                                   \
    }                                                                                              \
  } while (0)

static int make_recipe(int kind, lutra_recipe **out) {
  switch (kind) {
  case LUTRA_RECIPE_DELAYED: {
    lutra_delayed_desc d;
    lutra_delayed_defaults(&d);
    return lutra_recipe_delayed(&d, out);
  }
  case LUTRA_RECIPE_CURRENT: {
    lutra_current_desc d;
    lutra_current_defaults(&d);
    return lutra_recipe_current(&d, out);
  }
  case LUTRA_RECIPE_MXFP8: {
    lutra_mxfp8_desc d;
    lutra_mxfp8_defaults(&d);
    return lutra_recipe_mxfp8(&d, out);
  }
  default: {
    lutra_block_desc d;
    lutra_block_defaults(&d);
    return lutra_recipe_block(&d, out);
  }
  }
}

static const char *recipe_name(int kind) {
  static const char *const names[] = {"delayed", "current", "mxfp8", "block"};
  return kind >= 0 && kind < 4 ? names[kind] : "?";
}

/* One thread's whole life with lutra: everything it makes, it frees. */
static void train(int recipe_kind, result *r) {
  lutra_recipe *recipe = NULL;
  lutra_autocast *scope = NULL;
  lutra_module *l1 = NULL, *act = NULL, *l2 = NULL, *net = NULL;
  lutra_loss *loss = NULL;
  lutra_optim *opt = NULL;
  lutra_tensor *x = NULL, *target = NULL;
  memset(r, 0, sizeof *r);
  TRY(make_recipe(recipe_kind, &recipe));
  TRY(lutra_autocast_new(recipe, NULL, 1, 0, &scope));
  lutra_linear_desc d;
  lutra_linear_defaults(&d);
  d.device = device;
  d.in_features = IN;
  d.out_features = HIDDEN;
  d.seed = 11;
  TRY(lutra_linear_new(&d, &l1));
  TRY(lutra_gelu_new(&act));
  d.in_features = HIDDEN;
  d.out_features = OUT;
  d.seed = 12;
  TRY(lutra_linear_new(&d, &l2));
  lutra_module *mods[] = {l1, act, l2};
  TRY(lutra_sequential_new(mods, 3, &net));
  const int64_t xs[] = {BATCH, IN}, ts[] = {BATCH, OUT};
  TRY(lutra_tensor_new(LUTRA_F32, 2, xs, device, &x));
  TRY(lutra_tensor_new(LUTRA_F32, 2, ts, device, &target));
  TRY(lutra_tensor_randn(x, 21, 0.0f, 1.0f));
  TRY(lutra_tensor_randn(target, 22, 0.0f, 1.0f));
  TRY(lutra_loss_new(LUTRA_LOSS_MSE, &loss));
  lutra_optim_desc od;
  lutra_optim_defaults(LUTRA_OPTIM_ADAMW, &od);
  od.lr = 1e-3f;
  TRY(lutra_optim_new(&od, net, &opt));
  for (int s = 0; s < steps; s++) {
    lutra_tensor *y, *lv, *dy;
    TRY(lutra_autocast_enter(scope));
    int st = lutra_module_forward(net, x, LUTRA_FIRST_MICROBATCH_NONE, &y);
    TRY(lutra_autocast_exit(scope));
    TRY(st);
    TRY(lutra_loss_forward(loss, y, target, &lv));
    TRY(lutra_loss_backward(loss, &dy));
    TRY(lutra_module_backward(net, dy, NULL));
    TRY(lutra_optim_step(opt));
  }
  TRY(lutra_loss_value(loss, &r->loss));
  int n = 0;
  TRY(lutra_module_num_params(net, &n));
  for (int i = 0; i < n && r->nparams < MAX_PARAMS; i++) {
    lutra_param p;
    TRY(lutra_module_param(net, i, &p));
    if (!p.value) continue;
    size_t bytes = (size_t)p.value->numel * lutra_dtype_size(p.value->dtype);
    unsigned char *buf = malloc(bytes);
    if (!buf) {
      r->status = LUTRA_ENOMEM;
      snprintf(r->error, sizeof r->error, "out of host memory");
      goto done;
    }
    r->data[r->nparams] = buf;
    r->bytes[r->nparams++] = bytes;
    TRY(lutra_tensor_get_bytes(p.value, 0, buf, bytes));
  }
done:
  lutra_optim_unref(opt);
  lutra_loss_unref(loss);
  lutra_tensor_unref(x);
  lutra_tensor_unref(target);
  lutra_module_unref(net);
  lutra_module_unref(l1);
  lutra_module_unref(act);
  lutra_module_unref(l2);
  lutra_autocast_unref(scope);
  lutra_recipe_unref(recipe);
}

static void *thread_main(void *arg) {
  job *j = arg;
  train(j->recipe, &j->res);
  return NULL;
}

static void result_free(result *r) {
  for (int i = 0; i < r->nparams; i++)
    free(r->data[i]);
  r->nparams = 0;
}

/* runs n threads at once, each training its own model; 0 when they could all be started */
static int run_threads(int recipe, int n, job *jobs) {
  pthread_t t[MAX_THREADS];
  int started = 0;
  for (int i = 0; i < n; i++) {
    jobs[i].recipe = recipe;
    if (pthread_create(&t[i], NULL, thread_main, &jobs[i]) != 0) break;
    started++;
  }
  for (int i = 0; i < started; i++)
    pthread_join(t[i], NULL);
  return started == n ? 0 : -1;
}

/* the first difference of got from want, in words; NULL when identical */
static const char *compare(const result *got, const result *want, char *why, size_t len) {
  if (got->status != LUTRA_OK) {
    snprintf(why, len, "failed: %s", got->error);
    return why;
  }
  if (memcmp(&got->loss, &want->loss, sizeof got->loss) != 0) {
    snprintf(why, len, "final loss %.9g, alone %.9g (|d| %.3g)", got->loss, want->loss,
             (double)(got->loss > want->loss ? got->loss - want->loss : want->loss - got->loss));
    return why;
  }
  if (got->nparams != want->nparams) {
    snprintf(why, len, "%d parameters, alone %d", got->nparams, want->nparams);
    return why;
  }
  for (int i = 0; i < want->nparams; i++) {
    if (got->bytes[i] != want->bytes[i] || memcmp(got->data[i], want->data[i], want->bytes[i])) {
      size_t k = 0;
      while (k < want->bytes[i] && got->data[i][k] == want->data[i][k])
        k++;
      snprintf(why, len, "parameter %d differs from byte %zu on", i, k);
      return why;
    }
  }
  return NULL;
}

static size_t heap_in_use(void) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
#else
  return 0;
#endif
}

/* A scope entered on one thread and exited from another must be refused, saying so, and leave
 * the entering thread's state as it was. */
typedef struct cross_exit {
  lutra_autocast *scope;
  int status;
  char error[256];
} cross_exit;

static void *exit_elsewhere(void *arg) {
  cross_exit *c = arg;
  c->status = lutra_autocast_exit(c->scope);
  snprintf(c->error, sizeof c->error, "%s", lutra_last_error());
  return NULL;
}

static int check_cross_thread_exit(void) {
  lutra_recipe *r = NULL;
  lutra_autocast *scope = NULL;
  if (make_recipe(LUTRA_RECIPE_DELAYED, &r) != LUTRA_OK ||
      lutra_autocast_new(r, NULL, 1, 0, &scope) != LUTRA_OK ||
      lutra_autocast_enter(scope) != LUTRA_OK) {
    printf("FAIL cross-thread exit: setup: %s\n", lutra_last_error());
    return 1;
  }
  cross_exit c = {.scope = scope, .status = LUTRA_OK};
  pthread_t t;
  pthread_create(&t, NULL, exit_elsewhere, &c);
  pthread_join(t, NULL);
  int depth = 0, enabled = 0, calibrating = 0;
  lutra_autocast_state(&depth, &enabled, &calibrating);
  int bad = c.status != LUTRA_ESTATE || !strstr(c.error, "another thread") || depth != 1 ||
            lutra_autocast_exit(scope) != LUTRA_OK;
  if (bad)
    printf("FAIL cross-thread exit: status %d (%s), depth %d after it\n", c.status, c.error, depth);
  else
    printf("ok cross-thread exit refused: %s\n", c.error);
  lutra_autocast_unref(scope);
  lutra_recipe_unref(r);
  return bad;
}

/* A crash prints the crashing thread's frames (the library's as liblutra.so+offset, for
 * addr2line against the unstripped library) before the process dies as it would have. */
static void on_crash(int sig) {
  static const char msg[] = "threads_check: crashed; the crashing thread's frames:\n";
  void *frames[64];
  const int n = backtrace(frames, 64);
  (void)!write(2, msg, sizeof msg - 1);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

int main(int argc, char **argv) {
  signal(SIGSEGV, on_crash);
  signal(SIGBUS, on_crash);
  signal(SIGABRT, on_crash);
  /* line-buffered: the checks printed before a crash are not lost with it */
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2 || (strcmp(argv[1], "cpu") && strcmp(argv[1], "cuda"))) {
    fprintf(stderr, "usage: %s cpu|cuda [steps]\n", argv[0]);
    return 2;
  }
  device = strcmp(argv[1], "cuda") == 0 ? LUTRA_CUDA : LUTRA_CPU;
  if (argc > 2) steps = atoi(argv[2]);
  if (!lutra_device_available(device)) {
    printf("FAIL device %s is not available: %s\n", argv[1], lutra_last_error());
    return 1;
  }
  /* the main thread's own caches (asking for the device may have made them) stay live: what the
   * checks below count is what the worker threads leave behind */
  int base_gemm = 0, base_cuda = 0;
  lutra_thread_caches(&base_gemm, &base_cuda);
  const int base_autocast = lutra_autocast_live_threads();
  const char *graphs = getenv("LUTRA_GEMM_GRAPHS");
  printf("threads_check: device %s, %d steps, LUTRA_GEMM_GRAPHS=%s\n", argv[1], steps,
         graphs ? graphs : "(unset)");
  int checks = 0, failures = 0;
  static const int recipes[] = {LUTRA_RECIPE_DELAYED, LUTRA_RECIPE_CURRENT, LUTRA_RECIPE_MXFP8,
                                LUTRA_RECIPE_BLOCK};
  static const int counts[] = {2, 4};
  char why[512];
  for (size_t ri = 0; ri < sizeof recipes / sizeof *recipes; ri++) {
    const int rk = recipes[ri];
    job alone[1];
    run_threads(rk, 1, alone);
    checks++;
    if (alone[0].res.status != LUTRA_OK) {
      failures++;
      printf("FAIL recipe=%s threads=1: %s\n", recipe_name(rk), alone[0].res.error);
      continue;
    }
    /* a second lone run: the reference itself repeats */
    job again[1];
    run_threads(rk, 1, again);
    checks++;
    if (compare(&again[0].res, &alone[0].res, why, sizeof why)) {
      failures++;
      printf("FAIL recipe=%s threads=1 rerun: %s\n", recipe_name(rk), why);
    } else {
      printf("ok recipe=%s threads=1 rerun loss=%.9g\n", recipe_name(rk), alone[0].res.loss);
    }
    result_free(&again[0].res);
    for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
      const int n = counts[ci];
      job jobs[MAX_THREADS];
      memset(jobs, 0, sizeof jobs);
      if (run_threads(rk, n, jobs) != 0) {
        checks++;
        failures++;
        printf("FAIL recipe=%s threads=%d: pthread_create failed\n", recipe_name(rk), n);
        continue;
      }
      for (int i = 0; i < n; i++) {
        checks++;
        if (compare(&jobs[i].res, &alone[0].res, why, sizeof why)) {
          failures++;
          printf("FAIL recipe=%s threads=%d thread=%d: %s\n", recipe_name(rk), n, i, why);
        } else {
          printf("ok recipe=%s threads=%d thread=%d loss=%.9g\n", recipe_name(rk), n, i,
                 jobs[i].res.loss);
        }
        result_free(&jobs[i].res);
      }
    }
    result_free(&alone[0].res);
  }

  /* thread exit: every joined thread's caches are released, and the heap does not grow */
  int gemm = -1, cuda = -1;
  lutra_thread_caches(&gemm, &cuda);
  checks++;
  gemm -= base_gemm;
  cuda -= base_cuda;
  const int autocast = lutra_autocast_live_threads() - base_autocast;
  if (gemm != 0 || cuda != 0 || autocast != 0) {
    failures++;
    printf("FAIL thread exit: %d GEMM caches, %d CUDA contexts and %d autocast update lists still "
           "live after the joins\n",
           gemm, cuda, autocast);
  } else {
    printf("ok thread exit: no per-thread caches live after the joins\n");
  }
  const int churn = 24;
  const size_t heap0 = heap_in_use();
  for (int i = 0; i < churn; i++) {
    job j[1];
    run_threads(LUTRA_RECIPE_CURRENT, 1, j);
    result_free(&j[0].res);
  }
  const size_t heap1 = heap_in_use();
  lutra_thread_caches(&gemm, &cuda);
  gemm -= base_gemm;
  cuda -= base_cuda;
  checks++;
  /* a thread's caches are ~800 KB on the cpu (workspaces) and its plans on cuda: growth of a
   * small fraction of one per thread means they are freed */
  const long long growth = (long long)heap1 - (long long)heap0;
  if (gemm != 0 || cuda != 0 || growth > 64 * 1024 * churn / 4) {
    failures++;
    printf("FAIL thread churn: %d threads, heap grew %lld bytes, %d GEMM caches and %d CUDA "
           "contexts live\n",
           churn, growth, gemm, cuda);
  } else {
    printf("ok thread churn: %d threads one after another, heap grew %lld bytes, no caches "
           "live\n",
           churn, growth);
  }
  checks++;
  failures += check_cross_thread_exit();
  printf("threads_check: %d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}
