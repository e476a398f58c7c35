/* lutra/dist.h: process groups over MPI (CPU collectives, bootstrap) and NCCL (CUDA).
 * Part of lutra.h (include that one; its conventions hold here).
 *
 * A group is a refcounted object whose rank, size, device and communicators are fixed when it is
 * made, so a collective costs its launch and nothing else. Built without MPI (MPI=0, or no mpicc
 * at build time) every call here fails with LUTRA_EUNSUPPORTED "built without MPI".
 *
 * Collectives on CPU tensors go through MPI (non-blocking, polled until done or the timeout);
 * on CUDA tensors through NCCL on lutra's stream: one non-blocking communicator per group,
 * created at the group's first CUDA collective from a unique id broadcast over MPI (a stream
 * capture may record the collectives; the first one must run outside the capture). A collective
 * that does not complete within the timeout (a peer died or called something else) fails with
 * LUTRA_EBACKEND naming the call and the group; the NCCL communicator is then aborted, the
 * group is broken and every later collective on it fails: end the process (lutra_dist_abort). */
#ifndef LUTRA_DIST_H
#define LUTRA_DIST_H

#include "autocast.h"
#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { LUTRA_REDUCE_SUM = 0, LUTRA_REDUCE_MAX = 1, LUTRA_REDUCE_AVG = 2 };

/* 1 when this build has MPI (and, with CUDA, NCCL). */
LUTRA_API int lutra_dist_available(void);
/* Calls MPI_Init unless the host did; comm: NULL for MPI_COMM_WORLD, else a pointer to the
 * host's MPI_Comm (lutra duplicates it). timeout_s: how long a collective may wait for its peers
 * (<= 0: 300 s, or LUTRA_DIST_TIMEOUT seconds when set). MPI errors return (MPI_ERRORS_RETURN
 * on lutra's communicators). A second call is refused unless it changes nothing. */
LUTRA_API int lutra_dist_init(const void *comm, double timeout_s);
/* MPI_Finalize when lutra called MPI_Init (also run at exit); groups still held become broken. */
LUTRA_API int lutra_dist_finalize(void);
/* Ends every process of the job now (MPI_Abort), for a rank that saw a collective fail. */
LUTRA_API int lutra_dist_abort(int code);

typedef struct lutra_group lutra_group;
/* A new reference to the group of every process (that lutra_dist_init was given). */
LUTRA_API int lutra_dist_world(lutra_group **out);
/* MPI_Comm_split: processes of one color form a group, ordered by key then old rank. Collective
 * over g. color < 0: this process joins no group (*out is NULL). */
LUTRA_API int lutra_group_split(lutra_group *g, int color, int key, lutra_group **out);
LUTRA_API int lutra_group_rank(const lutra_group *g, int *rank);
LUTRA_API int lutra_group_size(const lutra_group *g, int *size);
/* Drops a reference: the communicators go when the last holder (autocast scopes and parallel
 * modules hold theirs) lets go. */
LUTRA_API int lutra_group_unref(lutra_group *g);

/* Collectives a group has issued, by kind (specs and benchmarks count them). */
typedef struct lutra_group_stats {
  uint64_t all_reduce;
  uint64_t all_gather;
  uint64_t reduce_scatter;
  uint64_t broadcast;
  uint64_t amax_reduce; /* of all_reduce: the autocast amax reductions */
  uint64_t bytes;       /* bytes this rank sent into collectives (its contribution) */
} lutra_group_stats;
LUTRA_API int lutra_group_stats_get(const lutra_group *g, lutra_group_stats *out);

/* Tensor collectives (every rank calls them with the same dtype and shape: checked by a small
 * extra all-reduce when a call's shape differs from the last of its kind, so a steady loop runs
 * none; a mismatch names the ranks that disagree).
 *   all_reduce      t = op over ranks of t, in place (F32 or BF16; AVG divides the sum)
 *   all_gather      y [size * rows(x), cols] = the ranks' x stacked by rank (any dtype: FP8
 *                   tensors gather their codes, with the rowwise scale_inv of rank 0)
 *   reduce_scatter  y [rows(x) / size, cols] = this rank's row block of the sum of the x
 * y must have the shape stated and x's dtype and device. */
LUTRA_API int lutra_group_all_reduce(lutra_group *g, lutra_tensor *t, int op);
LUTRA_API int lutra_group_all_gather(lutra_group *g, const lutra_tensor *x, lutra_tensor *y);
LUTRA_API int lutra_group_reduce_scatter(lutra_group *g, const lutra_tensor *x, lutra_tensor *y);
LUTRA_API int lutra_group_barrier(lutra_group *g);

