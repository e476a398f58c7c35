/* Process groups: MPI communicators (bootstrap, CPU collectives) and, on CUDA, the group's NCCL
 * communicator (parallel/nccl.c). Every MPI collective is issued non-blocking and polled against
 * the group's timeout, so a peer that died or called something else gives an error, not a hang.
 * A group that timed out is broken (its request cannot be cancelled): later calls refuse it. */
#include "parallel/group.h"
#include "core/error.h"
#include "core/object.h"
#include "parallel/nccl.h"

#include <stdlib.h>

#ifdef LUTRA_WITH_MPI
#include "core/codec.h"

#include <math.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

struct lutra_group {
  lutra_object obj;
  int rank, size;
  bool broken;
  double timeout_s;
  lutra_group_stats stats;
  MPI_Comm comm;
  lutra_nccl *nccl;
  float *amax; /* the contiguous amax buffer of lutra_dist_reduce_amax (host side) */
  int amax_cap;
  int64_t agreed[LUTRA_AGREE_SLOTS][LUTRA_AGREE_MAX]; /* lutra_dist_agree_once's last keys */
  bool agreed_set[LUTRA_AGREE_SLOTS];
};

static struct {
  bool inited, we_initialized, finalized, exit_registered;
  bool any_broken; /* a collective failed: MPI_Finalize's fence could wait for dead peers */
  double timeout_s;
  const void *host_comm;
  lutra_group *world;
  MPI_Op bf16_sum, bf16_max, f32_amax;
} dist;

static int mpi_fail(int rc, const char *fn, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", rc);
  return lutra_error(LUTRA_EBACKEND, fn, "%s failed: %s", what, msg);
}

#define MPI_TRY(call, what)                                                                        \
  do {                                                                                             \
    int rc_ = (call);                                                                              \
    if (rc_ != MPI_SUCCESS) return mpi_fail(rc_, fn, what);                                        \
  } while (0)

/* ---- reductions MPI lacks: bf16 (summed in f32, rounded once per pair) and a NaN-keeping max */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *t) {
  (void)t;
  const uint16_t *a = in;
  uint16_t *b = inout;
  for (int i = 0; i < *len; i++)
    b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}
static void bf16_max(void *in, void *inout, int *len, MPI_Datatype *t) {
  (void)t;
  const uint16_t *a = in;
  uint16_t *b = inout;
  for (int i = 0; i < *len; i++) {
    float x = bf16_to_f32(a[i]), y = bf16_to_f32(b[i]);
    if (isnan(x) || x > y) b[i] = a[i];
  }
}
/* amaxes: a NaN on any rank stays NaN (the scale update then keeps the old scale everywhere) */
static void f32_amax(void *in, void *inout, int *len, MPI_Datatype *t) {
  (void)t;
  const float *a = in;
  float *b = inout;
  for (int i = 0; i < *len; i++)
    if (isnan(a[i]) || a[i] > b[i]) b[i] = a[i];
}

static int mpi_type(int dtype, MPI_Datatype *t, const char *fn) {
  if (dtype == LUTRA_F32)
    *t = MPI_FLOAT;
  else if (dtype == LUTRA_BF16)
    *t = MPI_UINT16_T;
  else
    return lutra_error(LUTRA_EINVAL, fn, "reductions take f32 or bf16 (got %s)",
                       lutra_dtype_name(dtype));
  return LUTRA_OK;
}

static MPI_Op mpi_op(int dtype, int op) {
  if (dtype == LUTRA_BF16) return op == LUTRA_REDUCE_MAX ? dist.bf16_max : dist.bf16_sum;
  return op == LUTRA_REDUCE_MAX ? MPI_MAX : MPI_SUM;
}

