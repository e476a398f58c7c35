/* Tensors: allocation through the owning device's backend, host transfers with conversion,
 * (the random fills are in random.c). None of this is on a training step's hot path except
 * lutra_tensor_ensure, which returns at once while the shape stays the same. */
#include "runtime/tensor.h"
#include "backend/backend.h"
#include "backend/device.h"
#include "core/capture.h"
#include "core/codec.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/object.h"
#include "runtime/tensor_view.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static size_t scale_elem_size(int scaling) {
  return scaling == LUTRA_SCALING_MXFP8 || scaling == LUTRA_SCALING_NVFP4 ? 1 : 4;
}

int64_t lutra_scale_count(int scaling, int64_t rows, int64_t cols, bool columnwise) {
  if (columnwise) {
    int64_t t = rows;
    rows = cols;
    cols = t;
  }
  /* rows and cols come from a shape whose product fits int64, so the rounded-up factors
   * below fit too (each is at most its dim + 127); only their product can overflow: -1 then */
  int64_t a, b, n;
  switch (scaling) {
  case LUTRA_SCALING_TENSOR:
    return 1;
  case LUTRA_SCALING_MXFP8:
    a = rows, b = cols / 32 + (cols % 32 != 0);
    break;
  case LUTRA_SCALING_BLOCK_1D: /* [ceil(cols/128)][roundup(rows, 4)] (lutra.h) */
    a = cols / 128 + (cols % 128 != 0), b = rows / 4 * 4 + (rows % 4 ? 4 : 0);
    break;
  case LUTRA_SCALING_ROWWISE: /* one per row of the copy (lutra/formats.h) */
    a = rows, b = 1;
    break;
  case LUTRA_SCALING_NVFP4: /* E4M3 [rows][cols/16] padded to 16 bytes, then 16 (nvfp4.h) */
    a = rows, b = cols / 16 + (cols % 16 != 0);
    if (__builtin_mul_overflow(a, b, &n) || n > INT64_MAX - 32) return -1;
    return (n + 15) / 16 * 16 + 16;
  case LUTRA_SCALING_BLOCK_2D: /* [ceil(rows/128)][roundup(ceil(cols/128), 4)] */
    a = rows / 128 + (rows % 128 != 0), b = cols / 128 + (cols % 128 != 0);
    b = b / 4 * 4 + (b % 4 ? 4 : 0);
    break;
  default:
    return 0;
  }
  if (__builtin_mul_overflow(a, b, &n)) return -1;
  return n;
}

/* count * size in *out; true when it exceeds PTRDIFF_MAX (what an allocator can hand out). */
static bool byte_count(int64_t count, size_t size, size_t *out) {
  size_t n;
  if (count < 0 || __builtin_mul_overflow((size_t)count, size, &n) || n > PTRDIFF_MAX) return true;
  *out = n;
  return false;
}

static int check_shape(int ndim, const int64_t *shape, int64_t *numel, const char *fn) {
  if (ndim < 1 || ndim > LUTRA_MAX_DIMS)
    return lutra_error(LUTRA_EINVAL, fn, "ndim %d is out of range 1..%d", ndim, LUTRA_MAX_DIMS);
  if (!shape) return lutra_error(LUTRA_EINVAL, fn, "shape is NULL");
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] <= 0)
      return lutra_error(LUTRA_EINVAL, fn, "dim %d is %lld; dims must be positive", i,
                         (long long)shape[i]);
    if (n > INT64_MAX / shape[i]) return lutra_error(LUTRA_EINVAL, fn, "shape overflows");
    n *= shape[i];
  }
  *numel = n;
  return LUTRA_OK;
}

static void free_buffers(lutra_tensor *t);

/* The shell (the struct) lives while anyone holds a reference: its owner, a Lua handle, a
 * module that saved it as an input, a captured graph. Only the last one frees it, so a stale
 * pointer reads a shell marked FREED rather than freed memory. */
void lutra_tensor_take_ref(lutra_tensor *t) {
  if (t) t->refs++;
}

void lutra_tensor_drop_ref(lutra_tensor *t) {
  if (!t || --t->refs > 0) return;
  if (!(t->flags & LUTRA_TENSOR_FREED)) free_buffers(t);
  free(t);
}

