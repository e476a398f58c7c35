/* DotProductAttention's shared workspace (nn/attention_workspace.h): a short per-thread list of
 * (device, stream, buffer). The stream is the backend's current one (its stream entry; none on
 * the CPU, where a thread is the stream).
 *
 * A thread's buffers go when it exits, but a device buffer cannot be freed from there: the CUDA
 * context's own exit destructor (glibc runs them in the order the keys were made, and the
 * context's is made at the backend's first use, before this one unless a CPU attention came
 * first) has drained and destroyed the thread's stream already, and a free would queue on it.
 * So device buffers become orphans, freed by the next thread that grows a workspace on that
 * device (on its own stream; the orphan's was drained), at most ORPHANS of them kept (more leak:
 * threads that keep exiting while none grows a workspace); CPU buffers are freed. */
#include "nn/attention_workspace.h"
#include "core/capture.h"
#include "core/error.h"
#include "runtime/tensor.h"

#include <pthread.h>
#include <stdbool.h>

enum { WORKSPACES = 8 }; /* (device, stream) pairs a thread keeps */
enum { ORPHANS = 64 };   /* device buffers of exited threads waiting to be freed */

typedef struct shared_workspace {
  int device;
  const void *stream;
  lutra_tensor *buffer;
} shared_workspace;

static _Thread_local shared_workspace workspaces[WORKSPACES];
static _Thread_local bool registered;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t exit_key;
static bool key_ok;

static pthread_mutex_t orphan_lock = PTHREAD_MUTEX_INITIALIZER;
static lutra_tensor *orphans[ORPHANS];
static int orphan_count;

static void thread_exit(void *arg) {
  (void)arg;
  pthread_mutex_lock(&orphan_lock);
  for (int i = 0; i < WORKSPACES; i++) {
    lutra_tensor *t = workspaces[i].buffer;
    if (t && t->device == LUTRA_CPU)
      lutra_tensor_owner_drop(t);
    else if (t && orphan_count < ORPHANS)
      orphans[orphan_count++] = t;
    workspaces[i] = (shared_workspace){0};
  }
  pthread_mutex_unlock(&orphan_lock);
  registered = false;
}

/* frees the orphans of device on the calling thread's stream (it is growing a workspace there) */
static void free_orphans(int device) {
  pthread_mutex_lock(&orphan_lock);
  for (int i = 0; i < orphan_count;) {
    if (orphans[i]->device == device) {
      lutra_tensor_owner_drop(orphans[i]);
      orphans[i] = orphans[--orphan_count];
    } else {
      i++;
    }
  }
  pthread_mutex_unlock(&orphan_lock);
}

static void make_key(void) {
  key_ok = pthread_key_create(&exit_key, thread_exit) == 0;
}

static shared_workspace *entry_for(int device, const void *stream) {
  shared_workspace *free_entry = NULL;
  for (int i = 0; i < WORKSPACES; i++) {
    shared_workspace *w = &workspaces[i];
    if (w->buffer && w->device == device && w->stream == stream) return w;
    if (!w->buffer && !free_entry) free_entry = w;
  }
  return free_entry;
}

int attention_workspace_get(const lutra_backend *be, int device, int64_t bytes, lutra_tensor **out,
                            const char *fn) {
  *out = NULL;
  if (bytes <= 0) return LUTRA_OK;
  const void *stream = be->stream ? be->stream() : NULL;
  shared_workspace *w = entry_for(device, stream);
  if (!w)
    return lutra_error(LUTRA_EUNSUPPORTED, fn,
                       "this thread ran attention on more than %d (device, stream) pairs",
                       WORKSPACES);
  if (w->buffer && w->buffer->numel * 4 >= bytes) {
    *out = w->buffer;
    return LUTRA_OK;
  }
  CHECK_STATE(!LUTRA_CAPTURING(),
              "growing the shared attention workspace to %lld bytes inside a CUDA graph capture "
              "(a new shape): run the step eagerly first",
              (long long)bytes);
  if (!registered) {
    pthread_once(&key_once, make_key);
    if (!key_ok || pthread_setspecific(exit_key, workspaces) != 0)
      return lutra_error(LUTRA_ENOMEM, fn, "cannot register the thread's attention workspace");
    registered = true;
  }
  /* raw bytes, as f32 words (the backend reads them as bytes) */
  const int64_t words = (bytes + 3) / 4;
  lutra_tensor_spec spec = *PLAIN_TENSOR(LUTRA_F32, 1, &words, device);
  spec.flags = LUTRA_TENSOR_BORROWED;
  lutra_tensor *grown;
  TRY(lutra_tensor_make(&spec, &grown, fn));
  free_orphans(device);
  lutra_tensor_owner_drop(w->buffer);
  *w = (shared_workspace){.device = device, .stream = stream, .buffer = grown};
  *out = grown;
  return LUTRA_OK;
}
