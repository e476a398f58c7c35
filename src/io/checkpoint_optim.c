/* The optimizer's schedule and clipping in a checkpoint's __metadata__ (io/checkpoint_optim.h):
 *   optim.schedule       "constant", "warmup_cosine" or "warmup_linear"
 *   optim.warmup_steps   decimal digits
 *   optim.total_steps    decimal digits
 *   optim.min_lr         f32 as C's "%a" writes it (C locale)
 *   optim.max_grad_norm  f32 as "%a" ("inf" for +inf; 0: no clipping) */
#include "io/checkpoint_optim.h"
#include "core/error.h"
#include "io/checkpoint_check.h"

#include <stdio.h>
#include <string.h>

static const char *const kind_names[] = {"constant", "warmup_cosine", "warmup_linear"};
enum { KIND_COUNT = sizeof kind_names / sizeof *kind_names };

int ckpt_optim_meta(const lutra_optim_view *v, ckpt_optim_text *text, const char **meta,
                    const char *fn) {
  const lutra_lr_schedule *s = v->schedule;
  snprintf(text->warmup, sizeof text->warmup, "%lld", (long long)s->warmup_steps);
  snprintf(text->total, sizeof text->total, "%lld", (long long)s->total_steps);
  TRY(ckpt_format_lr(s->min_lr, text->min_lr, sizeof text->min_lr, fn));
  TRY(ckpt_format_lr(*v->max_grad_norm, text->max_grad_norm, sizeof text->max_grad_norm, fn));
  const char *pairs[2 * CKPT_OPTIM_META_PAIRS] = {
      "optim.schedule",      kind_names[s->kind], "optim.warmup_steps", text->warmup,
      "optim.total_steps",   text->total,         "optim.min_lr",       text->min_lr,
      "optim.max_grad_norm", text->max_grad_norm};
  memcpy(meta, pairs, sizeof pairs);
  return LUTRA_OK;
}

/* decimal digits only (the writer's "%lld" of a count >= 0), at most 18 of them */
static int parse_count(const char *s, const char *key, int64_t *out, const char *path,
                       const char *fn) {
  int64_t v = 0;
  const char *p = s;
  for (; *p >= '0' && *p <= '9' && p - s < 18; p++)
    v = v * 10 + (*p - '0');
  CHECK_ARG(p != s && *p == 0, "'%s': __metadata__ %s '%s' is not a step count", path, key, s);
  *out = v;
  return LUTRA_OK;
}

static const char *const keys[] = {"optim.schedule", "optim.warmup_steps", "optim.total_steps",
                                   "optim.min_lr", "optim.max_grad_norm"};
enum { KEY_COUNT = sizeof keys / sizeof *keys };

int ckpt_optim_settings_read(const st_file *f, const char *path, ckpt_optim_settings *s,
                             const char *fn) {
  memset(s, 0, sizeof *s);
  /* all of the keys (a file of this lutra) or none (one written before they were): a file
   * with some is damaged */
  const char *v[KEY_COUNT];
  int present = 0, missing = -1;
  for (int k = 0; k < KEY_COUNT; k++) {
    v[k] = st_meta(f, keys[k]);
    if (v[k])
      present++;
    else
      missing = k;
  }
  if (present == 0) return LUTRA_OK;
  CHECK_ARG(present == KEY_COUNT,
            "'%s': __metadata__ has optimizer settings but no %s (the file is damaged)", path,
            keys[missing]);
  int kind = 0;
  while (kind < KIND_COUNT && strcmp(v[0], kind_names[kind]) != 0)
    kind++;
  CHECK_ARG(kind < KIND_COUNT,
            "'%s': __metadata__ optim.schedule '%s' is not constant, warmup_cosine or "
            "warmup_linear",
            path, v[0]);
  s->schedule.kind = kind;
  TRY(parse_count(v[1], keys[1], &s->schedule.warmup_steps, path, fn));
  TRY(parse_count(v[2], keys[2], &s->schedule.total_steps, path, fn));
  TRY(ckpt_parse_f32(v[3], keys[3], false, &s->schedule.min_lr, path, fn));
  TRY(ckpt_parse_f32(v[4], keys[4], true, &s->max_grad_norm, path, fn));
  char context[512];
  snprintf(context, sizeof context, "'%.400s': __metadata__ optim.", path);
  TRY(lutra_lr_schedule_check(&s->schedule, fn, context));
  s->present = true;
  return LUTRA_OK;
}

void ckpt_optim_settings_apply(const ckpt_optim_settings *s, const lutra_optim_view *v) {
  if (!s->present) return;
  *v->schedule = s->schedule;
  *v->max_grad_norm = s->max_grad_norm;
}
