/* What a checkpoint's values must be, beyond the file's structure (io/safetensors.c) and the
 * names, dtypes and shapes (io/checkpoint.c): the numbers of its metadata, read and written the
 * same way whatever the process's locale, and the FP8 scaling state. */
#ifndef LUTRA_IO_CHECKPOINT_CHECK_H
#define LUTRA_IO_CHECKPOINT_CHECK_H

#include "io/checkpoint_entries.h"
#include "io/safetensors.h"

#include <stddef.h>

/* __metadata__'s key of the data section's CRC-32C (io/crc32c.h), 8 lowercase hex digits. */
#define CKPT_CRC_KEY "data.crc32c"
/* The data section against the CRC-32C of __metadata__, when it has one (files of other writers
 * and of lutra before it wrote one load unchecked). */
int ckpt_check_crc(const st_file *f, const char *path, const char *fn);

/* lr as C99's "%a" writes it in the C locale ("0x1.47ae14p-7"), whatever the process's
 * LC_NUMERIC (a host that called setlocale would otherwise write "0x1,47ae14p-7"). */
int ckpt_format_lr(float lr, char *out, size_t n, const char *fn);
/* __metadata__'s optim.lr: a number as strtod reads it in the C locale (hex as written, or
 * decimal), that lutra_optim_set_lr would take: finite, within f32's range, >= 0. */
int ckpt_parse_lr(const char *s, float *lr, const char *path, const char *fn);
/* __metadata__'s key as a number written by ckpt_format_lr: >= 0, within f32's range (allow_inf:
 * or +inf). */
int ckpt_parse_f32(const char *s, const char *key, bool allow_inf, float *out, const char *path,
                   const char *fn);
/* __metadata__'s version: exactly the decimal digits of version 1. */
int ckpt_check_version(const char *version, int supported, const char *path, const char *fn);
/* The values of the FP8 scaling entries of E, as the file holds them (src[k]: the file's tensor
 * for entry k, NULL where the file has none): under delayed scaling (an amax history; the one
 * kind whose forward reads the stored scale) scale and scale_inv finite and positive and
 * scale_inv exactly 1.0f / scale, as every scale update stores it; amax history values not
 * negative. */
int ckpt_check_values(const st_file *f, const ckpt_entries *E, const st_tensor *const *src,
                      const char *path, const char *fn);

#endif