/* Polls a request until it completes or the group's timeout passes. */
static int wait_request(lutra_group *g, MPI_Request *req, const char *what, const char *fn) {
  double t0 = MPI_Wtime();
  for (;;) {
    int done = 0;
    int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      g->broken = dist.any_broken = true;
      return mpi_fail(rc, fn, what);
    }
    if (done) return LUTRA_OK;
    if (MPI_Wtime() - t0 > g->timeout_s) {
      g->broken = dist.any_broken = true;
      return lutra_error(LUTRA_EBACKEND, fn,
                         "%s on rank %d of a group of %d did not complete within %g s (a peer "
                         "died, hangs or called another collective); the group is broken",
                         what, g->rank, g->size, g->timeout_s);
    }
    sched_yield(); /* ranks may share cores: let the peer run */
  }
}

int lutra_group_check(const lutra_group *g, const char *fn) {
  TRY(lutra_check_object(g, LUTRA_MAGIC_GROUP, fn, "group"));
  CHECK_STATE(!dist.finalized, "lutra_dist_finalize was called");
  CHECK_STATE(!g->broken, "the group is broken: an earlier collective on it failed or timed out");
  return LUTRA_OK;
}

void lutra_group_retain(lutra_group *g) {
  if (g) g->obj.refs++;
}
int lutra_group_rank_of(const lutra_group *g) {
  return g->rank;
}
int lutra_group_size_of(const lutra_group *g) {
  return g->size;
}

static lutra_nccl_boot nccl_boot(lutra_group *g) {
  return (lutra_nccl_boot){
      .mpi_comm = &g->comm, .rank = g->rank, .size = g->size, .timeout_s = g->timeout_s};
}

static int nccl_of(lutra_group *g, const char *fn) {
  lutra_nccl_boot b = nccl_boot(g);
  int st = lutra_nccl_get(&g->nccl, &b, fn);
  if (st == LUTRA_EBACKEND) g->broken = dist.any_broken = true;
  return st;
}

static int nccl_status(lutra_group *g, int st) {
  if (st == LUTRA_EBACKEND) g->broken = dist.any_broken = true;
  return st;
}

int lutra_dist_all_reduce(lutra_group *g, void *buf, int64_t n, int dtype, int op, int device,
                          const char *fn) {
  CHECK_ARG(n >= 0 && n <= INT32_MAX, "element count %lld out of range", (long long)n);
  g->stats.all_reduce++;
  g->stats.bytes += (uint64_t)n * lutra_dtype_size(dtype);
  /* on CUDA even a group of one runs NCCL: the same launches (and graph nodes) at every size */
  if (device == LUTRA_CUDA) {
    TRY(nccl_of(g, fn));
    return nccl_status(g, lutra_nccl_all_reduce(g->nccl, buf, n, dtype, op, fn));
  }
  if (g->size == 1 || n == 0) return LUTRA_OK;
  MPI_Datatype t = MPI_DATATYPE_NULL;
  TRY(mpi_type(dtype, &t, fn));
  MPI_Request req;
  MPI_TRY(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, t, mpi_op(dtype, op), g->comm, &req),
          "MPI_Iallreduce");
  TRY(wait_request(g, &req, "MPI_Iallreduce", fn));
  if (op == LUTRA_REDUCE_AVG) {
    float inv = 1.0f / (float)g->size;
    for (int64_t i = 0; i < n; i++)
      lutra_elem_store(buf, dtype, i, lutra_elem_load(buf, dtype, i) * inv);
  }
  return LUTRA_OK;
}

int lutra_dist_all_gather(lutra_group *g, const void *send, void *recv, size_t bytes, int device,
                          const char *fn) {
  CHECK_ARG(bytes <= INT32_MAX, "%zu bytes per rank is more than one MPI call moves", bytes);
  g->stats.all_gather++;
  g->stats.bytes += bytes;
  if (device == LUTRA_CUDA) {
    TRY(nccl_of(g, fn));
    return nccl_status(g, lutra_nccl_all_gather(g->nccl, send, recv, bytes, fn));
  }
  char *mine = (char *)recv + (size_t)g->rank * bytes;
  if (g->size == 1) {
    if (send != mine) memcpy(mine, send, bytes);
    return LUTRA_OK;
  }
  const void *s = send == mine ? MPI_IN_PLACE : send;
  MPI_Request req;
  MPI_TRY(MPI_Iallgather(s, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, g->comm, &req),
          "MPI_Iallgather");
  return wait_request(g, &req, "MPI_Iallgather", fn);
}

