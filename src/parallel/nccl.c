/* A group's NCCL communicator (see parallel/nccl.h): made at the group's first CUDA collective, its
 * unique id made by rank 0 and broadcast over the group's MPI communicator, non-blocking
 * (config.blocking = 0) so that no NCCL call can hang the caller: each one that answers
 * ncclInProgress is polled against the timeout, then the communicator is aborted. Collectives go
 * on lutra's stream of the calling thread, so they order with lutra's kernels and a stream
 * capture (lutra_graph_begin) records them. */
#include "parallel/nccl.h"
#include "core/error.h"

#include <stdlib.h>

#if defined(LUTRA_WITH_MPI) && defined(LUTRA_WITH_CUDA)
#include "backend/cuda/cuda_backend.h"
#include "backend/device.h"
#include "kernels.h"

#include <mpi.h>
#include <nccl.h>
#include <sched.h>
#include <time.h>

struct lutra_nccl {
  ncclComm_t comm;
  double timeout_s;
  int size;
  bool aborted;
  float *amax; /* contiguous device buffer of the amax all-reduce */
  int amax_cap;
  cudaStream_t comm_stream; /* data-parallel buckets, overlapped with lutra's stream */
};

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int nccl_fail(ncclResult_t r, ncclComm_t comm, const char *fn, const char *what) {
  const char *last = comm ? ncclGetLastError(comm) : NULL;
  return lutra_error(LUTRA_EBACKEND, fn, "%s failed: %s%s%s", what, ncclGetErrorString(r),
                     last && *last ? ": " : "", last ? last : "");
}

static void abort_comm(lutra_nccl *n) {
  if (n->aborted) return;
  ncclCommAbort(n->comm);
  n->aborted = true;
}

/* Polls the communicator's state until the operation that answered r is done. */
static int settle(lutra_nccl *n, ncclResult_t r, const char *fn, const char *what) {
  double t0 = now_s();
  while (r == ncclInProgress) {
    ncclResult_t st = ncclCommGetAsyncError(n->comm, &r);
    if (st != ncclSuccess) r = st;
    if (r != ncclInProgress) break;
    if (now_s() - t0 > n->timeout_s) {
      abort_comm(n);
      return lutra_error(LUTRA_EBACKEND, fn,
                         "%s did not complete within %g s (a peer died or called another "
                         "collective); the NCCL communicator was aborted",
                         what, n->timeout_s);
    }
    sched_yield();
  }
  if (r != ncclSuccess) {
    int st = nccl_fail(r, n->comm, fn, what);
    abort_comm(n);
    return st;
  }
  return LUTRA_OK;
}

int lutra_nccl_get(lutra_nccl **slot, const lutra_nccl_boot *b, const char *fn) {
  if (*slot) {
    CHECK_STATE(!(*slot)->aborted, "the group's NCCL communicator was aborted");
    return LUTRA_OK;
  }
  const lutra_backend *be;
  TRY(lutra_backend_get(LUTRA_CUDA, &be, fn));
  CHECK_STATE(!lutra_graph_capturing(),
              "the group's first CUDA collective cannot be captured (it creates the NCCL "
              "communicator): run the step once before capturing it");
  MPI_Comm comm = *(MPI_Comm *)b->mpi_comm;
  ncclUniqueId id;
  if (b->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return nccl_fail(r, NULL, fn, "ncclGetUniqueId");
  }
  MPI_Request req;
  int rc = MPI_Ibcast(&id, (int)sizeof id, MPI_BYTE, 0, comm, &req);
  double t0 = now_s();
  for (int done = 0; rc == MPI_SUCCESS && !done;) {
    rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (!done && now_s() - t0 > b->timeout_s)
      return lutra_error(LUTRA_EBACKEND, fn,
                         "broadcasting the NCCL unique id did not complete within %g s",
                         b->timeout_s);
  }
  if (rc != MPI_SUCCESS)
    return lutra_error(LUTRA_EBACKEND, fn, "broadcasting the NCCL unique id failed (MPI %d)", rc);
  lutra_nccl *n = calloc(1, sizeof *n);
  if (!n) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a communicator");
  n->timeout_s = b->timeout_s;
  n->size = b->size;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&n->comm, b->size, id, b->rank, &config);
  int st = r == ncclSuccess || r == ncclInProgress
               ? settle(n, r, fn, "ncclCommInitRankConfig")
               : nccl_fail(r, NULL, fn, "ncclCommInitRankConfig");
  if (st != LUTRA_OK) {
    if (n->comm && !n->aborted) ncclCommAbort(n->comm);
    free(n);
    return st;
  }
  *slot = n;
  return LUTRA_OK;
}

