/* A checkpoint's optimizer settings beyond its lr (lutra/checkpoint.h): the learning-rate
 * schedule and the clipping threshold (taken from the file on load), and the hyper-parameters
 * fixed at construction (weight decay and its rule, AdamW's betas and eps, SGD's momentum: a load
 * into an optimizer built with others is refused), as __metadata__ strings. */
#ifndef LUTRA_IO_CHECKPOINT_OPTIM_H
#define LUTRA_IO_CHECKPOINT_OPTIM_H

#include "io/safetensors.h"
#include "optim/optim_state.h"

#include <stdbool.h>

enum { CKPT_OPTIM_FIXED_MAX = 5 }; /* fixed hyper-parameters of a kind, at most */
/* key/value pairs ckpt_optim_meta writes, at most */
enum { CKPT_OPTIM_META_PAIRS = 5 + CKPT_OPTIM_FIXED_MAX };

/* The text the pairs point into (lives as long as the pointers are used). */
typedef struct ckpt_optim_text {
  char warmup[24], total[24], min_lr[48], max_grad_norm[48];
  char fixed[CKPT_OPTIM_FIXED_MAX][48];
} ckpt_optim_text;

/* What a file says of the settings (a file written before they were saved says nothing: the
 * optimizer keeps its own). */
typedef struct ckpt_optim_settings {
  bool present;
  lutra_lr_schedule schedule;
  float max_grad_norm;
} ckpt_optim_settings;

/* meta[0 .. 2 * *pairs): the keys and values of v's settings (*pairs <= CKPT_OPTIM_META_PAIRS). */
int ckpt_optim_meta(const lutra_optim_view *v, ckpt_optim_text *text, const char **meta, int *pairs,
                    const char *fn);
/* Loading: f's fixed hyper-parameters must be v's (refused naming the first that differs); a
 * file without them (written before they were saved) loads. */
int ckpt_optim_check_fixed(const st_file *f, const lutra_optim_view *v, const char *path,
                           const char *fn);
/* The settings of f's __metadata__, checked as lutra_optim_set_schedule and
 * lutra_optim_set_max_grad_norm check them (refused naming path and the key). */
int ckpt_optim_settings_read(const st_file *f, const char *path, ckpt_optim_settings *s,
                             const char *fn);
/* Loading, once everything else was: the settings the file had into the optimizer. */
void ckpt_optim_settings_apply(const ckpt_optim_settings *s, const lutra_optim_view *v);

#endif