int lutra_dist_reduce_scatter(lutra_group *g, const void *send, void *recv, int64_t n, int dtype,
                              int device, const char *fn) {
  CHECK_ARG(n >= 0 && n <= INT32_MAX, "element count %lld out of range", (long long)n);
  g->stats.reduce_scatter++;
  g->stats.bytes += (uint64_t)n * (uint64_t)g->size * lutra_dtype_size(dtype);
  if (device == LUTRA_CUDA) {
    TRY(nccl_of(g, fn));
    return nccl_status(g, lutra_nccl_reduce_scatter(g->nccl, send, recv, n, dtype, fn));
  }
  MPI_Datatype t = MPI_DATATYPE_NULL;
  TRY(mpi_type(dtype, &t, fn));
  if (g->size == 1) {
    if (send != recv) memcpy(recv, send, (size_t)n * lutra_dtype_size(dtype));
    return LUTRA_OK;
  }
  MPI_Request req;
  MPI_TRY(MPI_Ireduce_scatter_block(send, recv, (int)n, t, mpi_op(dtype, LUTRA_REDUCE_SUM), g->comm,
                                    &req),
          "MPI_Ireduce_scatter_block");
  return wait_request(g, &req, "MPI_Ireduce_scatter_block", fn);
}

int lutra_dist_bucket_start(lutra_group *g, const lutra_dist_piece *pieces, int count, void *buf,
                            int64_t n, int dtype, int device, lutra_dist_pending *p,
                            const char *fn) {
  CHECK_ARG(n >= 0 && n <= INT32_MAX, "element count %lld out of range", (long long)n);
  CHECK_STATE(!p->active, "the bucket's all-reduce is already running");
  g->stats.all_reduce++;
  g->stats.bytes += (uint64_t)n * lutra_dtype_size(dtype);
  if (device == LUTRA_CUDA) {
    TRY(nccl_of(g, fn));
    TRY(nccl_status(g,
                    lutra_nccl_bucket_start(g->nccl, pieces, count, buf, n, dtype, &p->done, fn)));
    p->active = true;
    return LUTRA_OK;
  }
  size_t es = lutra_dtype_size(dtype), off = 0;
  if (count > 1)
    for (int i = 0; i < count; i++) {
      memcpy((char *)buf + off, pieces[i].data, (size_t)pieces[i].n * es);
      off += (size_t)pieces[i].n * es;
    }
  MPI_Request req = MPI_REQUEST_NULL;
  if (g->size > 1) {
    MPI_Datatype t = MPI_DATATYPE_NULL;
    TRY(mpi_type(dtype, &t, fn));
    MPI_TRY(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, t, mpi_op(dtype, LUTRA_REDUCE_SUM), g->comm,
                           &req),
            "MPI_Iallreduce");
  }
  _Static_assert(sizeof(MPI_Request) <= sizeof p->request, "MPI_Request does not fit");
  memcpy(&p->request, &req, sizeof req);
  p->active = true;
  return LUTRA_OK;
}

int lutra_dist_bucket_finish(lutra_group *g, const lutra_dist_piece *pieces, int count, void *buf,
                             int64_t n, int dtype, int device, lutra_dist_pending *p,
                             const char *fn) {
  if (!p->active) return LUTRA_OK;
  p->active = false;
  if (device == LUTRA_CUDA) return nccl_status(g, lutra_nccl_bucket_finish(g->nccl, p->done, fn));
  MPI_Request req;
  memcpy(&req, &p->request, sizeof req);
  if (req != MPI_REQUEST_NULL) TRY(wait_request(g, &req, "the gradient bucket's all-reduce", fn));
  float inv = 1.0f / (float)g->size;
  for (int64_t i = 0; i < n && g->size > 1; i++)
    lutra_elem_store(buf, dtype, i, lutra_elem_load(buf, dtype, i) * inv);
  size_t es = lutra_dtype_size(dtype), off = 0;
  if (count > 1)
    for (int i = 0; i < count; i++) {
      memcpy(pieces[i].data, (char *)buf + off, (size_t)pieces[i].n * es);
      off += (size_t)pieces[i].n * es;
    }
  return LUTRA_OK;
}

