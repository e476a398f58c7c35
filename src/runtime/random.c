/* Random fills and the process-wide seed generator. The fills are deterministic functions of
 * their seed (xoshiro256** seeded by splitmix64, Box-Muller), the same on every machine and
 * backend; the generator only hands out seeds, so that calls without a seed of their own (Lua's
 * x:randn(), nn.Linear without seed) differ from each other yet repeat after
 * lutra_manual_seed. */
#include "backend/backend.h"
#include "core/error.h"
#include "core/object.h"
#include "core/dtype.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

typedef struct rng {
  uint64_t s[4];
} rng;
static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static void rng_seed(rng *r, uint64_t seed) {
  for (int i = 0; i < 4; i++)
    r->s[i] = splitmix64(&seed);
}
static uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}
static uint64_t rng_next(rng *r) {
  uint64_t *s = r->s, result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}
static double rng_unit(rng *r) {
  return (double)(rng_next(r) >> 11) * 0x1.0p-53;
} /* [0,1) */

/* One generator for the process (not per thread): seeds drawn from several threads still never
 * repeat, and a program that seeds once and draws from one thread is reproducible. */
static pthread_mutex_t seed_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t seed_state = 0x6c75747261ull; /* a fixed start: unseeded runs repeat too */

int lutra_manual_seed(uint64_t seed) {
  pthread_mutex_lock(&seed_lock);
  seed_state = seed;
  pthread_mutex_unlock(&seed_lock);
  return LUTRA_OK;
}

int lutra_seed_next(uint64_t *out) {
  static const char fn[] = "lutra_seed_next";
  CHECK_ARG(out, "out is NULL");
  pthread_mutex_lock(&seed_lock);
  *out = splitmix64(&seed_state);
  pthread_mutex_unlock(&seed_lock);
  return LUTRA_OK;
}

static int fill_random(lutra_tensor *t, uint64_t seed, float a, float b, bool normal,
                       const char *fn) {
  TRY(lutra_check_tensor(t, fn, "tensor"));
  CHECK_ARG(lutra_dtype_is_float(t->dtype), "tensor dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(t->dtype));
  CHECK_ARG(isfinite(a) && isfinite(b), "parameters must be finite");
  float *host = malloc((size_t)t->numel * 4);
  if (!host)
    return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate %lld floats", (long long)t->numel);
  rng r;
  rng_seed(&r, seed);
  for (int64_t i = 0; i < t->numel; i++) {
    if (normal) {
      double u1 = 1.0 - rng_unit(&r), u2 = rng_unit(&r);
      host[i] = (float)(a + b * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
    } else {
      host[i] = (float)(a + (b - a) * rng_unit(&r));
    }
  }
  int st = lutra_tensor_set_f32(t, host, t->numel);
  free(host);
  return st;
}

int lutra_tensor_randn(lutra_tensor *t, uint64_t seed, float mean, float stddev) {
  return fill_random(t, seed, mean, stddev, true, "lutra_tensor_randn");
}

int lutra_tensor_uniform(lutra_tensor *t, uint64_t seed, float lo, float hi) {
  return fill_random(t, seed, lo, hi, false, "lutra_tensor_uniform");
}

int lutra_seed_state(uint64_t *state) {
  static const char fn[] = "lutra_seed_state";
  CHECK_ARG(state, "state is NULL");
  pthread_mutex_lock(&seed_lock);
  *state = seed_state;
  pthread_mutex_unlock(&seed_lock);
  return LUTRA_OK;
}
