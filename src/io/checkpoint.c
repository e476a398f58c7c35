/* lutra_checkpoint_save / lutra_checkpoint_load (lutra/checkpoint.h): the atomic write and the
 * all-or-nothing load of the entries io/checkpoint_entries.c collects. */
#include "core/capture.h"
#include "core/error.h"
#include "fp8/autocast.h"
#include "io/checkpoint_check.h"
#include "io/checkpoint_entries.h"
#include "io/checkpoint_optim.h"
#include "io/checkpoint_temp.h"
#include "io/crc32c.h"
#include "io/safetensors.h"
#include "optim/optim_state.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { FORMAT_VERSION = 1 };
static const char format_name[] = "lutra.checkpoint";

void lutra_checkpoint_defaults(lutra_checkpoint_objects *o) {
  if (o) *o = (lutra_checkpoint_objects){.fp8 = 1};
}

static int check_call(const char *path, const lutra_checkpoint_objects *o, const char *fn) {
  CHECK_ARG(path && *path, "path is NULL or empty");
  CHECK_ARG(o, "objects is NULL (lutra_checkpoint_defaults gives the defaults)");
  CHECK_ARG(o->model || o->optim || o->rng, "the objects name nothing to save or load");
  int depth, enabled, calibrating;
  TRY(lutra_autocast_state(&depth, &enabled, &calibrating));
  CHECK_STATE(depth == 0, "called inside an autocast scope: a step is half-done (exit it first)");
  CHECK_STATE(!LUTRA_CAPTURING(), "called while capturing a CUDA graph");
  return LUTRA_OK;
}

/* ---- saving ------------------------------------------------------------------------------ */

static int write_all(int fd, const void *p, size_t n, const char *tmp, const char *fn) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      return lutra_error(LUTRA_EBACKEND, fn, "cannot write '%s': %s", tmp,
                         w < 0 ? strerror(errno) : "no progress");
    c += w, n -= (size_t)w;
  }
  return LUTRA_OK;
}

/* The data, its CRC-32C into *crc. */
static int write_entries(int fd, const ckpt_entries *E, const char *tmp, uint32_t *crc,
                         const char *fn) {
  size_t most = 0;
  for (int i = 0; i < E->count; i++)
    if (E->e[i].be && E->e[i].bytes > most) most = E->e[i].bytes;
  void *stage = malloc(most ? most : 1);
  if (!stage) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate %zu bytes to stage", most);
  int st = LUTRA_OK;
  for (int i = 0; i < E->count && st == LUTRA_OK; i++) {
    const ckpt_entry *e = &E->e[i];
    const void *src = e->ptr;
    if (e->be) {
      st = e->be->to_host(stage, e->ptr, e->bytes);
      if (st != LUTRA_OK) st = lutra_error_wrap(st, fn);
      src = stage;
    }
    if (st == LUTRA_OK) st = write_all(fd, src, e->bytes, tmp, fn);
    *crc = crc32c_extend(*crc, src, e->bytes);
  }
  free(stage);
  return st;
}

/* The data's CRC-32C over the header's placeholder (8 hex digits, the same length). */
static int write_crc(int fd, const char *header, size_t len, uint32_t crc, const char *tmp,
                     const char *fn) {
  static const char slot[] = "\"" CKPT_CRC_KEY "\":\"";
  const char *at = memmem(header, len, slot, sizeof slot - 1);
  if (!at) return lutra_error(LUTRA_EINVAL, fn, "the header lost its checksum slot");
  char hex[9];
  snprintf(hex, sizeof hex, "%08x", (unsigned)crc);
  off_t off = (off_t)(at - header + (ptrdiff_t)sizeof slot - 1);
  ssize_t w = pwrite(fd, hex, 8, off);
  if (w != 8)
    return lutra_error(LUTRA_EBACKEND, fn, "cannot write '%s': %s", tmp,
                       w < 0 ? strerror(errno) : "short write");
  return LUTRA_OK;
}

