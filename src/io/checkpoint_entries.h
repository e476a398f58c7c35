/* What a checkpoint of some objects consists of: one entry per tensor of state, named as
 * lutra/checkpoint.h lists, pointing at the memory it is saved from and loaded into. */
#ifndef LUTRA_IO_CHECKPOINT_ENTRIES_H
#define LUTRA_IO_CHECKPOINT_ENTRIES_H

#include "backend/backend.h"
#include "lutra.h"
#include "nn/module.h"

#include <stdbool.h>

typedef enum entry_kind {
  ENTRY_PARAM,       /* a parameter's value: convertible on load, marked written */
  ENTRY_STATE,       /* main grads, FP8 state, optimizer buffers: exact dtype only */
  ENTRY_MASTER,      /* an optimizer's f32 master of the parameter `param` */
  ENTRY_STEP,        /* host values (the context's): the optimizer's step count, */
  ENTRY_DEVICE_STEP, /* its device step (a copy of the count on the cpu), */
  ENTRY_RNG,         /* the seed generator's state */
  ENTRY_TIED         /* loading: a tied weight's second name (never in a lutra file: refused) */
} entry_kind;

typedef struct ckpt_entry {
  char *name;
  entry_kind kind;
  const char *dtype; /* safetensors dtype name */
  int lutra_dtype;   /* LUTRA_* dtype, or -1 for I64 / U64 */
  int ndim;
  int64_t shape[LUTRA_MAX_DIMS];
  size_t bytes;
  void *ptr;               /* backend memory of be, or host memory when be is NULL */
  const lutra_backend *be; /* NULL: ptr is host memory */
  lutra_tensor *param;     /* ENTRY_PARAM: the tensor; ENTRY_MASTER: the parameter mastered */
  bool optional; /* a file without it (written before it was saved) loads, leaving it as it is */
  const char *tied_to; /* ENTRY_TIED: the name the weight is stored under */
} ckpt_entry;

/* Host-side values the entries of kind STEP, DEVICE_STEP and RNG point at. */
typedef struct ckpt_host {
  int64_t step, device_step;
  uint64_t rng;
} ckpt_host;

/* Quantizers a load built for a module (lutra_checkpoint_ops.quantizers' fresh ones): the
 * module adopts them once the load succeeded; else they are freed with the entries. */
typedef struct ckpt_pending {
  lutra_module *module;
  const lutra_recipe *recipe;
  lutra_module_quantizers q;
  void *state; /* lutra_checkpoint_ops.fp8_state's fresh state, or NULL */
} ckpt_pending;

/* A module's generator (lutra_checkpoint_ops.rng_get): its state, read when collected, which
 * the entry <m>.rng_state points at; a load writes the file's there and hands it back to the
 * module (rng_set) once it succeeded. */
typedef struct ckpt_rng {
  lutra_module *module;
  uint64_t state[2];
} ckpt_rng;

typedef struct ckpt_entries {
  ckpt_entry *e;
  int count, cap;
  ckpt_pending *pending;
  int npending, pending_cap;
  ckpt_rng **rng; /* each its own allocation: entries point into it */
  int nrng, rng_cap;
  ckpt_host host;
  lutra_optim *optim; /* the objects' optimizer, when they had one */
  bool saving;        /* collected for a save (else for a load) */
} ckpt_entries;

/* Entries of the objects, sorted by name (duplicates refused). for_load: a module whose
 * quantizers do not exist yet builds them for o->recipe (lutra_checkpoint_objects). The host
 * values are read from the objects (saving) and applied by ckpt_apply_host (loading). */
int ckpt_collect(const lutra_checkpoint_objects *o, bool for_load, ckpt_entries *E, const char *fn);
void ckpt_entries_free(ckpt_entries *E);
ckpt_entry *ckpt_find(const ckpt_entries *E, const char *name);
/* Loading, once every entry was written: the modules adopt the quantizers built for them. */
void ckpt_adopt(ckpt_entries *E);
/* Loading: the host values into the objects (the modules' generators included), the written flags
 * of the loaded parameters (set, or cleared where their master was loaded too), the optimizer's lr
 * when lr is not NULL. */
int ckpt_apply_host(ckpt_entries *E, const lutra_checkpoint_objects *o, const float *lr,
                    const char *fn);

#endif
