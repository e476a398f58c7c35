/* Data-parallel gradient averaging (lutra_grad_sync_*; lutra/dist.h). A module's gradients,
 * handed over once by nn/module_grad_sync.c in the order a backward finishes them (the
 * parameters reversed), are packed into buckets of one dtype and device, each all-reduced (AVG)
 * over the group by one collective: a bucket of one gradient in place, larger ones through a
 * contiguous buffer the sync owns. Armed (begin), a sync hears from the Linear cores when a
 * gradient is final (lutra_dist_grad_ready, a thread-local pointer test when none is armed) and
 * starts a bucket's collective as soon as all its gradients are in, so communication overlaps the
 * rest of the backward; finish starts the rest and waits.
 *
 * The optimizer waits by itself (lutra_dist_settle_grads, called first thing in a step): the
 * sync armed on the stepping thread is finished when it averages any gradient the step reads.
 * Which syncs cover an optimizer's gradients is worked out once per (optimizer, sync): a sync
 * keeps its gradients' addresses sorted, and carries a serial number no other sync reuses, which
 * the optimizer remembers with the answer; a step with no sync armed costs one thread-local test.
 */
#include "backend/device.h"
#include "core/error.h"
#include "core/object.h"
#include "parallel/group.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct bucket {
  int first, count; /* into grads[] / pieces[] */
  int ready;        /* gradients in, this step */
  int64_t elements;
  int32_t dtype, device;
  void *buf; /* the lone gradient's data when count == 1 */
  bool owned;
  lutra_dist_pending pending;
} bucket;

struct lutra_grad_sync {
  lutra_object obj;
  lutra_group *group;
  lutra_grad_sync_owner owner; /* what the gradients belong to (a module) */
  lutra_tensor **grads;
  lutra_dist_piece *pieces;
  int *bucket_of; /* grads[i]'s bucket */
  bool *seen;     /* grads[i] reported this step */
  int ngrads;
  bucket *buckets;
  int nbuckets;
  int64_t elements;
  int early; /* buckets the last step started before finish */
  bool armed;
  bool finished;           /* finished since the last begin: a second finish has nothing to do */
  uint64_t serial;         /* unique over the process: what optimizers remember a sync by */
  const void **by_address; /* grads[i]->data, sorted, for the optimizers' lookup */
  const char *error_fn;    /* a bucket start that failed while armed, reported by finish */
  int error_status;
};

static _Thread_local lutra_grad_sync *armed;

static void release(lutra_grad_sync *s) {
  if (armed == s) armed = NULL;
  for (int i = 0; i < s->nbuckets; i++) {
    bucket *b = &s->buckets[i];
    const lutra_backend *be;
    /* a collective still running reads and writes the buffer: let it end first, and keep the
     * buffer (leaked) when it cannot */
    if (b->pending.active &&
        lutra_dist_bucket_finish(s->group, s->pieces + b->first, b->count, b->buf, b->elements,
                                 b->dtype, b->device, &b->pending,
                                 "lutra_grad_sync_unref") != LUTRA_OK)
      b->owned = false;
    lutra_dist_pending_release(&s->buckets[i].pending);
    if (s->buckets[i].owned &&
        lutra_backend_get(s->buckets[i].device, &be, "lutra_grad_sync_unref") == LUTRA_OK)
      be->free(s->buckets[i].buf);
  }
  free(s->buckets);
  free(s->grads);
  free(s->pieces);
  free(s->bucket_of);
  free(s->seen);
  free(s->by_address);
  if (s->owner.obj) s->owner.drop(s->owner.obj);
  lutra_group_unref(s->group);
}

int lutra_grad_sync_unref(lutra_grad_sync *s) {
  if (!s) return LUTRA_OK;
  TRY(lutra_check_object(s, LUTRA_MAGIC_GRAD_SYNC, "lutra_grad_sync_unref", "grad sync"));
  release(s);
  free(s);
  return LUTRA_OK;
}

static int compare_address(const void *a, const void *b) {
  const void *const *pa = a, *const *pb = b;
  uintptr_t x = (uintptr_t)*pa, y = (uintptr_t)*pb;
  return (x > y) - (x < y);
}

static _Atomic uint64_t last_serial;

static int collect(lutra_grad_sync *s, lutra_tensor *const *grads, int n, const char *fn) {
  size_t cap = (size_t)(n ? n : 1);
  s->grads = calloc(cap, sizeof *s->grads);
  s->pieces = calloc(cap, sizeof *s->pieces);
  s->bucket_of = calloc(cap, sizeof *s->bucket_of);
  s->seen = calloc(cap, sizeof *s->seen);
  s->buckets = calloc(cap, sizeof *s->buckets);
  s->by_address = calloc(cap, sizeof *s->by_address);
  if (!s->grads || !s->pieces || !s->bucket_of || !s->seen || !s->buckets || !s->by_address)
    return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate the lists");
  for (int i = 0; i < n; i++) {
    lutra_tensor *g = grads[i];
    s->pieces[s->ngrads] = (lutra_dist_piece){.data = g->data, .n = g->numel};
    s->by_address[s->ngrads] = g->data;
    s->grads[s->ngrads++] = g;
  }
  qsort(s->by_address, (size_t)s->ngrads, sizeof *s->by_address, compare_address);
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
    s->bucket_of[i] = s->nbuckets - 1;
  }
  for (int i = 0; i < s->nbuckets; i++) {
    bucket *b = &s->buckets[i];
    if (b->count == 1) {
      b->buf = s->grads[b->first]->data;
      continue;
    }
    const lutra_backend *be;
    TRY(lutra_backend_get(b->device, &be, fn));
    TRY(be->alloc((size_t)b->elements * lutra_dtype_size(b->dtype), &b->buf));
    b->owned = true;
  }
  return LUTRA_OK;
}