static int header_of(const ckpt_entries *E, const lutra_checkpoint_objects *o, char **out,
                     size_t *len, const char *fn) {
  st_out *t = calloc((size_t)E->count + 1, sizeof *t);
  if (!t) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate the header");
  for (int i = 0; i < E->count; i++)
    t[i] = (st_out){E->e[i].name, E->e[i].dtype, E->e[i].ndim, E->e[i].shape, E->e[i].bytes};
  char version[16], lr[48];
  snprintf(version, sizeof version, "%d", FORMAT_VERSION);
  /* the checksum is written once the data was: a placeholder of its width first */
  const char *meta[10 + 2 * CKPT_OPTIM_META_PAIRS] = {"format", format_name,  "version",
                                                      version,  CKPT_CRC_KEY, "00000000"};
  int nmeta = 3;
  lutra_optim_view v;
  ckpt_optim_text text;
  int st = LUTRA_OK;
  if (o->optim && lutra_optim_view_of(o->optim, &v, fn) == LUTRA_OK) {
    st = ckpt_format_lr(*v.lr, lr, sizeof lr, fn);
    meta[6] = "optim.kind", meta[7] = v.kind == LUTRA_OPTIM_ADAMW ? "adamw" : "sgd";
    meta[8] = "optim.lr", meta[9] = lr;
    int pairs = 0;
    if (st == LUTRA_OK) st = ckpt_optim_meta(&v, &text, meta + 10, &pairs, fn);
    nmeta = 5 + pairs;
  }
  if (st == LUTRA_OK) st = st_header(t, E->count, meta, nmeta, out, len, fn);
  free(t);
  return st;
}

/* The directory of path, fsynced so that the rename is durable. */
static int sync_dir(const char *path, const char *fn) {
  char *copy = strdup(path);
  if (!copy) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a path");
  int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
  int st = LUTRA_OK;
  if (fd < 0 || fsync(fd) != 0)
    st = lutra_error(LUTRA_EBACKEND, fn, "cannot fsync the directory of '%s': %s", path,
                     strerror(errno));
  if (fd >= 0) close(fd);
  free(copy);
  return st;
}

int lutra_checkpoint_save(const char *path, const lutra_checkpoint_objects *o) {
  static const char fn[] = "lutra_checkpoint_save";
  TRY(check_call(path, o, fn));
  if (o->optim) {
    lutra_optim_view v;
    TRY(lutra_optim_view_of(o->optim, &v, fn));
    CHECK_STATE(v.accumulated == 0,
                "the optimizer is inside a gradient-accumulation window (%d micro-batches summed, "
                "not stepped): the sums are not saved, so a resume could not continue it; save "
                "after the step",
                (int)v.accumulated);
  }
  ckpt_entries E;
  TRY(ckpt_collect(o, false, &E, fn));
  char *header = NULL, *tmp = NULL;
  size_t header_len = 0;
  int st = header_of(&E, o, &header, &header_len, fn);
  int fd = -1;
  if (st == LUTRA_OK) {
    fd = ckpt_create_temp(path, &tmp, fn);
    if (fd < 0) st = LUTRA_EINVAL;
  }
  if (st == LUTRA_OK) st = write_all(fd, header, header_len, tmp, fn);
  uint32_t crc = 0;
  if (st == LUTRA_OK) st = write_entries(fd, &E, tmp, &crc, fn);
  if (st == LUTRA_OK) st = write_crc(fd, header, header_len, crc, tmp, fn);
  if (st == LUTRA_OK && fsync(fd) != 0)
    st = lutra_error(LUTRA_EBACKEND, fn, "cannot fsync '%s': %s", tmp, strerror(errno));
  if (fd >= 0 && close(fd) != 0 && st == LUTRA_OK)
    st = lutra_error(LUTRA_EBACKEND, fn, "cannot close '%s': %s", tmp, strerror(errno));
  if (st == LUTRA_OK && rename(tmp, path) != 0)
    st =
        lutra_error(LUTRA_EINVAL, fn, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
  if (st != LUTRA_OK && fd >= 0) unlink(tmp); /* the old file stays as it was */
  if (st == LUTRA_OK) st = sync_dir(path, fn);
  free(header);
  free(tmp);
  ckpt_entries_free(&E);
  return st;
}

/* ---- loading ----------------------------------------------------------------------------- */

static void shape_str(char *out, size_t n, int ndim, const int64_t *shape) {
  size_t at = (size_t)snprintf(out, n, "[");
  for (int i = 0; i < ndim && at < n; i++)
    at += (size_t)snprintf(out + at, n - at, i ? ", %lld" : "%lld", (long long)shape[i]);
  if (at < n) snprintf(out + at, n - at, "]");
}

static bool is_float_name(const char *d) {
  return !strcmp(d, "F32") || !strcmp(d, "BF16") || !strcmp(d, "F16");
}

static int lutra_dtype_of_name(const char *d) {
  return !strcmp(d, "F32") ? LUTRA_F32 : !strcmp(d, "BF16") ? LUTRA_BF16 : LUTRA_F16;
}

static bool ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), m = strlen(tail);
  return n >= m && strcmp(s + n - m, tail) == 0;
}

