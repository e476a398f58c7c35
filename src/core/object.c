/* The checks every entry point runs on the objects and tensors it is handed. */
#include "core/object.h"
#include "core/error.h"

int lutra_check_object(const void *obj, uint32_t magic, const char *fn, const char *what) {
  const lutra_object *o = obj;
  if (!o) return lutra_error(LUTRA_EINVAL, fn, "%s is NULL", what);
  if (o->magic != magic) return lutra_error(LUTRA_EINVAL, fn, "%s is not a %s", what, what);
  if (o->flags & LUTRA_OBJ_FREED) return lutra_error(LUTRA_ESTATE, fn, "%s was freed", what);
  return LUTRA_OK;
}

int lutra_check_tensor(const lutra_tensor *t, const char *fn, const char *what) {
  if (!t) return lutra_error(LUTRA_EINVAL, fn, "%s is NULL", what);
  if (t->flags & LUTRA_TENSOR_FREED) {
    if (t->flags & LUTRA_TENSOR_BORROWED)
      return lutra_error(LUTRA_ESTATE, fn,
                         "%s was freed: the module, quantizer or loss that returned it was freed "
                         "or replaced it in a later call (a new shape or recipe); use the tensor "
                         "that call returned",
                         what);
    return lutra_error(LUTRA_ESTATE, fn, "%s was freed", what);
  }
  return LUTRA_OK;
}
