/* The header every opaque object starts with, so that "was freed" and "is NULL" are reported
 * the same way everywhere. */
#ifndef LUTRA_CORE_OBJECT_H
#define LUTRA_CORE_OBJECT_H

#include "lutra.h"

#include <stdint.h>

enum { LUTRA_OBJ_FREED = 1 };
typedef struct lutra_object {
  uint32_t magic;
  uint32_t flags;
  int32_t refs;
  /* of refs, those held by captured graphs: they keep the object alive, but do not make it
   * "still in use" to an explicit free (the graph refuses to replay instead) */
  int32_t holds;
} lutra_object;

enum {
  LUTRA_MAGIC_RECIPE = 0x4c524543u,
  LUTRA_MAGIC_AUTOCAST = 0x4c415554u,
  LUTRA_MAGIC_QUANTIZER = 0x4c51554eu,
  LUTRA_MAGIC_MODULE = 0x4c4d4f44u,
  LUTRA_MAGIC_LOSS = 0x4c4c4f53u,
  LUTRA_MAGIC_OPTIM = 0x4c4f5054u,
  LUTRA_MAGIC_GRAPH = 0x4c475248u,
  LUTRA_MAGIC_GROUP = 0x4c475250u,
  LUTRA_MAGIC_GRAD_SYNC = 0x4c475359u,
  LUTRA_MAGIC_MOE_ROUTER = 0x4c4d4f52u,  /* nn/grouped/moe_router.c */
  LUTRA_MAGIC_MOE_DISPATCH = 0x4c4d4f50u /* nn/grouped/moe_dispatch.c */
};

/* LUTRA_OK when obj is a live object of the given magic; else an error naming fn and what. */
int lutra_check_object(const void *obj, uint32_t magic, const char *fn, const char *what);
int lutra_check_tensor(const lutra_tensor *t, const char *fn, const char *what);

#endif