int lutra_grad_sync_make(lutra_group *g, lutra_tensor *const *grads, int n, int64_t bucket_bytes,
                         const lutra_grad_sync_owner *owner, lutra_grad_sync **out,
                         const char *fn) {
  if (bucket_bytes <= 0) bucket_bytes = 25 << 20;
  lutra_grad_sync *s = calloc(1, sizeof *s);
  if (!s) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a grad sync");
  s->obj.magic = LUTRA_MAGIC_GRAD_SYNC;
  s->obj.refs = 1;
  s->group = g;
  lutra_group_retain(g);
  s->serial = atomic_fetch_add(&last_serial, 1) + 1;
  int st = collect(s, grads, n, fn);
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
  s->owner = *owner;
  *out = s;
  return LUTRA_OK;
}

static int start(lutra_grad_sync *s, bucket *b, const char *fn) {
  return lutra_dist_bucket_start(s->group, s->pieces + b->first, b->count, b->buf, b->elements,
                                 b->dtype, b->device, &b->pending, fn);
}

static int check_live(lutra_grad_sync *s, const char *fn) {
  TRY(lutra_check_object(s, LUTRA_MAGIC_GRAD_SYNC, fn, "grad sync"));
  TRY(lutra_group_check(s->group, fn));
  return lutra_check_object(s->owner.obj, s->owner.magic, fn, s->owner.what);
}

int lutra_grad_sync_begin(lutra_grad_sync *s) {
  static const char fn[] = "lutra_grad_sync_begin";
  TRY(check_live(s, fn));
  CHECK_STATE(!s->armed, "already armed: finish the last step first");
  CHECK_STATE(!armed, "another grad sync is armed on this thread: finish it first");
  for (int i = 0; i < s->nbuckets; i++)
    s->buckets[i].ready = 0;
  memset(s->seen, 0, (size_t)s->ngrads * sizeof *s->seen);
  s->early = 0;
  s->error_status = LUTRA_OK;
  s->armed = true;
  s->finished = false;
  armed = s;
  return LUTRA_OK;
}

void lutra_dist_grad_ready(const lutra_tensor *grad) {
  lutra_grad_sync *s = armed;
  if (!s || s->error_status != LUTRA_OK) return;
  for (int i = 0; i < s->ngrads; i++) {
    if (s->grads[i] != grad || s->seen[i]) continue;
    s->seen[i] = true;
    bucket *b = &s->buckets[s->bucket_of[i]];
    if (++b->ready == b->count) {
      int st = start(s, b, "lutra_module_backward");
      if (st != LUTRA_OK)
        s->error_status = st; /* finish reports it */
      else
        s->early++;
    }
    return;
  }
}

/* Starts the buckets that have not started and waits for all; fn names the caller (finish, or
 * the optimizer step that waits for it). */
static int finish(lutra_grad_sync *s, const char *fn) {
  s->armed = false;
  s->finished = true;
  if (armed == s) armed = NULL;
  int st = s->error_status;
  if (st != LUTRA_OK)
    lutra_error(st, fn, "a gradient bucket's all-reduce failed to start during the backward");
  for (int i = 0; st == LUTRA_OK && i < s->nbuckets; i++)
    if (!s->buckets[i].pending.active) st = start(s, &s->buckets[i], fn);
  for (int i = 0; i < s->nbuckets; i++) {
    bucket *b = &s->buckets[i];
    int f = lutra_dist_bucket_finish(s->group, s->pieces + b->first, b->count, b->buf, b->elements,
                                     b->dtype, b->device, &b->pending, fn);
    if (st == LUTRA_OK) st = f;
  }
  return st;
}

int lutra_grad_sync_finish(lutra_grad_sync *s) {
  static const char fn[] = "lutra_grad_sync_finish";
  TRY(check_live(s, fn));
  if (!s->armed && s->finished) return LUTRA_OK; /* finished already (or by the optimizer) */
  CHECK_STATE(s->armed, "not armed: call begin before the backward (or use run)");
  return finish(s, fn);
}

static bool covers(const lutra_grad_sync *s, const void *const *grads, int count) {
  for (int i = 0; i < count; i++)
    if (bsearch(&grads[i], s->by_address, (size_t)s->ngrads, sizeof *s->by_address,
                compare_address))
      return true;
  return false;
}

int lutra_dist_settle_grads(const void *const *grads, int count, lutra_dist_settle_cache *cache,
                            const char *fn) {
  lutra_grad_sync *s = armed;
  if (!s) return LUTRA_OK;
  if (cache->serial != s->serial) {
    cache->serial = s->serial;
    cache->covers = covers(s, grads, count);
  }
  if (!cache->covers) return LUTRA_OK;
  TRY(check_live(s, fn));
  return finish(s, fn);
}

int lutra_grad_sync_run(lutra_grad_sync *s) {
  if (!(s && s->obj.magic == LUTRA_MAGIC_GRAD_SYNC && s->armed)) TRY(lutra_grad_sync_begin(s));
  return lutra_grad_sync_finish(s);
}

int lutra_grad_sync_info(const lutra_grad_sync *s, int *buckets, int64_t *elements, int *early) {
  static const char fn[] = "lutra_grad_sync_info";
  TRY(lutra_check_object(s, LUTRA_MAGIC_GRAD_SYNC, fn, "grad sync"));
  CHECK_ARG(buckets && elements && early, "output pointers must not be NULL");
  *buckets = s->nbuckets;
  *elements = s->elements;
  *early = s->early;
  return LUTRA_OK;
}