void lutra_nccl_destroy(lutra_nccl *n) {
  if (!n) return;
  if (!n->aborted) {
    /* finalize is non-blocking too: bounded by the timeout, then aborted */
    ncclResult_t r = ncclCommFinalize(n->comm);
    if (settle(n, r, "lutra_group_unref", "ncclCommFinalize") == LUTRA_OK)
      ncclCommDestroy(n->comm);
    else
      abort_comm(n);
  }
  if (n->amax) cudaFree(n->amax);
  if (n->comm_stream) cudaStreamDestroy(n->comm_stream);
  free(n);
}

static int nccl_type(int dtype, ncclDataType_t *t, const char *fn) {
  if (dtype == LUTRA_F32)
    *t = ncclFloat32;
  else if (dtype == LUTRA_BF16)
    *t = ncclBfloat16;
  else
    return lutra_error(LUTRA_EINVAL, fn, "reductions take f32 or bf16 (got %s)",
                       lutra_dtype_name(dtype));
  return LUTRA_OK;
}

static ncclRedOp_t nccl_op(int op) {
  return op == LUTRA_REDUCE_MAX ? ncclMax : op == LUTRA_REDUCE_AVG ? ncclAvg : ncclSum;
}

int lutra_nccl_all_reduce(lutra_nccl *n, void *buf, int64_t count, int dtype, int op,
                          const char *fn) {
  ncclDataType_t t = ncclFloat32;
  TRY(nccl_type(dtype, &t, fn));
  ncclResult_t r =
      ncclAllReduce(buf, buf, (size_t)count, t, nccl_op(op), n->comm, lutra_cuda_stream());
  return settle(n, r, fn, "ncclAllReduce");
}

int lutra_nccl_all_gather(lutra_nccl *n, const void *send, void *recv, size_t bytes,
                          const char *fn) {
  ncclResult_t r = ncclAllGather(send, recv, bytes, ncclUint8, n->comm, lutra_cuda_stream());
  return settle(n, r, fn, "ncclAllGather");
}

int lutra_nccl_reduce_scatter(lutra_nccl *n, const void *send, void *recv, int64_t count, int dtype,
                              const char *fn) {
  ncclDataType_t t = ncclFloat32;
  TRY(nccl_type(dtype, &t, fn));
  ncclResult_t r =
      ncclReduceScatter(send, recv, (size_t)count, t, ncclSum, n->comm, lutra_cuda_stream());
  return settle(n, r, fn, "ncclReduceScatter");
}

int lutra_nccl_reduce_amax(lutra_nccl *n, lutra_scale_meta *const *metas, int count,
                           const char *fn) {
  if (count > n->amax_cap) {
    CHECK_STATE(!lutra_graph_capturing(),
                "the amax buffer must grow (more delayed-scaling quantizers than in the steps "
                "before): run the step once before capturing it");
    float *grown;
    TRY(lutra_cuda_status(cudaMalloc((void **)&grown, (size_t)count * sizeof(float)), fn,
                          "cudaMalloc of the amax buffer"));
    if (n->amax) cudaFree(n->amax);
    n->amax = grown;
    n->amax_cap = count;
  }
  cudaStream_t s = lutra_cuda_stream();
  TRY(lutra_cuda_status(lk_amax_gather(metas, count, n->amax, s), fn, "kernel amax_gather"));
  ncclResult_t r = ncclAllReduce(n->amax, n->amax, (size_t)count, ncclFloat32, ncclMax, n->comm, s);
  TRY(settle(n, r, fn, "ncclAllReduce of the amaxes"));
  return lutra_cuda_status(lk_amax_scatter(metas, count, n->amax, s), fn, "kernel amax_scatter");
}

/* Forks the comm stream off lutra's stream at this point, packs the pieces, all-reduces (AVG)
 * and unpacks there, and records *done for the join. */
int lutra_nccl_bucket_start(lutra_nccl *n, const lutra_dist_piece *pieces, int count, void *buf,
                            int64_t elems, int dtype, void **done, const char *fn) {
  ncclDataType_t t = ncclFloat32;
  TRY(nccl_type(dtype, &t, fn));
  if (!n->comm_stream) {
    CHECK_STATE(!lutra_graph_capturing(), "the first overlapped gradient all-reduce cannot be "
                                          "captured: run a step before capturing");
    TRY(lutra_cuda_status(cudaStreamCreateWithFlags(&n->comm_stream, cudaStreamNonBlocking), fn,
                          "cudaStreamCreateWithFlags"));
  }
  if (!*done) {
    CHECK_STATE(!lutra_graph_capturing(), "a gradient bucket's first all-reduce cannot be "
                                          "captured: run a step before capturing");
    TRY(lutra_cuda_status(cudaEventCreateWithFlags((cudaEvent_t *)done, cudaEventDisableTiming), fn,
                          "cudaEventCreateWithFlags"));
  }
  cudaEvent_t ev = *done;
  cudaStream_t s = lutra_cuda_stream(), c = n->comm_stream;
  TRY(lutra_cuda_status(cudaEventRecord(ev, s), fn, "cudaEventRecord"));
  TRY(lutra_cuda_status(cudaStreamWaitEvent(c, ev, 0), fn, "cudaStreamWaitEvent"));
  size_t es = dtype == LUTRA_F32 ? 4 : 2, off = 0;
  for (int i = 0; count > 1 && i < count; i++) {
    TRY(lutra_cuda_status(cudaMemcpyAsync((char *)buf + off, pieces[i].data,
                                          (size_t)pieces[i].n * es, cudaMemcpyDeviceToDevice, c),
                          fn, "cudaMemcpyAsync"));
    off += (size_t)pieces[i].n * es;
  }
  ncclResult_t r = ncclAllReduce(buf, buf, (size_t)elems, t, ncclAvg, n->comm, c);
  TRY(settle(n, r, fn, "ncclAllReduce of a gradient bucket"));
  off = 0;
  for (int i = 0; count > 1 && i < count; i++) {
    TRY(lutra_cuda_status(cudaMemcpyAsync(pieces[i].data, (char *)buf + off,
                                          (size_t)pieces[i].n * es, cudaMemcpyDeviceToDevice, c),
                          fn, "cudaMemcpyAsync"));
    off += (size_t)pieces[i].n * es;
  }
  return lutra_cuda_status(cudaEventRecord(ev, c), fn, "cudaEventRecord");
}

