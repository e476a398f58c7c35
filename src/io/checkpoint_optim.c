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
static int parse_count(const st_file *f, const char *key, int64_t *out, const char *path,
                       const char *fn) {
  const char *s = st_meta(f, key);
  CHECK_ARG(s, "'%s': __metadata__ has optim.schedule but no %s", path, key);
  int64_t v = 0;
  const char *p = s;
  for (; *p >= '0' && *p <= '9' && p - s < 18; p++)
    v = v * 10 + (*p - '0');
  CHECK_ARG(p != s && *p == 0, "'%s': __metadata__ %s '%s' is not a step count", path, key, s);
  *out = v;
  return LUTRA_OK;
}

int ckpt_optim_settings_read(const st_file *f, const char *path, ckpt_optim_settings *s,
                             const char *fn) {
  memset(s, 0, sizeof *s);
  const char *kind = st_meta(f, "optim.schedule"), *clip = st_meta(f, "optim.max_grad_norm");
  if (kind) {
    int k = 0;
    while (k < KIND_COUNT && strcmp(kind, kind_names[k]) != 0)
      k++;
    CHECK_ARG(k < KIND_COUNT,
              "'%s': __metadata__ optim.schedule '%s' is not constant, warmup_cosine or "
              "warmup_linear",
              path, kind);
    s->schedule.kind = k;
    TRY(parse_count(f, "optim.warmup_steps", &s->schedule.warmup_steps, path, fn));
    TRY(parse_count(f, "optim.total_steps", &s->schedule.total_steps, path, fn));
    const char *min_lr = st_meta(f, "optim.min_lr");
    CHECK_ARG(min_lr, "'%s': __metadata__ has optim.schedule but no optim.min_lr", path);
    TRY(ckpt_parse_f32(min_lr, "optim.min_lr", false, &s->schedule.min_lr, path, fn));
    TRY(lutra_lr_schedule_check(&s->schedule, fn));
    s->have_schedule = true;
  }
  if (clip) {
    TRY(ckpt_parse_f32(clip, "optim.max_grad_norm", true, &s->max_grad_norm, path, fn));
    s->have_clip = true;
  }
  return LUTRA_OK;
}

void ckpt_optim_settings_apply(const ckpt_optim_settings *s, const lutra_optim_view *v) {
  if (s->have_schedule) *v->schedule = s->schedule;
  if (s->have_clip) *v->max_grad_norm = s->max_grad_norm;
}
