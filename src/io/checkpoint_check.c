/* Checks of a checkpoint's values (io/checkpoint_check.h).
 *
 * Locale: printf's "%a" and strtod use LC_NUMERIC's decimal point, so a host that set a comma
 * locale would write files a C-locale process refuses, and the other way round. The numbers
 * here go through the C locale for the one call, on this thread only (uselocale: other threads
 * and the host's own locale are untouched), so a file reads back exactly in any process. */
#include "io/checkpoint_check.h"
#include "core/error.h"
#include "io/crc32c.h"

#include <float.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;

static void make_c_locale(void) {
  c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
}

/* the C locale, made once; (locale_t)0 when it could not be made */
static locale_t the_c_locale(void) {
  pthread_once(&c_locale_once, make_c_locale);
  return c_locale;
}

int ckpt_format_lr(float lr, char *out, size_t n, const char *fn) {
  locale_t c = the_c_locale();
  if (!c) return lutra_error(LUTRA_ENOMEM, fn, "cannot make the C locale to write numbers in");
  locale_t old = uselocale(c);
  int len = snprintf(out, n, "%a", (double)lr); /* hex: the float exactly */
  uselocale(old);
  if (len < 0 || (size_t)len >= n) return lutra_error(LUTRA_EINVAL, fn, "cannot format lr");
  return LUTRA_OK;
}

/* s as a whole as strtod reads it in the C locale (*v), or an error naming key */
static int parse_number(const char *s, const char *key, double *v, const char *path,
                        const char *fn) {
  locale_t c = the_c_locale();
  if (!c) return lutra_error(LUTRA_ENOMEM, fn, "cannot make the C locale to read numbers in");
  char *end = NULL;
  locale_t old = uselocale(c);
  *v = strtod(s, &end);
  uselocale(old);
  /* strtod skips leading spaces; the writer never puts any */
  CHECK_ARG(*s && *s != ' ' && *s != '\t' && *s != '\n' && end != s && *end == 0,
            "'%s': __metadata__ %s '%s' is not a number", path, key, s);
  return LUTRA_OK;
}

int ckpt_parse_f32(const char *s, const char *key, bool allow_inf, float *out, const char *path,
                   const char *fn) {
  double v;
  TRY(parse_number(s, key, &v, path, fn));
  CHECK_ARG(v >= 0 && (allow_inf ? v == INFINITY || v <= FLT_MAX : v <= FLT_MAX),
            "'%s': __metadata__ %s '%s' must be >= 0 and %s", path, key, s,
            allow_inf ? "within f32's range or inf" : "finite within f32's range");
  *out = (float)v;
  return LUTRA_OK;
}

int ckpt_parse_lr(const char *s, float *lr, const char *path, const char *fn) {
  double v;
  TRY(parse_number(s, "optim.lr", &v, path, fn));
  /* lutra_optim_set_lr's rule, on the value as the file gives it (a double beyond f32's range
   * would become inf in the float) */
  CHECK_ARG(isfinite(v) && v >= 0 && v <= FLT_MAX,
            "'%s': __metadata__ optim.lr '%s' is not a learning rate lutra_optim_set_lr takes "
            "(finite, at most %g as an f32, >= 0)",
            path, s, (double)FLT_MAX);
  *lr = (float)v;
  return LUTRA_OK;
}

int ckpt_check_version(const char *version, int supported, const char *path, const char *fn) {
  CHECK_ARG(version, "'%s' is a lutra checkpoint without a version in its __metadata__", path);
  /* digits only, no sign, spaces or leading zeros: "1 " or "01" is not version 1 */
  long v = 0;
  const char *p = version;
  for (; *p >= '0' && *p <= '9' && v < 1000000; p++)
    v = v * 10 + (*p - '0');
  bool digits = p != version && *p == 0 && !(version[0] == '0' && version[1]);
  CHECK_ARG(digits,
            "'%s' has checkpoint format version '%s', which is not a version number; "
            "this lutra reads version '%d'",
            path, version, supported);
  CHECK_ARG(v == supported,
            "'%s' has checkpoint format version '%s'; this lutra reads version '%d'", path, version,
            supported);
  return LUTRA_OK;
}

static bool ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), m = strlen(tail);
  return n >= m && strcmp(s + n - m, tail) == 0;
}

static float f32_at(const st_file *f, const st_tensor *t, int64_t i) {
  float v;
  memcpy(&v, f->data + t->begin + (uint64_t)i * 4, 4);
  return v;
}

