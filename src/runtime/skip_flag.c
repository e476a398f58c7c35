/* State that CUDA graph replays read on the device instead of taking from the host: the
 * "skip weight update" flag of each device (TransformerEngine's skip_fp8_weight_update).
 *
 * The flag is one int32 in backend memory, zero (do not skip) when allocated at first use. A
 * Linear forward with first_microbatch LUTRA_FIRST_MICROBATCH_DEVICE quantizes its weight with
 * the flag as the quantization's skip flag (lutra_quant_args.skip), so a graph that captured that
 * forward re-quantizes the weight on replays after lutra_set_skip_weight_update(device, 0) and
 * reuses the FP8 weight of the last quantization after lutra_set_skip_weight_update(device, 1)
 * (the gradient-accumulation micro-batches after the first). */
#include "runtime/skip_flag.h"
#include "backend/backend.h"
#include "backend/device.h"
#include "core/capture.h"
#include "core/error.h"

#include <pthread.h>

enum { NUM_DEVICES = 2 }; /* LUTRA_CPU, LUTRA_CUDA */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  int32_t *flag;   /* backend memory of the device, never freed */
  bool host_value; /* the last value set from the host */
} state[NUM_DEVICES];

/* Allocates the device's flag (zero) at first use; with the lock held. */
static int ensure_flag(const lutra_backend *be, const char *fn) {
  if (state[be->device].flag) return LUTRA_OK;
  CHECK_STATE(!lutra_capturing(),
              "the skip-weight-update flag of device '%s' does not exist yet and cannot be "
              "allocated while a CUDA graph is being captured: call "
              "lutra_set_skip_weight_update (or run the forward once) before the capture",
              be->name);
  void *p = NULL;
  int st = be->alloc(sizeof(int32_t), &p);
  if (st != LUTRA_OK) return lutra_error_wrap(st, fn);
  st = be->memset(p, 0, sizeof(int32_t));
  if (st != LUTRA_OK) {
    be->free(p);
    return lutra_error_wrap(st, fn);
  }
  state[be->device].flag = p;
  return LUTRA_OK;
}

static int device_backend(int device, const lutra_backend **be, const char *fn) {
  TRY(lutra_backend_get(device, be, fn));
  if ((*be)->device < 0 || (*be)->device >= NUM_DEVICES)
    return lutra_error(LUTRA_EUNSUPPORTED, fn, "device %d has no skip-weight-update flag", device);
  return LUTRA_OK;
}

int lutra_skip_weight_flag(int device, const int32_t **flag, bool *host_value, const char *fn) {
  const lutra_backend *be;
  TRY(device_backend(device, &be, fn));
  pthread_mutex_lock(&lock);
  int st = ensure_flag(be, fn);
  if (st == LUTRA_OK) {
    *flag = state[be->device].flag;
    *host_value = state[be->device].host_value;
  }
  pthread_mutex_unlock(&lock);
  return st;
}

int lutra_set_skip_weight_update(int device, int skip) {
  static const char fn[] = "lutra_set_skip_weight_update";
  CHECK_STATE(!lutra_capturing(),
              "not allowed while this thread captures a CUDA graph (the graph would hold the "
              "value instead of reading the flag): set it before a capture or between replays");
  const lutra_backend *be;
  TRY(device_backend(device, &be, fn));
  pthread_mutex_lock(&lock);
  int st = ensure_flag(be, fn);
  /* stream-ordered, no host buffer and no synchronization: a one-element fill (one kernel on
   * CUDA) is ordered after the work queued before and before the work (or replay) queued after */
  if (st == LUTRA_OK) {
    st = be->fill(state[be->device].flag, LUTRA_I32, 1, skip ? 1.0f : 0.0f);
    if (st != LUTRA_OK)
      st = lutra_error_wrap(st, fn);
    else
      state[be->device].host_value = skip != 0;
  }
  pthread_mutex_unlock(&lock);
  return st;
}