static bool is_fp8_state(const char *name) {
  return strncmp(name, "fp8.", 4) == 0 || strstr(name, ".fp8.");
}

/* A tensor of a part of a lutra checkpoint the objects did not ask for (the optimizer's, the
 * generator's, FP8 state, main grads): skipped, so that a model alone loads from a full file.
 * Within the parts asked for, every name must match. */
static bool not_asked(const char *name, const lutra_checkpoint_objects *o) {
  if (strncmp(name, "optim.", 6) == 0) return !o->optim;
  if (strcmp(name, "rng.state") == 0) return !o->rng;
  if (is_fp8_state(name)) return !o->fp8;
  if (ends_with(name, ".main_grad")) return !o->main_grads;
  return false;
}

/* The object name a file tensor is loaded into: renamed by the map, NULL when skipped. */
static const char *target_of(const char *name, const lutra_checkpoint_load_opts *opts,
                             const lutra_checkpoint_objects *o, bool lutra_file) {
  for (int i = 0; opts && i < opts->map_len; i++)
    if (strcmp(opts->map[i].from, name) == 0) return opts->map[i].to;
  return lutra_file && not_asked(name, o) ? NULL : name;
}

static int check_opts(const lutra_checkpoint_load_opts *opts, const st_file *f, const char *path,
                      const char *fn) {
  if (!opts) return LUTRA_OK;
  CHECK_ARG(opts->map_len >= 0 && (opts->map_len == 0 || opts->map),
            "map is NULL or map_len negative");
  for (int i = 0; i < opts->map_len; i++) {
    CHECK_ARG(opts->map[i].from, "map entry %d has no source name", i);
    CHECK_ARG(st_find(f, opts->map[i].from), "map renames '%s', which '%s' does not hold",
              opts->map[i].from, path);
    for (int j = 0; j < i; j++)
      CHECK_ARG(strcmp(opts->map[i].from, opts->map[j].from) != 0, "map renames '%s' twice",
                opts->map[i].from);
  }
  return LUTRA_OK;
}

static int check_meta(const st_file *f, const lutra_checkpoint_objects *o, const char *path,
                      float *lr, bool *have_lr, ckpt_optim_settings *settings, const char *fn) {
  const char *format = st_meta(f, "format"), *version = st_meta(f, "version");
  /* a file of another format (torch's save_file writes {"format": "pt"}, a converted state
   * dict has none) holds tensors only: it is loaded by name (and map) alone */
  if (format && strcmp(format, format_name) == 0)
    TRY(ckpt_check_version(version, FORMAT_VERSION, path, fn));
  *have_lr = false;
  if (!o->optim) return LUTRA_OK;
  lutra_optim_view v;
  TRY(lutra_optim_view_of(o->optim, &v, fn));
  const char *kind = st_meta(f, "optim.kind"), *lrs = st_meta(f, "optim.lr");
  const char *want = v.kind == LUTRA_OPTIM_ADAMW ? "adamw" : "sgd";
  CHECK_ARG(kind && strcmp(kind, want) == 0,
            "'%s' holds %s optimizer state; the optimizer given is %s", path, kind ? kind : "no",
            want);
  TRY(ckpt_optim_check_fixed(f, &v, path, fn));
  if (lrs) {
    TRY(ckpt_parse_lr(lrs, lr, path, fn));
    *have_lr = true;
  }
  return ckpt_optim_settings_read(f, path, settings, fn);
}