void lutra_dist_pending_release(lutra_dist_pending *p) {
  lutra_nccl_event_destroy(p->done);
  p->done = NULL;
}

enum { AGREE_MAX = LUTRA_AGREE_MAX };

static void format_values(char *buf, size_t cap, const int64_t *v, int n) {
  size_t used = 0;
  for (int i = 0; i < n && used < cap; i++)
    used += (size_t)snprintf(buf + used, cap - used, "%s%lld", i ? ", " : "", (long long)v[i]);
}

int lutra_dist_agree(lutra_group *g, const int64_t *v, int n, const char *what, const char *fn) {
  CHECK_ARG(n > 0 && n <= AGREE_MAX, "agreement over %d values (1..%d)", n, AGREE_MAX);
  if (g->size == 1) return LUTRA_OK;
  int64_t both[2 * AGREE_MAX];
  for (int i = 0; i < n; i++) {
    both[i] = v[i];
    both[n + i] = -v[i];
  }
  MPI_Request req;
  MPI_TRY(MPI_Iallreduce(MPI_IN_PLACE, both, 2 * n, MPI_INT64_T, MPI_MAX, g->comm, &req),
          "MPI_Iallreduce");
  TRY(wait_request(g, &req, "the agreement check", fn));
  bool same = true;
  for (int i = 0; i < n; i++)
    same = same && both[i] == -both[n + i];
  if (same) return LUTRA_OK;
  int64_t *all = malloc((size_t)g->size * (size_t)n * sizeof *all);
  if (!all) return lutra_error(LUTRA_ENOMEM, fn, "ranks disagree on %s", what);
  MPI_Request req2;
  int rc = MPI_Iallgather(v, n, MPI_INT64_T, all, n, MPI_INT64_T, g->comm, &req2);
  int st = rc == MPI_SUCCESS ? wait_request(g, &req2, "the agreement check", fn)
                             : mpi_fail(rc, fn, "MPI_Iallgather");
  if (st == LUTRA_OK) {
    int other = 1;
    while (other < g->size && !memcmp(all, all + (size_t)other * n, (size_t)n * sizeof *all))
      other++;
    char a[160] = "", b[160] = "";
    format_values(a, sizeof a, all, n);
    format_values(b, sizeof b, all + (size_t)other * n, n);
    st = lutra_error(LUTRA_EINVAL, fn, "ranks disagree on %s: rank 0 has (%s), rank %d has (%s)",
                     what, a, other, b);
  }
  free(all);
  return st;
}

int lutra_dist_agree_once(lutra_group *g, int slot, const int64_t *v, int n, const char *what,
                          const char *fn) {
  CHECK_ARG(slot >= 0 && slot < LUTRA_AGREE_SLOTS && n > 0 && n <= AGREE_MAX,
            "agreement slot %d of %d values", slot, n);
  if (g->agreed_set[slot] && !memcmp(g->agreed[slot], v, (size_t)n * sizeof *v)) return LUTRA_OK;
  TRY(lutra_dist_agree(g, v, n, what, fn));
  memcpy(g->agreed[slot], v, (size_t)n * sizeof *v);
  g->agreed_set[slot] = true;
  return LUTRA_OK;
}