/* The file's tensor for the entry named prefix + tail, or NULL. */
static const st_tensor *sibling(const ckpt_entries *E, const st_tensor *const *src,
                                const char *name, size_t prefix, const char *tail) {
  char buf[1100];
  if (prefix + strlen(tail) >= sizeof buf) return NULL;
  memcpy(buf, name, prefix);
  strcpy(buf + prefix, tail);
  const ckpt_entry *e = ckpt_find(E, buf);
  return e ? src[e - E->e] : NULL;
}

/* Delayed scaling's forward reads the stored scale and decodes with the stored scale_inv, and
 * every scale update stores exactly 1.0f / scale (correctly rounded f32 division, on every
 * backend; inf amaxes clamp the scale to FLT_MAX, 0 and non-finite ones keep the old scale), so
 * a pair that is not finite, positive and exactly reciprocal is a file that was edited or
 * damaged, and its next forward would be all NaN or off by the ratio. The other kinds compute
 * their scale per quantization and do not read the stored one (current scaling may even store
 * a NaN scale after a NaN input, harmlessly): not checked. */
static int check_scale(const st_file *f, const ckpt_entries *E, const st_tensor *const *src, int k,
                       const char *path, const char *fn) {
  const char *name = E->e[k].name;
  size_t prefix = strlen(name) - strlen("scale");
  const st_tensor *inv = sibling(E, src, name, prefix, "scale_inv");
  if (!inv || !sibling(E, src, name, prefix, "amax_history")) return LUTRA_OK;
  float scale = f32_at(f, src[k], 0), scale_inv = f32_at(f, inv, 0);
  CHECK_ARG(isfinite(scale) && scale > 0,
            "'%s': tensor '%s' is %g; an FP8 scale must be finite and positive", path, name,
            (double)scale);
  CHECK_ARG(isfinite(scale_inv) && scale_inv > 0,
            "'%s': tensor '%.*sscale_inv' is %g; it must be finite and positive", path, (int)prefix,
            name, (double)scale_inv);
  float want = 1.0f / scale;
  CHECK_ARG(memcmp(&want, &scale_inv, 4) == 0,
            "'%s': tensor '%.*sscale_inv' is %a but its scale %a stores 1/scale = %a (delayed "
            "scaling keeps the two exactly reciprocal)",
            path, (int)prefix, name, (double)scale_inv, (double)scale, (double)want);
  return LUTRA_OK;
}

int ckpt_check_values(const st_file *f, const ckpt_entries *E, const st_tensor *const *src,
                      const char *path, const char *fn) {
  for (int k = 0; k < E->count; k++) {
    const ckpt_entry *e = &E->e[k];
    if (!src[k] || e->kind != ENTRY_STATE || strcmp(e->dtype, "F32") != 0) continue;
    if (!strstr(e->name, "fp8.")) continue;
    if (ends_with(e->name, ".scale")) TRY(check_scale(f, E, src, k, path, fn));
    if (!ends_with(e->name, ".amax_history")) continue;
    /* an amax is an absolute value: never negative. Inf and NaN are what a forward over
     * non-finite inputs records, and the update keeps the old scale for them, as in the run
     * that saved them. */
    int64_t n = (int64_t)(e->bytes / 4);
    for (int64_t i = 0; i < n; i++) {
      float a = f32_at(f, src[k], i);
      CHECK_ARG(!(a < 0), "'%s': tensor '%s' holds %g at %lld; an amax is never negative", path,
                e->name, (double)a, (long long)i);
    }
  }
  return LUTRA_OK;
}

int ckpt_check_crc(const st_file *f, const char *path, const char *fn) {
  const char *want = st_meta(f, CKPT_CRC_KEY);
  if (!want) return LUTRA_OK;
  bool hex = strlen(want) == 8;
  for (int i = 0; hex && i < 8; i++)
    hex = (want[i] >= '0' && want[i] <= '9') || (want[i] >= 'a' && want[i] <= 'f');
  CHECK_ARG(hex, "'%s': __metadata__ " CKPT_CRC_KEY " '%s' is not 8 lowercase hex digits", path,
            want);
  uint32_t crc = crc32c_extend(0, f->data, f->size);
  char got[9];
  snprintf(got, sizeof got, "%08x", (unsigned)crc);
  CHECK_ARG(strcmp(got, want) == 0,
            "'%s': the data is damaged: its CRC-32C is %s, the header says %s", path, got, want);
  return LUTRA_OK;
}