/* What to do about a file's FP8 tensor the objects lack: build the quantizers, or leave it. */
static const char *fp8_hint(const ckpt_entries *E, const lutra_checkpoint_objects *o,
                            const char *name) {
  if (!is_fp8_state(name)) return "";
  bool objects_have_fp8 = false;
  for (int k = 0; k < E->count && !objects_have_fp8; k++)
    objects_have_fp8 = is_fp8_state(E->e[k].name);
  if (!objects_have_fp8 && !o->recipe)
    return ": the file holds FP8 state and the model has no quantizers yet (no FP8 forward ran): "
           "pass recipe = <the recipe it was trained with> to lutra.load "
           "(lutra_checkpoint_objects.recipe; an amax_history means delayed scaling), or "
           "fp8 = false to leave the FP8 state out";
  return ": the file's FP8 state is of another recipe than the model's quantizers (fp8 = false "
         "leaves the FP8 state out)";
}

/* Every file tensor goes to one entry, every entry gets one, with its dtype and shape. */
static int match(const st_file *f, ckpt_entries *E, const lutra_checkpoint_objects *o,
                 const lutra_checkpoint_load_opts *opts, const st_tensor **src, const char *path,
                 const char *fn) {
  bool convert = opts && opts->convert;
  const char *format = st_meta(f, "format");
  bool lutra_file = format && strcmp(format, format_name) == 0;
  for (int i = 0; i < f->count; i++) {
    const st_tensor *t = &f->t[i];
    const char *to = target_of(t->name, opts, o, lutra_file);
    if (!to) continue;
    ckpt_entry *e = ckpt_find(E, to);
    /* a module's generator where the objects' module has none to save (attention without
     * dropout: an inference model from a training run's file) is no state they lack */
    if (!e && lutra_file && ends_with(to, ".rng_state")) continue;
    CHECK_ARG(e, "'%s' holds tensor '%s'%s%s%s, which the objects do not have%s", path, t->name,
              to != t->name ? " (renamed '" : "", to != t->name ? to : "",
              to != t->name ? "')" : "", fp8_hint(E, o, to));
    CHECK_ARG(e->kind != ENTRY_TIED,
              "'%s' holds tensor '%s', which the model ties to '%s' (one weight, stored once "
              "under that name): the file was saved from a model without that tie",
              path, t->name, e->tied_to);
    int k = (int)(e - E->e);
    CHECK_ARG(!src[k], "'%s': tensors '%s' and '%s' both load into '%s'", path, src[k]->name,
              t->name, to);
    char want[96], got[96];
    shape_str(want, sizeof want, e->ndim, e->shape);
    shape_str(got, sizeof got, t->ndim, t->shape);
    CHECK_ARG(t->ndim == e->ndim && !memcmp(t->shape, e->shape, (size_t)e->ndim * 8),
              "'%s': tensor '%s' has shape %s, '%s' in the objects is %s", path, t->name, got, to,
              want);
    bool same = strcmp(t->dtype, e->dtype) == 0;
    bool converts = convert && e->kind == ENTRY_PARAM && is_float_name(t->dtype);
    CHECK_ARG(same || converts, "'%s': tensor '%s' has dtype %s, '%s' in the objects is %s%s", path,
              t->name, t->dtype, to, e->dtype,
              e->kind == ENTRY_PARAM && is_float_name(t->dtype) ? " (convert = true converts)"
                                                                : "");
    src[k] = t;
  }
  for (int k = 0; k < E->count; k++)
    CHECK_ARG(src[k] || E->e[k].optional, "'%s' lacks tensor '%s'", path, E->e[k].name);
  for (int k = 0; k < E->count; k++) {
    if (E->e[k].kind != ENTRY_STEP && E->e[k].kind != ENTRY_DEVICE_STEP) continue;
    int64_t step;
    memcpy(&step, f->data + src[k]->begin, 8);
    CHECK_ARG(step >= 0, "'%s': %s is negative", path, E->e[k].name);
  }
  return LUTRA_OK;
}