/* ---- tensor-parallel modules (TransformerEngine's / Megatron's definitions) ----------------
 * d gives the FULL layer (in_features, out_features as unsharded); each rank holds its shard:
 *   COLUMN  W [out/size, in], bias [out/size]: the output features are sharded; the input is
 *           whole (with sequence_parallel: this rank's [rows, in] of the sequence, all-gathered
 *           to [size * rows, in] before the GEMM); the backward's dgrad is all-reduced (with
 *           sequence_parallel: reduce-scattered back to this rank's rows); wgrad and the bias
 *           gradient stay local.
 *   ROW     W [out, in/size], bias [out] (whole, added once after the reduction): the input
 *           features are sharded (the input is [rows, in/size]); the output is all-reduced
 *           (with sequence_parallel: reduce-scattered to [rows/size, out]); the backward gathers
 *           dy (sequence_parallel) and its dgrad stays local; the bias gradient is over all rows
 *           and the same on every rank.
 * size must divide the sharded dimension (and the rows, for a sequence-parallel row layer).
 * Weights are drawn per shard (seed + rank) with the full layer's bound 1/sqrt(in_features).
 * The ranks' shapes, dtype and recipe are compared once per input shape (first call). */
enum { LUTRA_TP_NONE = 0, LUTRA_TP_COLUMN = 1, LUTRA_TP_ROW = 2 };
typedef struct lutra_tp_desc {
  int32_t mode; /* LUTRA_TP_* */
  int32_t sequence_parallel;
  lutra_group *group; /* the tensor-parallel group (held by the module) */
} lutra_tp_desc;
LUTRA_API int lutra_linear_parallel_new(const lutra_linear_desc *d, const lutra_tp_desc *tp,
                                        lutra_module **out);

/* ---- data parallel: gradients averaged over a group ----------------------------------------
 * Collects m's parameter gradients once (main_grad where the module accumulates into one, else
 * grad) into buckets of about bucket_bytes (<= 0: 25 MiB) of one dtype, in the order a backward
 * finishes them (the parameters' order reversed), each all-reduced (AVG) by one collective.
 *   begin   arms the sync for this thread's next backward: each bucket's all-reduce starts as
 *           soon as the Linear cores have finished all of its gradients (their wgrad done), while
 *           the rest of the backward runs (on CUDA on the group's comm stream, ordered by events)
 *   finish  starts what has not started (gradients of modules that do not report), waits for
 *           every bucket (CUDA: lutra's stream waits for the comm stream, the host does not) and
 *           disarms; a second finish (or one after the optimizer's) does nothing
 *   run     begin (when not armed) + finish: everything after the backward
 * The optimizer step waits by itself, as with PyTorch's DistributedDataParallel, whose optimizer
 * knows nothing of the wrapper: lutra_optim_step first finishes the sync armed on its thread
 * when that sync averages any gradient the optimizer reads (an optimizer over the module, a
 * part of it, or a model that contains it; made before or after the sync), so begin, backward,
 * step is a whole data-parallel step, on the CPU (the host waits for MPI) and on CUDA (the
 * step's kernels run on lutra's stream, which waits for the comm stream's event: no host wait).
 * The sync is not handed to the optimizer: a DDP user never gives the wrapper to the optimizer,
 * and either may be made first. DDP finishes at the end of the backward instead; lutra's
 * backward is a chain of module calls with no last one to hook, and the step is the first
 * reader of the averaged gradients. Code
 * that reads them before the step (clipping, inspection) calls finish first. The lookup of
 * which sync covers an optimizer's gradients runs once per (optimizer, sync); a step with no
 * sync armed pays one thread-local test. With a CUDA graph, the same calls are captured.
 * With gradient accumulation, arm only the last micro-batch's backward. */
typedef struct lutra_grad_sync lutra_grad_sync;
LUTRA_API int lutra_grad_sync_new(lutra_group *g, lutra_module *m, int64_t bucket_bytes,
                                  lutra_grad_sync **out);
LUTRA_API int lutra_grad_sync_begin(lutra_grad_sync *s);
LUTRA_API int lutra_grad_sync_finish(lutra_grad_sync *s);
LUTRA_API int lutra_grad_sync_run(lutra_grad_sync *s);
/* buckets: collectives per step; early: of those, how many the last step started before finish */
LUTRA_API int lutra_grad_sync_info(const lutra_grad_sync *s, int *buckets, int64_t *elements,
                                   int *early);
LUTRA_API int lutra_grad_sync_unref(lutra_grad_sync *s);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_DIST_H */