/* The buffers go now; the shell stays, marked, while other references remain. BORROWED is kept
 * so that the error can say the owner freed or replaced it. */
static void drop_buffers(lutra_tensor *t) {
  if (t->views > 0) { /* views read the buffers: they stay until the last view goes */
    t->flags |= LUTRA_TENSOR_FREED;
    return;
  }
  if (!(t->flags & LUTRA_TENSOR_FREED)) free_buffers(t);
  uint32_t borrowed = t->flags & LUTRA_TENSOR_BORROWED;
  int32_t refs = t->refs, held = t->held;
  memset(t, 0, sizeof *t);
  t->flags = LUTRA_TENSOR_FREED | borrowed;
  t->refs = refs;
  t->held = held;
}

void lutra_tensor_owner_drop(lutra_tensor *t) {
  if (!t) return;
  if (t->refs > 1) drop_buffers(t);
  lutra_tensor_drop_ref(t);
}

int lutra_tensor_make(const lutra_tensor_spec *s, lutra_tensor **out, const char *fn) {
  const int dtype = s->dtype, scaling = s->scaling, ndim = s->ndim, device = s->device;
  const int64_t *shape = s->shape;
  int64_t numel;
  TRY(check_shape(ndim, shape, &numel, fn));
  const lutra_backend *be;
  TRY(lutra_backend_get(device, &be, fn));
  /* E2M1 packs two codes per byte (lutra/nvfp4.h): counted in bytes, not elements */
  const bool packed = dtype == LUTRA_E2M1;
  size_t esize = packed ? 1 : lutra_dtype_size(dtype);
  if (!esize) return lutra_error(LUTRA_EINVAL, fn, "unknown dtype %d", dtype);
  lutra_tensor *t = calloc(1, sizeof *t);
  if (!t) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a tensor");
  t->ndim = ndim;
  memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  t->numel = numel;
  t->dtype = dtype;
  t->device = device;
  t->scaling = scaling;
  t->flags = s->flags | LUTRA_TENSOR_OWNS_DATA;
  t->refs = 1;
  int64_t rows = lutra_rows(t), cols = lutra_cols(t);
  size_t ssize = scale_elem_size(scaling);
  /* A shape whose element count fits int64 can still overflow size_t once multiplied by the
   * element size (2^31 x 2^31 f32 is 2^64 bytes, which wraps to a 0-byte allocation that later
   * writes overrun): every byte count is checked before anything is allocated. */
  size_t bytes, sbytes = 0, cbytes = 0;
  bool overflow = byte_count(packed ? numel / 2 + numel % 2 : numel, esize, &bytes);
  if (scaling != LUTRA_SCALING_NONE) {
    int64_t sc = lutra_scale_count(scaling, rows, cols, false);
    int64_t cc = lutra_scale_count(scaling, rows, cols, true);
    overflow = overflow || sc < 0 || cc < 0 || byte_count(sc, ssize, &sbytes) ||
               byte_count(cc, ssize, &cbytes);
  }
  if (overflow) {
    lutra_tensor_owner_drop(t);
    return lutra_error(LUTRA_EINVAL, fn,
                       "a %lld-element %s tensor needs more than %lld bytes (the byte count "
                       "overflows)",
                       (long long)numel, lutra_dtype_name(dtype), (long long)PTRDIFF_MAX);
  }
  if (lutra_capture_active) {
    lutra_tensor_owner_drop(t);
    return lutra_error(LUTRA_ESTATE, fn,
                       "a %lld-element %s buffer would be allocated while capturing a CUDA graph "
                       "(a first use or a shape change): run the step once eagerly with the same "
                       "shapes before capturing",
                       (long long)numel, lutra_dtype_name(dtype));
  }
  int st = LUTRA_OK;
  if (s->rowwise) st = be->alloc(bytes, &t->data);
  if (st == LUTRA_OK && s->columnwise) st = be->alloc(bytes, &t->col_data);
  /* scale arrays start zeroed: block scaling's padding entries are never written (lutra.h) */
  if (st == LUTRA_OK && scaling != LUTRA_SCALING_NONE && s->rowwise) {
    st = be->alloc(sbytes, &t->scale_inv);
    if (st == LUTRA_OK) st = be->memset(t->scale_inv, 0, sbytes);
  }
  if (st == LUTRA_OK && scaling != LUTRA_SCALING_NONE && s->columnwise) {
    st = be->alloc(cbytes, &t->col_scale_inv);
    if (st == LUTRA_OK) st = be->memset(t->col_scale_inv, 0, cbytes);
  }
  if (st != LUTRA_OK) {
    lutra_tensor_owner_drop(t);
    return lutra_error(st, fn, "cannot allocate %lld elements of %s", (long long)numel,
                       lutra_dtype_name(dtype));
  }
  *out = t;
  return LUTRA_OK;
}