/* A float parameter stored in another float dtype: through f32, rounded as lutra_encode. */
static int converted(const ckpt_entry *e, const st_tensor *t, const unsigned char *data, void **out,
                     const char *fn) {
  int from = lutra_dtype_of_name(t->dtype);
  size_t fsize = lutra_dtype_size(from), tsize = lutra_dtype_size(e->lutra_dtype);
  int64_t n = (int64_t)(e->bytes / tsize);
  unsigned char *buf = malloc(e->bytes ? e->bytes : 1);
  if (!buf) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate %zu bytes", e->bytes);
  for (int64_t i = 0; i < n; i++) {
    uint32_t bits = 0;
    float v;
    memcpy(&bits, data + i * (int64_t)fsize, fsize); /* little-endian host */
    if (from == LUTRA_F32)
      memcpy(&v, &bits, 4);
    else
      v = lutra_decode(from, bits);
    if (e->lutra_dtype == LUTRA_F32)
      memcpy(&bits, &v, 4);
    else
      bits = lutra_encode(e->lutra_dtype, v);
    memcpy(buf + i * (int64_t)tsize, &bits, tsize);
  }
  *out = buf;
  return LUTRA_OK;
}

static int write_into(const ckpt_entry *e, const st_tensor *t, const unsigned char *data,
                      const char *fn) {
  void *conv = NULL;
  const void *src = data + t->begin;
  if (strcmp(t->dtype, e->dtype) != 0) {
    TRY(converted(e, t, src, &conv, fn));
    src = conv;
  }
  int st = LUTRA_OK;
  if (e->be)
    st = e->be->from_host(e->ptr, src, e->bytes);
  else
    memcpy(e->ptr, src, e->bytes);
  free(conv);
  return st == LUTRA_OK ? st : lutra_error_wrap(st, fn);
}

int lutra_checkpoint_load(const char *path, const lutra_checkpoint_objects *o,
                          const lutra_checkpoint_load_opts *opts) {
  static const char fn[] = "lutra_checkpoint_load";
  TRY(check_call(path, o, fn));
  st_file f;
  TRY(st_read(path, &f, fn));
  ckpt_entries E = {0};
  float lr = 0;
  bool have_lr = false;
  ckpt_optim_settings settings = {0};
  int st = check_opts(opts, &f, path, fn);
  if (st == LUTRA_OK) st = check_meta(&f, o, path, &lr, &have_lr, &settings, fn);
  if (st == LUTRA_OK) st = ckpt_collect(o, true, &E, fn);
  const st_tensor **src = NULL;
  if (st == LUTRA_OK) {
    src = calloc((size_t)E.count + 1, sizeof *src);
    st = src ? match(&f, &E, o, opts, src, path, fn)
             : lutra_error(LUTRA_ENOMEM, fn, "cannot allocate the entry list");
  }
  if (st == LUTRA_OK) st = ckpt_check_crc(&f, path, fn);
  if (st == LUTRA_OK) st = ckpt_check_values(&f, &E, src, path, fn);
  /* everything is checked: from here on the objects change */
  for (int k = 0; st == LUTRA_OK && k < E.count; k++)
    if (src[k]) st = write_into(&E.e[k], src[k], f.data, fn);
  if (st == LUTRA_OK) ckpt_adopt(&E);
  if (st == LUTRA_OK) st = ckpt_apply_host(&E, o, have_lr ? &lr : NULL, fn);
  lutra_optim_view v;
  if (st == LUTRA_OK && o->optim && lutra_optim_view_of(o->optim, &v, fn) == LUTRA_OK)
    ckpt_optim_settings_apply(&settings, &v);
  free(src);
  ckpt_entries_free(&E);
  st_free(&f);
  return st;
}