int lutra_dist_reduce_amax(lutra_group *g, lutra_scale_meta *const *metas, int n, int device,
                           bool backward, uint64_t recipe_key, const char *fn) {
  if (n <= 0) return LUTRA_OK;
  int64_t v[3] = {n, device, (int64_t)(recipe_key >> 1)};
  TRY(lutra_dist_agree_once(g, backward ? 4 : 3, v, 3,
                            backward
                                ? "the backward amax reduction's (quantizers, device, recipe key)"
                                : "the forward amax reduction's (quantizers, device, recipe key)",
                            fn));
  if (device == LUTRA_CUDA) {
    g->stats.all_reduce++;
    g->stats.amax_reduce++;
    g->stats.bytes += (uint64_t)n * sizeof(float);
    TRY(nccl_of(g, fn));
    return nccl_status(g, lutra_nccl_reduce_amax(g->nccl, metas, n, fn));
  }
  if (n > g->amax_cap) {
    float *grown = realloc(g->amax, (size_t)n * sizeof *grown);
    if (!grown) return lutra_error(LUTRA_ENOMEM, fn, "cannot grow the amax buffer");
    g->amax = grown;
    g->amax_cap = n;
  }
  for (int i = 0; i < n; i++)
    g->amax[i] = metas[i]->amax_history[0];
  g->stats.all_reduce++;
  g->stats.amax_reduce++;
  g->stats.bytes += (uint64_t)n * sizeof(float);
  if (g->size > 1) {
    MPI_Request req;
    MPI_TRY(MPI_Iallreduce(MPI_IN_PLACE, g->amax, n, MPI_FLOAT, dist.f32_amax, g->comm, &req),
            "MPI_Iallreduce");
    TRY(wait_request(g, &req, "the amax all-reduce", fn));
  }
  for (int i = 0; i < n; i++)
    metas[i]->amax_history[0] = g->amax[i];
  return LUTRA_OK;
}

/* ---- groups ------------------------------------------------------------------------------- */
static int group_make(MPI_Comm comm, lutra_group **out, const char *fn) {
  lutra_group *g = calloc(1, sizeof *g);
  if (!g) {
    MPI_Comm_free(&comm);
    return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a group");
  }
  g->obj.magic = LUTRA_MAGIC_GROUP;
  g->obj.refs = 1;
  g->comm = comm;
  g->timeout_s = dist.timeout_s;
  int rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(comm, &g->rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(comm, &g->size);
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&g->comm);
    free(g);
    return mpi_fail(rc, fn, "setting up the communicator");
  }
  *out = g;
  return LUTRA_OK;
}

int lutra_group_unref(lutra_group *g) {
  if (!g) return LUTRA_OK;
  TRY(lutra_check_object(g, LUTRA_MAGIC_GROUP, "lutra_group_unref", "group"));
  if (--g->obj.refs > 0) return LUTRA_OK;
  lutra_nccl_destroy(g->nccl);
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&g->comm);
  free(g->amax);
  g->obj.magic = 0;
  free(g);
  return LUTRA_OK;
}

static void finalize_at_exit(void) {
  /* a rank whose collective failed would wait in MPI_Finalize's fence for peers that are gone */
  if (!dist.finalized && dist.we_initialized && !dist.any_broken) lutra_dist_finalize();
}

int lutra_dist_available(void) {
  return 1;
}

