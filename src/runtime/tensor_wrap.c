/* Tensors over caller-owned memory (lutra/wrap.h): a shell without LUTRA_TENSOR_OWNS_DATA, so
 * that freeing it (runtime/tensor.c's free_buffers) leaves the buffer alone. */
#include "backend/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "runtime/tensor.h"

#include <stdlib.h>
#include <string.h>

int lutra_tensor_wrap(void *data, int dtype, int ndim, const int64_t *shape, int device,
                      size_t bytes, lutra_tensor **out) {
  static const char fn[] = "lutra_tensor_wrap";
  CHECK_ARG(out, "out is NULL");
  CHECK_ARG(data, "data is NULL");
  CHECK_ARG(lutra_dtype_is_float(dtype) || dtype == LUTRA_I32,
            "dtype %s cannot wrap a buffer (f32, bf16, f16 or i32)", lutra_dtype_name(dtype));
  CHECK_ARG(ndim >= 1 && ndim <= LUTRA_MAX_DIMS, "ndim %d is out of range 1..%d", ndim,
            LUTRA_MAX_DIMS);
  CHECK_ARG(shape, "shape is NULL");
  const lutra_backend *be;
  TRY(lutra_backend_get(device, &be, fn));
  size_t esize = lutra_dtype_size(dtype), need = esize;
  int64_t numel = 1;
  for (int i = 0; i < ndim; i++) {
    CHECK_ARG(shape[i] > 0, "dim %d is %lld; dims must be positive", i, (long long)shape[i]);
    CHECK_ARG(!__builtin_mul_overflow(numel, shape[i], &numel) &&
                  !__builtin_mul_overflow(need, (size_t)shape[i], &need),
              "the shape's byte count overflows");
  }
  CHECK_ARG(need <= bytes, "the shape needs %zu bytes, the buffer has %zu", need, bytes);
  uintptr_t align = device == LUTRA_CPU ? esize : 256;
  CHECK_ARG((uintptr_t)data % align == 0, "data %p is not %zu-byte aligned (%s needs it)", data,
            (size_t)align, device == LUTRA_CPU ? "its dtype" : "a device buffer");
  lutra_tensor *t = calloc(1, sizeof *t);
  if (!t) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a tensor");
  t->data = data;
  memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  t->numel = numel;
  t->ndim = ndim;
  t->dtype = dtype;
  t->device = device;
  t->scaling = LUTRA_SCALING_NONE;
  t->flags = 0; /* not OWNS_DATA: the buffer is the caller's */
  t->refs = 1;
  *out = t;
  return LUTRA_OK;
}