bool lutra_same_shape(const lutra_tensor *a, const lutra_tensor *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

int lutra_tensor_prepare(lutra_tensor *cur, const lutra_tensor_spec *s, lutra_tensor **out,
                         const char *fn) {
  if (lutra_tensor_fits(cur, s)) {
    *out = cur;
    return LUTRA_OK;
  }
  lutra_tensor_spec borrowed = *s;
  borrowed.flags = LUTRA_TENSOR_BORROWED;
  return lutra_tensor_make(&borrowed, out, fn);
}

void lutra_tensor_commit(lutra_tensor **slot, lutra_tensor *t) {
  if (*slot == t) return;
  lutra_tensor_owner_drop(*slot);
  *slot = t;
}

void lutra_tensor_discard(lutra_tensor *slot, lutra_tensor *t) {
  if (t != slot) lutra_tensor_owner_drop(t);
}

int lutra_tensor_ensure(lutra_tensor **t, const lutra_tensor_spec *s, const char *fn) {
  lutra_tensor *fresh;
  TRY(lutra_tensor_prepare(*t, s, &fresh, fn));
  lutra_tensor_commit(t, fresh);
  return LUTRA_OK;
}

int lutra_tensor_new(int dtype, int ndim, const int64_t *shape, int device, lutra_tensor **out) {
  static const char fn[] = "lutra_tensor_new";
  CHECK_ARG(out, "out is NULL");
  CHECK_ARG(lutra_dtype_is_float(dtype) || dtype == LUTRA_I32,
            "dtype %s cannot be created directly (FP8 tensors come from a quantizer)",
            lutra_dtype_name(dtype));
  lutra_tensor *t;
  TRY(lutra_tensor_make(PLAIN_TENSOR(dtype, ndim, shape, device), &t, fn));
  /* zero-filled for every dtype, as lutra.h says: i32 label tensors have no fill of their own */
  const lutra_backend *be;
  int st = lutra_backend_get(device, &be, fn);
  if (st == LUTRA_OK) st = be->memset(t->data, 0, (size_t)t->numel * lutra_dtype_size(dtype));
  if (st != LUTRA_OK) {
    lutra_tensor_owner_drop(t);
    return st;
  }
  *out = t;
  return LUTRA_OK;
}

static int check_owned(const lutra_tensor *t, const char *fn) {
  TRY(lutra_check_tensor(t, fn, "tensor"));
  CHECK_STATE(!(t->flags & LUTRA_TENSOR_BORROWED),
              "tensor is owned by a module or quantizer and is freed with it");
  return LUTRA_OK;
}

/* The caller's references: the one lutra_tensor_new (or a factory) handed out, and one per
 * lutra_tensor_retain. An owner's tensor counts only the retains (held), so that a caller can
 * never drop the owner's own reference. */
void lutra_tensor_retain(lutra_tensor *t) {
  if (!t) return;
  t->refs++;
  t->held++;
}

int lutra_tensor_unref(lutra_tensor *t) {
  static const char fn[] = "lutra_tensor_unref";
  if (!t) return LUTRA_OK;
  /* a shell kept by lutra_tensor_destroy or by an owner that let go, or one a module still holds
   * as its saved input: the buffers stay for that module until it lets go */
  if (!(t->flags & LUTRA_TENSOR_FREED)) {
    TRY(lutra_check_tensor(t, fn, "tensor"));
    CHECK_STATE(!(t->flags & LUTRA_TENSOR_BORROWED) || t->held > 0,
                "tensor is owned by a module or quantizer and is freed with it");
  }
  if (t->held > 0) t->held--;
  lutra_tensor_drop_ref(t);
  return LUTRA_OK;
}

/* A view lets go of its base (lutra/tensor_ops.h): a base freed while views lived kept its
 * buffers, which the last view frees. */
void lutra_tensor_view_release(lutra_tensor *b) {
  if (--b->views == 0 && (b->flags & LUTRA_TENSOR_FREED)) {
    b->flags &= ~(uint32_t)LUTRA_TENSOR_FREED;
    drop_buffers(b);
  }
  lutra_tensor_drop_ref(b);
}

static void free_buffers(lutra_tensor *t) {
  if (t->base) {
    lutra_tensor *b = t->base;
    t->base = NULL;
    t->data = NULL;
    lutra_tensor_view_release(b);
  }
  if (!(t->flags & LUTRA_TENSOR_OWNS_DATA)) return;
  const lutra_backend *be;
  if (lutra_backend_get(t->device, &be, "lutra_tensor_unref") != LUTRA_OK) return;
  be->free(t->data);
  be->free(t->col_data);
  be->free(t->scale_inv);
  be->free(t->col_scale_inv);
}

/* Frees the buffers now and keeps the shell, marked, until lutra_tensor_unref. */
int lutra_tensor_destroy(lutra_tensor *t) {
  static const char fn[] = "lutra_tensor_destroy";
  TRY(check_owned(t, fn));
  drop_buffers(t);
  return LUTRA_OK;
}

/* ---- host transfers -------------------------------------------------------------------- */

static int host_buffer(size_t bytes, void **out, const char *fn) {
  *out = malloc(bytes ? bytes : 1);
  if (!*out) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate %zu bytes", bytes);
  return LUTRA_OK;
}

/* host-side dtype conversion through the reference codecs (the data is on the host already) */
static void host_convert(const void *src, int src_dtype, void *dst, int dst_dtype, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    lutra_elem_store(dst, dst_dtype, i, lutra_elem_load(src, src_dtype, i));
}

static int check_count(const lutra_tensor *t, int64_t n, const char *fn) {
  CHECK_ARG(n == t->numel, "%lld values given for a tensor of %lld", (long long)n,
            (long long)t->numel);
  return LUTRA_OK;
}

int lutra_tensor_set_f32(lutra_tensor *t, const float *src, int64_t n) {
  static const char fn[] = "lutra_tensor_set_f32";
  TRY(lutra_check_tensor(t, fn, "tensor"));
  CHECK_ARG(src, "src is NULL");
  CHECK_ARG(lutra_dtype_is_float(t->dtype), "tensor dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(t->dtype));
  TRY(check_count(t, n, fn));
  const lutra_backend *be;
  TRY(lutra_backend_get(t->device, &be, fn));
  size_t bytes = (size_t)n * lutra_dtype_size(t->dtype);
  if (t->dtype == LUTRA_F32)
    return lutra_tensor_mark_written(t, be->from_host(t->data, src, bytes));
  void *tmp;
  TRY(host_buffer(bytes, &tmp, fn));
  host_convert(src, LUTRA_F32, tmp, t->dtype, n);
  int st = be->from_host(t->data, tmp, bytes);
  free(tmp);
  return lutra_tensor_mark_written(t, st);
}

/* the checks of the i32 copies in and out (host: their src or dst), and t's backend */
static int i32_copy_backend(const lutra_tensor *t, const void *host, const char *host_name,
                            int64_t n, const lutra_backend **be, const char *fn) {
  TRY(lutra_check_tensor(t, fn, "tensor"));
  CHECK_ARG(host, "%s is NULL", host_name);
  CHECK_ARG(t->dtype == LUTRA_I32, "tensor dtype %s is not i32", lutra_dtype_name(t->dtype));
  TRY(check_count(t, n, fn));
  return lutra_backend_get(t->device, be, fn);
}

int lutra_tensor_set_i32(lutra_tensor *t, const int32_t *src, int64_t n) {
  const lutra_backend *be;
  TRY(i32_copy_backend(t, src, "src", n, &be, "lutra_tensor_set_i32"));
  return lutra_tensor_mark_written(t, be->from_host(t->data, src, (size_t)n * 4));
}

/* lutra_tensor_get_f32 before its NaNs are made canonical */
static int read_f32(const lutra_tensor *t, float *dst, int64_t n) {
  static const char fn[] = "lutra_tensor_get_f32";
  TRY(lutra_check_tensor(t, fn, "tensor"));
  CHECK_ARG(dst, "dst is NULL");
  TRY(check_count(t, n, fn));
  const lutra_backend *be;
  TRY(lutra_backend_get(t->device, &be, fn));
  if (t->dtype == LUTRA_F32) return be->to_host(dst, t->data, (size_t)n * 4);
  if (t->dtype == LUTRA_I32)
    return lutra_error(LUTRA_EINVAL, fn, "tensor dtype is i32: read it with lutra_tensor_get_i32");
  if (lutra_dtype_is_quantized(t->dtype)) {
    lutra_tensor tmp = {0};
    tmp.ndim = 1;
    tmp.shape[0] = n;
    tmp.numel = n;
    tmp.dtype = LUTRA_F32;
    tmp.device = t->device;
    TRY(be->alloc((size_t)n * 4, &tmp.data));
    int st = lutra_dequantize(t, t->data ? 0 : 1, &tmp);
    if (st == LUTRA_OK && !t->data) {
      /* only the columnwise copy exists: it is the transpose */
      float *host;
      st = host_buffer((size_t)n * 4, (void **)&host, fn);
      if (st == LUTRA_OK) st = be->to_host(host, tmp.data, (size_t)n * 4);
      int64_t rows = lutra_rows(t), cols = lutra_cols(t);
      for (int64_t r = 0; st == LUTRA_OK && r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
          dst[r * cols + c] = host[c * rows + r];
      free(host);
    } else if (st == LUTRA_OK) {
      st = be->to_host(dst, tmp.data, (size_t)n * 4);
    }
    be->free(tmp.data);
    return st;
  }
  size_t bytes = (size_t)n * lutra_dtype_size(t->dtype);
  void *tmp;
  TRY(host_buffer(bytes, &tmp, fn));
  int st = be->to_host(tmp, t->data, bytes);
  if (st == LUTRA_OK) host_convert(tmp, t->dtype, dst, LUTRA_F32, n);
  free(tmp);
  return st;
}

int lutra_tensor_get_f32(const lutra_tensor *t, float *dst, int64_t n) {
  int st = read_f32(t, dst, n);
  if (st == LUTRA_OK) lutra_canonical_nans(dst, n);
  return st;
}

int lutra_tensor_get_i32(const lutra_tensor *t, int32_t *dst, int64_t n) {
  const lutra_backend *be;
  TRY(i32_copy_backend(t, dst, "dst", n, &be, "lutra_tensor_get_i32"));
  return be->to_host(dst, t->data, (size_t)n * 4);
}

int lutra_tensor_get_bytes(const lutra_tensor *t, int columnwise, void *dst, size_t bytes) {
  static const char fn[] = "lutra_tensor_get_bytes";
  TRY(lutra_check_tensor(t, fn, "tensor"));
  CHECK_ARG(dst, "dst is NULL");
  const void *src = columnwise ? t->col_data : t->data;
  CHECK_ARG(src, "tensor has no %s data", columnwise ? "columnwise" : "rowwise");
  size_t have = lutra_dtype_bytes(t->dtype, t->numel);
  CHECK_ARG(bytes == have, "%zu bytes asked for a tensor of %zu bytes", bytes, have);
  const lutra_backend *be;
  TRY(lutra_backend_get(t->device, &be, fn));
  return be->to_host(dst, src, bytes);
}

int lutra_tensor_fill(lutra_tensor *t, float value) {
  static const char fn[] = "lutra_tensor_fill";
  TRY(lutra_check_tensor(t, fn, "tensor"));
  CHECK_ARG(lutra_dtype_is_float(t->dtype), "tensor dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(t->dtype));
  const lutra_backend *be;
  TRY(lutra_backend_get(t->device, &be, fn));
  return lutra_tensor_mark_written(t, be->fill(t->data, t->dtype, t->numel, value));
}

int lutra_tensor_copy(lutra_tensor *dst, const lutra_tensor *src) {
  static const char fn[] = "lutra_tensor_copy";
  TRY(lutra_check_tensor(dst, fn, "dst"));
  TRY(lutra_check_tensor(src, fn, "src"));
  CHECK_ARG(dst->numel == src->numel, "dst has %lld elements, src %lld", (long long)dst->numel,
            (long long)src->numel);
  CHECK_ARG(dst->device == src->device, "dst and src are on different devices");
  CHECK_ARG(lutra_dtype_is_float(dst->dtype), "dst dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(dst->dtype));
  if (lutra_dtype_is_quantized(src->dtype))
    return lutra_tensor_mark_written(dst, lutra_dequantize(src, 0, dst));
  CHECK_ARG(lutra_dtype_is_float(src->dtype), "src dtype %s cannot be copied",
            lutra_dtype_name(src->dtype));
  const lutra_backend *be;
  TRY(lutra_backend_get(dst->device, &be, fn));
  int st = src->dtype == dst->dtype
               ? be->copy(dst->data, src->data, (size_t)src->numel * lutra_dtype_size(src->dtype))
               : be->convert(src->data, src->dtype, dst->data, dst->dtype, src->numel);
  return lutra_tensor_mark_written(dst, st);
}

int lutra_tensor_reshape(lutra_tensor *t, int ndim, const int64_t *shape) {
  static const char fn[] = "lutra_tensor_reshape";
  TRY(lutra_check_tensor(t, fn, "tensor"));
  CHECK_STATE(!(t->flags & LUTRA_TENSOR_BORROWED),
              "tensor is owned by a module, quantizer or loss, whose next call needs its shape; "
              "copy it into a tensor of your own first (lutra_tensor_copy)");
  CHECK_ARG(t->scaling == LUTRA_SCALING_NONE, "an FP8 tensor cannot be reshaped");
  int64_t numel;
  TRY(check_shape(ndim, shape, &numel, fn));
  CHECK_ARG(numel == t->numel, "new shape has %lld elements, tensor %lld", (long long)numel,
            (long long)t->numel);
  memset(t->shape, 0, sizeof t->shape);
  memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  t->ndim = ndim;
  return LUTRA_OK;
}

int lutra_tensor_amax(const lutra_tensor *t, float *amax) {
  static const char fn[] = "lutra_tensor_amax";
  TRY(lutra_check_tensor(t, fn, "tensor"));
  CHECK_ARG(amax, "amax is NULL");
  CHECK_ARG(lutra_dtype_is_float(t->dtype), "tensor dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(t->dtype));
  const lutra_backend *be;
  TRY(lutra_backend_get(t->device, &be, fn));
  float *dev;
  TRY(be->alloc(sizeof(float), (void **)&dev));
  int st = be->memset(dev, 0, sizeof(float));
  if (st == LUTRA_OK) st = be->amax(t->data, t->dtype, t->numel, dev);
  if (st == LUTRA_OK) st = be->to_host(amax, dev, sizeof(float));
  if (st == LUTRA_OK) *amax = lutra_canonical_nan(*amax);
  be->free(dev);
  return st;
}

/* FP8 back to f32/bf16/f16 is a tensor operation: it needs the codes and scales the tensor
 * holds, not the quantizer that made them. */
int lutra_dequantize(const lutra_tensor *q, int columnwise, lutra_tensor *out) {
  static const char fn[] = "lutra_dequantize";
  TRY(lutra_check_tensor(q, fn, "q"));
  TRY(lutra_check_tensor(out, fn, "out"));
  CHECK_ARG(lutra_dtype_is_quantized(q->dtype) && q->scaling != LUTRA_SCALING_NONE,
            "q is not an FP8 tensor");
  CHECK_ARG(lutra_dtype_is_float(out->dtype), "out dtype %s is not f32, bf16 or f16",
            lutra_dtype_name(out->dtype));
  CHECK_ARG(out->numel == q->numel, "out has %lld elements, q %lld", (long long)out->numel,
            (long long)q->numel);
  CHECK_ARG(out->device == q->device, "out is on another device");
  const void *data = columnwise ? q->col_data : q->data;
  CHECK_ARG(data, "q has no %s data", columnwise ? "columnwise" : "rowwise");
  const lutra_backend *be;
  TRY(lutra_backend_get(q->device, &be, fn));
  int64_t rows = lutra_rows(q), cols = lutra_cols(q);
  lutra_dequant_args a = {
      .data = data,
      .scale_inv = columnwise ? q->col_scale_inv : q->scale_inv,
      .dtype = q->dtype,
      .scaling = q->scaling,
      .rows = columnwise ? cols : rows,
      .cols = columnwise ? rows : cols,
      .out = out->data,
      .out_dtype = out->dtype,
  };
  return be->dequantize(&a);
}