int lutra_dist_init(const void *comm, double timeout_s) {
  static const char fn[] = "lutra_dist_init";
  CHECK_ARG(timeout_s == timeout_s, "timeout_s is NaN");
  if (timeout_s <= 0) {
    const char *env = getenv("LUTRA_DIST_TIMEOUT");
    timeout_s = env && atof(env) > 0 ? atof(env) : 300.0;
  }
  if (dist.inited) {
    CHECK_STATE(!dist.finalized, "lutra_dist_finalize was called: MPI cannot be initialized again");
    CHECK_STATE(comm == dist.host_comm && timeout_s == dist.timeout_s,
                "already initialized with another communicator or timeout");
    return LUTRA_OK;
  }
  int up = 0, down = 0;
  MPI_TRY(MPI_Initialized(&up), "MPI_Initialized");
  MPI_TRY(MPI_Finalized(&down), "MPI_Finalized");
  CHECK_STATE(!down, "MPI was finalized by the host");
  if (!up) {
    int provided;
    MPI_TRY(MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    dist.we_initialized = true;
  }
  MPI_Comm base = comm ? *(const MPI_Comm *)comm : MPI_COMM_WORLD, dup;
  MPI_TRY(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  MPI_TRY(MPI_Comm_dup(base, &dup), "MPI_Comm_dup");
  if (!dist.bf16_sum) {
    MPI_TRY(MPI_Op_create(bf16_sum, 1, &dist.bf16_sum), "MPI_Op_create");
    MPI_TRY(MPI_Op_create(bf16_max, 1, &dist.bf16_max), "MPI_Op_create");
    MPI_TRY(MPI_Op_create(f32_amax, 1, &dist.f32_amax), "MPI_Op_create");
  }
  dist.timeout_s = timeout_s;
  TRY(group_make(dup, &dist.world, fn));
  dist.host_comm = comm;
  dist.inited = true;
  if (dist.we_initialized && !dist.exit_registered) {
    atexit(finalize_at_exit);
    dist.exit_registered = true;
  }
  return LUTRA_OK;
}

int lutra_dist_finalize(void) {
  static const char fn[] = "lutra_dist_finalize";
  if (!dist.inited || dist.finalized) return LUTRA_OK;
  lutra_group *w = dist.world;
  dist.world = NULL;
  lutra_group_unref(w);
  dist.finalized = true;
  if (dist.we_initialized) MPI_TRY(MPI_Finalize(), "MPI_Finalize");
  return LUTRA_OK;
}

int lutra_dist_abort(int code) {
  static const char fn[] = "lutra_dist_abort";
  int up = 0;
  MPI_Initialized(&up);
  CHECK_STATE(up, "MPI is not initialized");
  fflush(NULL);
  MPI_TRY(MPI_Abort(MPI_COMM_WORLD, code), "MPI_Abort");
  return LUTRA_OK;
}

int lutra_dist_world(lutra_group **out) {
  static const char fn[] = "lutra_dist_world";
  CHECK_ARG(out, "out is NULL");
  CHECK_STATE(dist.inited && dist.world, "call lutra_dist_init first");
  lutra_group_retain(dist.world);
  *out = dist.world;
  return LUTRA_OK;
}

int lutra_group_split(lutra_group *g, int color, int key, lutra_group **out) {
  static const char fn[] = "lutra_group_split";
  TRY(lutra_group_check(g, fn));
  CHECK_ARG(out, "out is NULL");
  MPI_Comm c;
  MPI_TRY(MPI_Comm_split(g->comm, color < 0 ? MPI_UNDEFINED : color, key, &c), "MPI_Comm_split");
  if (c == MPI_COMM_NULL) {
    *out = NULL;
    return LUTRA_OK;
  }
  return group_make(c, out, fn);
}

int lutra_group_rank(const lutra_group *g, int *rank) {
  static const char fn[] = "lutra_group_rank";
  TRY(lutra_check_object(g, LUTRA_MAGIC_GROUP, fn, "group"));
  CHECK_ARG(rank, "rank is NULL");
  *rank = g->rank;
  return LUTRA_OK;
}

int lutra_group_size(const lutra_group *g, int *size) {
  static const char fn[] = "lutra_group_size";
  TRY(lutra_check_object(g, LUTRA_MAGIC_GROUP, fn, "group"));
  CHECK_ARG(size, "size is NULL");
  *size = g->size;
  return LUTRA_OK;
}

int lutra_group_stats_get(const lutra_group *g, lutra_group_stats *out) {
  static const char fn[] = "lutra_group_stats_get";
  TRY(lutra_check_object(g, LUTRA_MAGIC_GROUP, fn, "group"));
  CHECK_ARG(out, "out is NULL");
  *out = g->stats;
  return LUTRA_OK;
}

int lutra_group_barrier(lutra_group *g) {
  static const char fn[] = "lutra_group_barrier";
  TRY(lutra_group_check(g, fn));
  if (g->nccl) TRY(nccl_status(g, lutra_nccl_wait(g->nccl, fn)));
  MPI_Request req;
  MPI_TRY(MPI_Ibarrier(g->comm, &req), "MPI_Ibarrier");
  return wait_request(g, &req, "MPI_Ibarrier", fn);
}

#endif
