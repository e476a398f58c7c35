/* NCCL communicators of a group (parallel/nccl.c), bootstrapped over the group's MPI communicator.
 * Only in CUDA builds with MPI; elsewhere the calls fail saying so. Non-blocking communicators:
 * every NCCL call that returns ncclInProgress is polled (ncclCommGetAsyncError) until it is done
 * or the timeout passes, when the communicator is aborted (ncclCommAbort) and the call fails. */
#ifndef LUTRA_DIST_NCCL_H
#define LUTRA_DIST_NCCL_H

#include "parallel/group.h"

typedef struct lutra_nccl_boot {
  void *mpi_comm; /* the group's MPI_Comm, by address */
  int rank, size;
  double timeout_s;
} lutra_nccl_boot;

/* *slot made at the first call (collective over the group), then returned as it is. */
int lutra_nccl_get(lutra_nccl **slot, const lutra_nccl_boot *b, const char *fn);
int lutra_nccl_all_reduce(lutra_nccl *n, void *buf, int64_t count, int dtype, int op,
                          const char *fn);
int lutra_nccl_all_gather(lutra_nccl *n, const void *send, void *recv, size_t bytes,
                          const char *fn);
int lutra_nccl_reduce_scatter(lutra_nccl *n, const void *send, void *recv, int64_t count, int dtype,
                              const char *fn);
/* amax_history[0] of each meta replaced by its max over the group: gathered into the
 * communicator's contiguous device buffer, one ncclAllReduce(max), scattered back. */
int lutra_nccl_reduce_amax(lutra_nccl *n, lutra_scale_meta *const *metas, int count,
                           const char *fn);
/* the CUDA side of lutra_dist_bucket_start / _finish (parallel/group.h) */
int lutra_nccl_bucket_start(lutra_nccl *n, const lutra_dist_piece *pieces, int count, void *buf,
                            int64_t elems, int dtype, void **done, const char *fn);
int lutra_nccl_bucket_finish(lutra_nccl *n, void *done, const char *fn);
void lutra_nccl_event_destroy(void *event);
/* Waits for lutra's stream, polling the communicator's async error, at most the timeout. */
int lutra_nccl_wait(lutra_nccl *n, const char *fn);

#endif
