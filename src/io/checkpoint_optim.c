/* The optimizer's schedule and clipping in a checkpoint's __metadata__ (io/checkpoint_optim.h):
 *   optim.schedule       "constant", "warmup_cosine" or "warmup_linear"
 *   optim.warmup_steps   decimal digits
 *   optim.total_steps    decimal digits
 *   optim.min_lr         f32 as C's "%a" writes it (C locale)
 *   optim.max_grad_norm  f32 as "%a" ("inf" for +inf; 0: no clipping)
 * and the hyper-parameters fixed at construction (no setter), which a load compares:
 *   optim.weight_decay   f32 as "%a"; AdamW's optim.beta1, optim.beta2, optim.eps, SGD's
 *                        optim.momentum likewise
 *   optim.decay          "all" or "matrices" (the parameters that take weight decay) */
#include "io/checkpoint_optim.h"
#include "core/error.h"
#include "io/checkpoint_check.h"

#include <stdio.h>
#include <string.h>

static const char *const kind_names[] = {"constant", "warmup_cosine", "warmup_linear"};
enum { KIND_COUNT = sizeof kind_names / sizeof *kind_names };

/* The fixed hyper-parameters of v's kind: keys and values (decay rule apart); their count. */
static int fixed_of(const lutra_optim_view *v, const char **keys, float *values) {
  const lutra_optim_desc *d = v->desc;
  keys[0] = "optim.weight_decay", values[0] = d->weight_decay;
  if (v->kind != LUTRA_OPTIM_ADAMW) {
    keys[1] = "optim.momentum", values[1] = d->momentum;
    return 2;
  }
  keys[1] = "optim.beta1", values[1] = d->beta1;
  keys[2] = "optim.beta2", values[2] = d->beta2;
  keys[3] = "optim.eps", values[3] = d->eps;
  return 4;
}

static const char *decay_name(int32_t decay) {
  return decay == LUTRA_DECAY_ALL ? "all" : "matrices";
}

int ckpt_optim_meta(const lutra_optim_view *v, ckpt_optim_text *text, const char **meta, int *pairs,
                    const char *fn) {
  const lutra_lr_schedule *s = v->schedule;
  snprintf(text->warmup, sizeof text->warmup, "%lld", (long long)s->warmup_steps);
  snprintf(text->total, sizeof text->total, "%lld", (long long)s->total_steps);
  TRY(ckpt_format_lr(s->min_lr, text->min_lr, sizeof text->min_lr, fn));
  TRY(ckpt_format_lr(*v->max_grad_norm, text->max_grad_norm, sizeof text->max_grad_norm, fn));
  const char *schedule_pairs[2 * 5] = {
      "optim.schedule",      kind_names[s->kind], "optim.warmup_steps", text->warmup,
      "optim.total_steps",   text->total,         "optim.min_lr",       text->min_lr,
      "optim.max_grad_norm", text->max_grad_norm};
  memcpy(meta, schedule_pairs, sizeof schedule_pairs);
  int n = 5;
  const char *fixed_keys[CKPT_OPTIM_FIXED_MAX];
  float fixed[CKPT_OPTIM_FIXED_MAX];
  int nfixed = fixed_of(v, fixed_keys, fixed);
  for (int i = 0; i < nfixed; i++, n++) {
    TRY(ckpt_format_lr(fixed[i], text->fixed[i], sizeof text->fixed[i], fn));
    meta[2 * n] = fixed_keys[i], meta[2 * n + 1] = text->fixed[i];
  }
  meta[2 * n] = "optim.decay", meta[2 * n + 1] = decay_name(v->desc->decay);
  *pairs = n + 1;
  return LUTRA_OK;
}

int ckpt_optim_check_fixed(const st_file *f, const lutra_optim_view *v, const char *path,
                           const char *fn) {
  const char *fixed_keys[CKPT_OPTIM_FIXED_MAX];
  float fixed[CKPT_OPTIM_FIXED_MAX];
  int nfixed = fixed_of(v, fixed_keys, fixed);
  const char *decay = st_meta(f, "optim.decay");
  int present = decay != NULL;
  for (int i = 0; i < nfixed; i++)
    present += st_meta(f, fixed_keys[i]) != NULL;
  if (present == 0) return LUTRA_OK; /* written before they were saved */
  CHECK_ARG(present == nfixed + 1,
            "'%s': __metadata__ has some of the optimizer's hyper-parameters, not all (the file "
            "is damaged)",
            path);
  static const char fixed_note[] = "build the optimizer with the file's (lr, the schedule and "
                                   "max_grad_norm are taken from the file; these are fixed when "
                                   "the optimizer is built)";
  for (int i = 0; i < nfixed; i++) {
    float saved;
    TRY(ckpt_parse_f32(st_meta(f, fixed_keys[i]), fixed_keys[i], false, &saved, path, fn));
    CHECK_ARG(saved == fixed[i],
              "'%s' was written by an optimizer with %s %.9g, the optimizer given has %.9g: %s",
              path, fixed_keys[i] + 6, (double)saved, (double)fixed[i], fixed_note);
  }
  CHECK_ARG(strcmp(decay, "all") == 0 || strcmp(decay, "matrices") == 0,
            "'%s': __metadata__ optim.decay '%s' is not all or matrices", path, decay);
  CHECK_ARG(strcmp(decay, decay_name(v->desc->decay)) == 0,
            "'%s' was written by an optimizer with decay \"%s\", the optimizer given has \"%s\": "
            "%s",
            path, decay, decay_name(v->desc->decay), fixed_note);
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