int lutra_nccl_bucket_finish(lutra_nccl *n, void *done, const char *fn) {
  (void)n;
  return lutra_cuda_status(cudaStreamWaitEvent(lutra_cuda_stream(), (cudaEvent_t)done, 0), fn,
                           "cudaStreamWaitEvent");
}

void lutra_nccl_event_destroy(void *event) {
  if (event) cudaEventDestroy((cudaEvent_t)event);
}

int lutra_nccl_wait(lutra_nccl *n, const char *fn) {
  cudaStream_t s = lutra_cuda_stream();
  double t0 = now_s();
  for (;;) {
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return LUTRA_OK;
    if (e != cudaErrorNotReady) return lutra_cuda_status(e, fn, "cudaStreamQuery");
    ncclResult_t async;
    ncclResult_t r = ncclCommGetAsyncError(n->comm, &async);
    if (r == ncclSuccess && async != ncclSuccess && async != ncclInProgress) r = async;
    if (r != ncclSuccess) {
      int st = nccl_fail(r, n->comm, fn, "the group's NCCL work");
      abort_comm(n);
      return st;
    }
    if (now_s() - t0 > n->timeout_s) {
      abort_comm(n);
      return lutra_error(LUTRA_EBACKEND, fn,
                         "the group's NCCL work did not complete within %g s; the communicator "
                         "was aborted",
                         n->timeout_s);
    }
    sched_yield();
  }
}

#else /* no NCCL in this build */

static int no_nccl(const char *fn) {
#ifdef LUTRA_WITH_MPI
  return lutra_error(LUTRA_EUNSUPPORTED, fn, "CUDA collectives need the CUDA build (with NCCL)");
#else
  return lutra_error(LUTRA_EUNSUPPORTED, fn, "built without MPI");
#endif
}

int lutra_nccl_get(lutra_nccl **slot, const lutra_nccl_boot *b, const char *fn) {
  (void)slot, (void)b;
  return no_nccl(fn);
}
void lutra_nccl_destroy(lutra_nccl *n) {
  (void)n;
}
int lutra_nccl_all_reduce(lutra_nccl *n, void *buf, int64_t count, int dtype, int op,
                          const char *fn) {
  (void)n, (void)buf, (void)count, (void)dtype, (void)op;
  return no_nccl(fn);
}
int lutra_nccl_all_gather(lutra_nccl *n, const void *send, void *recv, size_t bytes,
                          const char *fn) {
  (void)n, (void)send, (void)recv, (void)bytes;
  return no_nccl(fn);
}
int lutra_nccl_reduce_scatter(lutra_nccl *n, const void *send, void *recv, int64_t count, int dtype,
                              const char *fn) {
  (void)n, (void)send, (void)recv, (void)count, (void)dtype;
  return no_nccl(fn);
}
int lutra_nccl_reduce_amax(lutra_nccl *n, lutra_scale_meta *const *metas, int count,
                           const char *fn) {
  (void)n, (void)metas, (void)count;
  return no_nccl(fn);
}
int lutra_nccl_wait(lutra_nccl *n, const char *fn) {
  (void)n;
  return no_nccl(fn);
}
int lutra_nccl_bucket_start(lutra_nccl *n, const lutra_dist_piece *pieces, int count, void *buf,
                            int64_t elems, int dtype, void **done, const char *fn) {
  (void)n, (void)pieces, (void)count, (void)buf, (void)elems, (void)dtype, (void)done;
  return no_nccl(fn);
}
int lutra_nccl_bucket_finish(lutra_nccl *n, void *done, const char *fn) {
  (void)n, (void)done;
  return no_nccl(fn);
}
void lutra_nccl_event_destroy(void *event) {
  (void)event;
}
#endif
