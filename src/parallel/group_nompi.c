/* The dist API of a build without MPI (MPI=0, or no mpicc at build time): every call says so.
 * parallel/group.c holds the MPI build's. */
#include "core/error.h"
#include "parallel/group.h"

#ifndef LUTRA_WITH_MPI

#define NO_MPI(fn_) lutra_error(LUTRA_EUNSUPPORTED, fn_, "built without MPI")

int lutra_group_check(const lutra_group *g, const char *fn) {
  (void)g;
  return NO_MPI(fn);
}
void lutra_group_retain(lutra_group *g) {
  (void)g;
}
int lutra_group_rank_of(const lutra_group *g) {
  (void)g;
  return 0;
}
int lutra_group_size_of(const lutra_group *g) {
  (void)g;
  return 1;
}
int lutra_dist_all_reduce(lutra_group *g, void *buf, int64_t n, int dtype, int op, int device,
                          const char *fn) {
  (void)g, (void)buf, (void)n, (void)dtype, (void)op, (void)device;
  return NO_MPI(fn);
}
int lutra_dist_all_gather(lutra_group *g, const void *send, void *recv, size_t bytes, int device,
                          const char *fn) {
  (void)g, (void)send, (void)recv, (void)bytes, (void)device;
  return NO_MPI(fn);
}
int lutra_dist_reduce_scatter(lutra_group *g, const void *send, void *recv, int64_t n, int dtype,
                              int device, const char *fn) {
  (void)g, (void)send, (void)recv, (void)n, (void)dtype, (void)device;
  return NO_MPI(fn);
}
int lutra_dist_agree(lutra_group *g, const int64_t *v, int n, const char *what, const char *fn) {
  (void)g, (void)v, (void)n, (void)what;
  return NO_MPI(fn);
}
int lutra_dist_agree_once(lutra_group *g, int slot, const int64_t *v, int n, const char *what,
                          const char *fn) {
  (void)g, (void)slot, (void)v, (void)n, (void)what;
  return NO_MPI(fn);
}
int lutra_dist_reduce_amax(lutra_group *g, lutra_scale_meta *const *metas, int n, int device,
                           bool backward, uint64_t recipe_key, const char *fn) {
  (void)g, (void)metas, (void)n, (void)device, (void)backward, (void)recipe_key;
  return NO_MPI(fn);
}
int lutra_dist_bucket_start(lutra_group *g, const lutra_dist_piece *pieces, int count, void *buf,
                            int64_t n, int dtype, int device, lutra_dist_pending *p,
                            const char *fn) {
  (void)g, (void)pieces, (void)count, (void)buf, (void)n, (void)dtype, (void)device, (void)p;
  return NO_MPI(fn);
}
int lutra_dist_bucket_finish(lutra_group *g, const lutra_dist_piece *pieces, int count, void *buf,
                             int64_t n, int dtype, int device, lutra_dist_pending *p,
                             const char *fn) {
  (void)g, (void)pieces, (void)count, (void)buf, (void)n, (void)dtype, (void)device, (void)p;
  return NO_MPI(fn);
}
void lutra_dist_pending_release(lutra_dist_pending *p) {
  (void)p;
}
int lutra_dist_available(void) {
  return 0;
}
int lutra_dist_init(const void *comm, double timeout_s) {
  (void)comm, (void)timeout_s;
  return NO_MPI("lutra_dist_init");
}
int lutra_dist_finalize(void) {
  return LUTRA_OK;
}
int lutra_dist_abort(int code) {
  (void)code;
  return NO_MPI("lutra_dist_abort");
}
int lutra_dist_world(lutra_group **out) {
  (void)out;
  return NO_MPI("lutra_dist_world");
}
int lutra_group_split(lutra_group *g, int color, int key, lutra_group **out) {
  (void)g, (void)color, (void)key, (void)out;
  return NO_MPI("lutra_group_split");
}
int lutra_group_rank(const lutra_group *g, int *rank) {
  (void)g, (void)rank;
  return NO_MPI("lutra_group_rank");
}
int lutra_group_size(const lutra_group *g, int *size) {
  (void)g, (void)size;
  return NO_MPI("lutra_group_size");
}
int lutra_group_unref(lutra_group *g) {
  (void)g;
  return LUTRA_OK;
}
int lutra_group_stats_get(const lutra_group *g, lutra_group_stats *out) {
  (void)g, (void)out;
  return NO_MPI("lutra_group_stats_get");
}
int lutra_group_barrier(lutra_group *g) {
  (void)g;
  return NO_MPI("lutra_group_barrier");
}
#endif
