/* Data-parallel gradient averaging (lutra_grad_sync_*): a module's gradients collected once and
 * packed into buckets of one dtype and device, each all-reduced (AVG) over the group in one
 * collective. A bucket of one gradient is reduced in place; larger ones through a contiguous
 * buffer the sync owns (copies in, one collective, copies out), so the number of collectives per
 * step is the number of buckets, not of parameters. */
#include "backend/device.h"
#include "core/error.h"
#include "core/object.h"
#include "dist/group.h"
#include "nn/module.h"

#include <stdlib.h>

typedef struct bucket {
  int first, count; /* into grads[] */
  int64_t elements;
  int32_t dtype, device;
  void *buf; /* NULL when count == 1 */
} bucket;

struct lutra_grad_sync {
  lutra_object obj;
  lutra_group *group;
  lutra_module *module;
  lutra_tensor **grads;
  int ngrads;
  bucket *buckets;
  int nbuckets;
  int64_t elements;
};

static void release(lutra_grad_sync *s) {
  for (int i = 0; i < s->nbuckets; i++) {
    const lutra_backend *be;
    if (s->buckets[i].buf &&
        lutra_backend_get(s->buckets[i].device, &be, "lutra_grad_sync_free") == LUTRA_OK)
      be->free(s->buckets[i].buf);
  }
  free(s->buckets);
  free(s->grads);
  if (s->module) lutra_module_free(s->module);
  lutra_group_free(s->group);
}

int lutra_grad_sync_free(lutra_grad_sync *s) {
  if (!s) return LUTRA_OK;
  TRY(lutra_check_object(s, LUTRA_MAGIC_GRAD_SYNC, "lutra_grad_sync_free", "grad sync"));
  release(s);
  free(s);
  return LUTRA_OK;
}

static int collect(lutra_grad_sync *s, const char *fn) {
  int n;
  TRY(lutra_module_num_params(s->module, &n));
  s->grads = calloc((size_t)(n ? n : 1), sizeof *s->grads);
  s->buckets = calloc((size_t)(n ? n : 1), sizeof *s->buckets);
  if (!s->grads || !s->buckets) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate the lists");
  for (int i = 0; i < n; i++) {
    lutra_param p;
    TRY(lutra_module_param(s->module, i, &p));
    lutra_tensor *g = p.main_grad ? p.main_grad : p.grad;
    if (!g) continue;
    CHECK_ARG(g->dtype == LUTRA_F32 || g->dtype == LUTRA_BF16,
              "parameter %d's gradient is %s (f32 or bf16 are averaged)", i,
              lutra_dtype_name(g->dtype));
    s->grads[s->ngrads++] = g;
  }
  return LUTRA_OK;
}

static int plan(lutra_grad_sync *s, int64_t bucket_bytes, const char *fn) {
  for (int i = 0; i < s->ngrads; i++) {
    lutra_tensor *g = s->grads[i];
    bucket *b = s->nbuckets ? &s->buckets[s->nbuckets - 1] : NULL;
    int64_t bytes = g->numel * (int64_t)lutra_dtype_size(g->dtype);
    if (!b || b->dtype != g->dtype || b->device != g->device ||
        (b->elements * (int64_t)lutra_dtype_size(b->dtype) + bytes > bucket_bytes)) {
      b = &s->buckets[s->nbuckets++];
      *b = (bucket){.first = i, .dtype = g->dtype, .device = g->device};
    }
    b->count++;
    b->elements += g->numel;
    s->elements += g->numel;
  }
  for (int i = 0; i < s->nbuckets; i++) {
    bucket *b = &s->buckets[i];
    if (b->count == 1) continue;
    const lutra_backend *be;
    TRY(lutra_backend_get(b->device, &be, fn));
    TRY(be->alloc((size_t)b->elements * lutra_dtype_size(b->dtype), &b->buf));
  }
  return LUTRA_OK;
}

int lutra_grad_sync_new(lutra_group *g, lutra_module *m, int64_t bucket_bytes,
                        lutra_grad_sync **out) {
  static const char fn[] = "lutra_grad_sync_new";
  TRY(lutra_group_check(g, fn));
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(out, "out is NULL");
  if (bucket_bytes <= 0) bucket_bytes = 25 << 20;
  lutra_grad_sync *s = calloc(1, sizeof *s);
  if (!s) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a grad sync");
  s->obj.magic = LUTRA_MAGIC_GRAD_SYNC;
  s->obj.refs = 1;
  s->group = g;
  lutra_group_retain(g);
  s->module = m;
  lutra_module_retain(m);
  int st = collect(s, fn);
  if (st == LUTRA_OK) st = plan(s, bucket_bytes, fn);
  if (st == LUTRA_OK) {
    int64_t v[2] = {s->nbuckets, s->elements};
    st = lutra_dist_agree(g, v, 2, "the data-parallel gradients' (buckets, elements)", fn);
  }
  if (st != LUTRA_OK) {
    release(s);
    free(s);
    return st;
  }
  *out = s;
  return LUTRA_OK;
}

int lutra_grad_sync_run(lutra_grad_sync *s) {
  static const char fn[] = "lutra_grad_sync_run";
  TRY(lutra_check_object(s, LUTRA_MAGIC_GRAD_SYNC, fn, "grad sync"));
  TRY(lutra_group_check(s->group, fn));
  TRY(lutra_check_object(s->module, LUTRA_MAGIC_MODULE, fn, "module"));
  for (int i = 0; i < s->nbuckets; i++) {
    bucket *b = &s->buckets[i];
    lutra_tensor **gs = s->grads + b->first;
    if (!b->buf) {
      TRY(lutra_dist_all_reduce(s->group, gs[0]->data, b->elements, b->dtype, LUTRA_REDUCE_AVG,
                                b->device, fn));
      continue;
    }
    const lutra_backend *be;
    TRY(lutra_backend_get(b->device, &be, fn));
    size_t es = lutra_dtype_size(b->dtype), off = 0;
    for (int j = 0; j < b->count; j++) {
      TRY(be->copy((char *)b->buf + off, gs[j]->data, (size_t)gs[j]->numel * es));
      off += (size_t)gs[j]->numel * es;
    }
    TRY(lutra_dist_all_reduce(s->group, b->buf, b->elements, b->dtype, LUTRA_REDUCE_AVG, b->device,
                              fn));
    off = 0;
    for (int j = 0; j < b->count; j++) {
      TRY(be->copy(gs[j]->data, (char *)b->buf + off, (size_t)gs[j]->numel * es));
      off += (size_t)gs[j]->numel * es;
    }
  }
  return LUTRA_OK;
}

int lutra_grad_sync_info(const lutra_grad_sync *s, int *buckets, int64_t *elements) {
  static const char fn[] = "lutra_grad_sync_info";
  TRY(lutra_check_object(s, LUTRA_MAGIC_GRAD_SYNC, fn, "grad sync"));
  CHECK_ARG(buckets && elements, "output pointers must not be NULL");
  *buckets = s->nbuckets;
  *elements = s->elements;
  return LUTRA_OK;
}
