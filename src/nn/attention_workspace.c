/* DotProductAttention's shared workspace (nn/attention_workspace.h): a short per-thread list of
 * (device, stream, buffer), dropped when the thread exits. The stream is the backend's current
 * one (its stream entry; none on the CPU, where a thread is the stream). */
#include "nn/attention_workspace.h"
#include "core/capture.h"
#include "core/error.h"
#include "runtime/tensor.h"

#include <pthread.h>
#include <stdbool.h>

enum { WORKSPACES = 8 }; /* (device, stream) pairs a thread keeps */

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

static void thread_exit(void *arg) {
  (void)arg;
  for (int i = 0; i < WORKSPACES; i++) {
    lutra_tensor_owner_drop(workspaces[i].buffer);
    workspaces[i] = (shared_workspace){0};
  }
  registered = false;
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
  lutra_tensor_owner_drop(w->buffer);
  *w = (shared_workspace){.device = device, .stream = stream, .buffer = grown};
  *out = grown;
  return LUTRA_OK;
}
