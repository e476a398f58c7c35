/* Process-group internals (parallel/): what the layers above (autocast, the parallel modules) call.
 * Buffers are raw pointers on `device` (host memory for LUTRA_CPU: MPI; device memory for
 * LUTRA_CUDA: NCCL on lutra's stream). Each call counts itself in the group's stats. */
#ifndef LUTRA_DIST_GROUP_H
#define LUTRA_DIST_GROUP_H

#include "backend/backend.h"
#include "lutra.h"

#include <stdbool.h>
#include <stddef.h>

/* LUTRA_OK when g is a live, unbroken group. */
int lutra_group_check(const lutra_group *g, const char *fn);
/* A holder (scope, module) taking a reference; dropped with lutra_group_unref. */
void lutra_group_retain(lutra_group *g);
int lutra_group_rank_of(const lutra_group *g);
int lutra_group_size_of(const lutra_group *g);

int lutra_dist_all_reduce(lutra_group *g, void *buf, int64_t n, int dtype, int op, int device,
                          const char *fn);
/* recv [size][bytes]: each rank's `bytes` of send stacked by rank */
int lutra_dist_all_gather(lutra_group *g, const void *send, void *recv, size_t bytes, int device,
                          const char *fn);
/* send [size][n] (n elements per rank) summed; this rank's block into recv [n] */
int lutra_dist_reduce_scatter(lutra_group *g, const void *send, void *recv, int64_t n, int dtype,
                              int device, const char *fn);
/* The cheap agreement check: every rank passes the same n values (shapes, a recipe key); one
 * all-reduce(MAX) of (v, -v) finds a disagreement, then one all-gather names the ranks. */
int lutra_dist_agree(lutra_group *g, const int64_t *v, int n, const char *what, const char *fn);
/* lutra_dist_agree for the calls that repeat: only when v differs from what this slot's last
 * agreement covered (a new shape), so a steady loop runs no check. */
enum { LUTRA_AGREE_SLOTS = 5, LUTRA_AGREE_MAX = 8 };
int lutra_dist_agree_once(lutra_group *g, int slot, const int64_t *v, int n, const char *what,
                          const char *fn);
/* The amaxes of metas (amax_history[0] of each) replaced by their max over the group: one
 * all-reduce(MAX) over one contiguous buffer (the group keeps it, grown when n grows). backward:
 * which of the step's two reductions this is; the ranks' (count, device, recipe key) are
 * compared when they change for it (so a rank with another recipe or model is named). */
int lutra_dist_reduce_amax(lutra_group *g, lutra_scale_meta *const *metas, int n, int device,
                           bool backward, uint64_t recipe_key, const char *fn);

/* A bucket all-reduce (AVG) started now and finished later, for data parallelism overlapped
 * with the rest of a backward. CPU: MPI_Iallreduce on buf (the src pieces packed into it first
 * when there are several), finished by polling (against the timeout), then divided and
 * unpacked. CUDA: lutra's stream records an event, the group's comm stream waits for it, packs,
 * runs the NCCL all-reduce and unpacks, and finish makes lutra's stream wait for the comm
 * stream's event (no host wait). */
typedef struct lutra_dist_pending {
  uint64_t request; /* the MPI_Request, by value */
  void *done;       /* CUDA: the comm stream's event after the unpack */
  bool active;
} lutra_dist_pending;
typedef struct lutra_dist_piece {
  void *data;
  int64_t n;
} lutra_dist_piece;
int lutra_dist_bucket_start(lutra_group *g, const lutra_dist_piece *pieces, int count, void *buf,
                            int64_t n, int dtype, int device, lutra_dist_pending *p,
                            const char *fn);
int lutra_dist_bucket_finish(lutra_group *g, const lutra_dist_piece *pieces, int count, void *buf,
                             int64_t n, int dtype, int device, lutra_dist_pending *p,
                             const char *fn);
/* Called by modules when a parameter gradient is final for this backward (the Linear core after
 * its wgrad): a data-parallel sync armed on this thread starts the gradient's bucket once all of
 * the bucket's gradients are in. Free when none is armed. */
void lutra_dist_grad_ready(const lutra_tensor *grad);
/* What a grad sync's gradients belong to (a module): checked live (a lutra_object of magic,
 * named what in errors) at every begin and finish, and dropped (drop(obj)) with the sync. */
typedef struct lutra_grad_sync_owner {
  void *obj;
  uint32_t magic;
  const char *what;
  void (*drop)(void *obj);
} lutra_grad_sync_owner;
/* The sync of grads[0..n) (f32 or bf16, in the order a backward finishes them) over g, in
 * buckets of about bucket_bytes (<= 0: 25 MiB), every rank's (buckets, elements) agreed; it
 * holds g and, on success only, the caller's reference to owner (lutra_grad_sync_unref drops
 * both). Errors name fn. */
int lutra_grad_sync_make(lutra_group *g, lutra_tensor *const *grads, int n, int64_t bucket_bytes,
                         const lutra_grad_sync_owner *owner, lutra_grad_sync **out, const char *fn);
void lutra_dist_pending_release(lutra_dist_pending *p);
/* The optimizer's wait for data parallelism (lutra_optim_step, before it reads a gradient): the
 * grad sync armed on this thread, when it averages any of grads[0..count) (gradient data
 * addresses), is finished here as lutra_grad_sync_finish would (CPU: the host waits for MPI;
 * CUDA: lutra's stream, which the step's kernels run on, waits for the comm stream's event, the
 * host does not). cache: the caller's memory of the last sync it checked (zeroed at first), so
 * that the lookup runs once per sync; a step with none armed costs a thread-local test. */
typedef struct lutra_dist_settle_cache {
  uint64_t serial; /* the sync last checked (0: none) */
  bool covers;     /* whether it averages any of the caller's gradients */
} lutra_dist_settle_cache;
int lutra_dist_settle_grads(const void *const *grads, int count, lutra_dist_settle_cache *cache,
                            const char *fn);

/* the group's NCCL side (parallel/nccl.c; CUDA builds with MPI only) */
typedef struct lutra_nccl lutra_nccl;
void lutra_nccl_destroy(lutra_nccl *n);

#endif
