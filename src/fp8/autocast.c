/* Autocast scopes and the thread-local FP8 state.
 *
 * A scope saves the thread's state on enter and restores it on exit. Delayed-scaling
 * quantizers used in forward while the outermost scope is open are collected (once each, by
 * an epoch stamp) and updated together in ONE backend call when that scope exits; the
 * gradient quantizers used in backward are updated in one call when the first module of the
 * forward finishes its backward. Lists only grow when a new quantizer joins, so a steady
 * training loop allocates nothing here. With a process group on the outermost scope (and the
 * recipe's reduce_amax), each of those updates first replaces the amaxes by their max over the
 * group in ONE all-reduce over one contiguous buffer (dist/group.c); the backward's update
 * reduces over the group of the scope its forward ran in. */
#include "fp8/autocast.h"
#include "backend/backend.h"
#include "backend/device.h"
#include "core/error.h"
#include "core/object.h"
#include "core/trace.h"
#include "fp8/rules.h"
#include "parallel/group.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct lutra_autocast {
  lutra_object obj;
  lutra_recipe *recipe;
  lutra_group *group;
  int32_t enabled;
  int32_t calibrating;
  bool active;
  const struct thread_state *owner; /* the thread that entered it (its thread state) */
  lutra_tls_state saved;
  lutra_autocast *saved_innermost;
};

typedef struct meta_list {
  lutra_scale_meta **items;
  int count, cap;
  int ruled; /* items with an external scaling rule (fp8/rules.c) */
  int device;
  uint64_t epoch;
} meta_list;

typedef struct thread_state {
  lutra_tls_state st;
  lutra_autocast *innermost;
  meta_list fwd, bwd;
  uint64_t next_epoch;
  bool trigger_claimed;
  lutra_group *bwd_group; /* held from the trigger's claim until the backward update ran */
  uint64_t bwd_recipe_key;
  uint64_t updates;
  int last_count;
  bool registered; /* the exit destructor will run */
} thread_state;

static _Thread_local thread_state tls;

/* Thread exit: the update lists and the group the backward's claim held go with the thread (a
 * pthread key's destructor; the main thread's stay until the process ends). */
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static pthread_key_t exit_key;
static bool exit_key_ok;
static atomic_int live_threads; /* threads whose lists or held group are not released yet */

static void thread_exit(void *arg) {
  (void)arg;
  free(tls.fwd.items);
  free(tls.bwd.items);
  tls.fwd = tls.bwd = (meta_list){0};
  lutra_group_unref(tls.bwd_group);
  tls.bwd_group = NULL;
  tls.registered = false;
  atomic_fetch_sub(&live_threads, 1);
}

static void make_exit_key(void) {
  exit_key_ok = pthread_key_create(&exit_key, thread_exit) == 0;
}

/* Arms the exit destructor the first time this thread keeps something. */
static void register_thread(void) {
  if (tls.registered) return;
  pthread_once(&exit_once, make_exit_key);
  if (exit_key_ok && pthread_setspecific(exit_key, &tls) == 0) {
    tls.registered = true;
    atomic_fetch_add(&live_threads, 1);
  }
}

int lutra_autocast_live_threads(void) {
  return atomic_load(&live_threads);
}

const lutra_tls_state *lutra_autocast_current(void) {
  return &tls.st;
}

static uint64_t new_epoch(void) {
  return ++tls.next_epoch;
}

static void ensure_epochs(void) {
  if (!tls.fwd.epoch) tls.fwd.epoch = new_epoch();
  if (!tls.bwd.epoch) tls.bwd.epoch = new_epoch();
}

/* The metas m[0 .. n - 1] not yet in the list l joined to it (each once an epoch); nothing
 * changes on an error. One call for many metas: a GroupedLinear notes two per expert each
 * forward, where a call apiece was most of the cost (bench/callgrind.sh, grouped64_note). */
static int note(meta_list *l, lutra_scale_meta *m, int n, int device, const char *fn) {
  ensure_epochs();
  const uint64_t epoch = l->epoch;
  int i = 0;
  while (i < n && m[i].epoch == epoch)
    i++;
  if (i == n) return LUTRA_OK;
  if (l->count && l->device != device)
    return lutra_error(LUTRA_EINVAL, fn,
                       "delayed-scaling quantizers on two devices in one autocast scope");
  if (n - i > l->cap - l->count) {
    int cap = l->cap ? l->cap : 16;
    while (cap - l->count < n - i)
      cap *= 2;
    lutra_scale_meta **items = realloc(l->items, (size_t)cap * sizeof *items);
    if (!items) return lutra_error(LUTRA_ENOMEM, fn, "cannot grow the scale-update list");
    l->items = items;
    l->cap = cap;
    register_thread();
  }
  for (; i < n; i++) {
    if (m[i].epoch == epoch) continue;
    l->items[l->count++] = &m[i];
    l->ruled += m[i].rule != 0;
    m[i].epoch = epoch;
  }
  l->device = device;
  return LUTRA_OK;
}

int lutra_autocast_note_forward(lutra_scale_meta *m, int device, const char *fn) {
  return note(&tls.fwd, m, 1, device, fn);
}

int lutra_autocast_note_backward(lutra_scale_meta *m, int device, const char *fn) {
  return note(&tls.bwd, m, 1, device, fn);
}

int lutra_autocast_note_forward_n(lutra_scale_meta *m, int n, int device, const char *fn) {
  return note(&tls.fwd, m, n, device, fn);
}

int lutra_autocast_note_backward_n(lutra_scale_meta *m, int n, int device, const char *fn) {
  return note(&tls.bwd, m, n, device, fn);
}

/* Forgets what the list's quantizers recorded this step: their amax slots back to zero (what a
 * step that observed nothing leaves, so the next update keeps their scales) and an empty list. */
static int discard(meta_list *l, const char *fn) {
  if (!l->count) return LUTRA_OK;
  const lutra_backend *be;
  int st = lutra_backend_get(l->device, &be, fn);
  for (int i = 0; st == LUTRA_OK && i < l->count; i++)
    st = be->memset(l->items[i]->amax_history, 0, sizeof(float));
  l->count = 0;
  l->ruled = 0;
  l->epoch = new_epoch();
  return st;
}

/* The forward is run again after a failure (a factory recipe's first forward of a module): the
 * module that claimed the backward trigger in it claims it again then. */
int lutra_autocast_discard_forward(const char *fn) {
  tls.trigger_claimed = false;
  return discard(&tls.fwd, fn);
}

int lutra_autocast_discard_backward(const char *fn) {
  return discard(&tls.bwd, fn);
}

/* One amax all-reduce across the scope's group (when its recipe reduces amaxes) over the whole
 * list, then one backend call over it and a fresh epoch so each meta can join again. Metas with
 * an external rule are set aside for it after the all-reduce (their rules read the reduced
 * amaxes), before the update: then LUTRA_RULES_PENDING (lutra/rules.h). a: the exiting scope
 * (forward list) or NULL (backward list: the group and recipe the trigger's claim kept). */
static int flush_work(meta_list *l, const lutra_autocast *a, const char *fn);
/* Out of line, with its early return first: the exit of an empty scope costs a call and a test. */
static __attribute__((noinline)) int flush(meta_list *l, const lutra_autocast *a, const char *fn) {
  if (!l->count) return LUTRA_OK;
  return flush_work(l, a, fn);
}

static __attribute__((noinline)) int flush_work(meta_list *l, const lutra_autocast *a,
                                                const char *fn) {
  const lutra_backend *be;
  TRY(lutra_backend_get(l->device, &be, fn));
  const bool backward = a == NULL;
  lutra_group *group = backward                              ? tls.bwd_group
                       : a->recipe && a->recipe->reduce_amax ? a->group
                                                             : NULL;
  uint64_t recipe_key = backward ? tls.bwd_recipe_key : a->recipe ? a->recipe->key : 0;
  if (group) {
    TRY(lutra_group_check(group, fn));
    TRY(lutra_dist_reduce_amax(group, l->items, l->count, l->device, backward, recipe_key, fn));
  }
  int handed = LUTRA_OK, total = l->count;
  if (l->ruled) {
    handed = lutra_rules_hand_over(l->items, &l->count, l->device, fn);
    if (handed != LUTRA_RULES_PENDING) return handed;
    l->ruled = 0;
  }
  RANGE_PUSH("lutra.scale_update");
  int st = l->count ? be->delayed_update(l->items, l->count) : LUTRA_OK;
  RANGE_POP();
  if (st != LUTRA_OK) {
    if (handed == LUTRA_RULES_PENDING) (void)lutra_rules_discard();
    return st;
  }
  tls.updates++;
  tls.last_count = total;
  l->count = 0;
  l->epoch = new_epoch();
  return handed;
}

bool lutra_autocast_claim_backward_trigger(void) {
  if (tls.st.depth == 0 || tls.trigger_claimed) return false;
  tls.trigger_claimed = true;
  lutra_group *g = tls.st.recipe && tls.st.recipe->reduce_amax ? tls.st.group : NULL;
  if (g != tls.bwd_group) {
    lutra_group_retain(g);
    lutra_group_unref(tls.bwd_group);
    tls.bwd_group = g;
    if (g) register_thread();
  }
  tls.bwd_recipe_key = tls.st.recipe ? tls.st.recipe->key : 0;
  return true;
}

/* Rules set aside here wait for the caller of lutra_module_backward (lutra_rules_pending). */
int lutra_autocast_backward_done(const char *fn) {
  int st = flush(&tls.bwd, NULL, fn);
  return st == LUTRA_RULES_PENDING ? LUTRA_OK : st;
}

static void forget_in(meta_list *l, lutra_scale_meta *m) {
  for (int i = 0; i < l->count; i++)
    if (l->items[i] == m) {
      l->ruled -= m->rule != 0;
      l->items[i] = l->items[--l->count];
      return;
    }
}

void lutra_autocast_forget(lutra_scale_meta *m) {
  forget_in(&tls.fwd, m);
  forget_in(&tls.bwd, m);
  if (m->rule) lutra_rules_forget(m);
}

int lutra_autocast_new(lutra_recipe *r, lutra_group *g, int enabled, int calibrating,
                       lutra_autocast **out) {
  static const char fn[] = "lutra_autocast_new";
  CHECK_ARG(out, "out is NULL");
  if (r) TRY(lutra_check_object(r, LUTRA_MAGIC_RECIPE, fn, "recipe"));
  CHECK_ARG(r || (!enabled && !calibrating),
            "a recipe is needed when the scope is enabled or calibrating");
  if (g) TRY(lutra_group_check(g, fn));
  lutra_autocast *a = calloc(1, sizeof *a);
  if (!a) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a scope");
  a->obj.magic = LUTRA_MAGIC_AUTOCAST;
  a->obj.refs = 1;
  a->recipe = r;
  if (r) r->obj.refs++;
  a->group = g;
  lutra_group_retain(g);
  a->enabled = enabled != 0;
  a->calibrating = calibrating != 0;
  *out = a;
  return LUTRA_OK;
}

static void leave(lutra_autocast *a) {
  tls.st = a->saved;
  tls.innermost = a->saved_innermost;
  a->active = false;
  a->owner = NULL;
}

int lutra_autocast_unwind(int depth) {
  static const char fn[] = "lutra_autocast_unwind";
  CHECK_ARG(depth >= 0, "depth must be >= 0 (got %d)", depth);
  int st = LUTRA_OK;
  while (tls.st.depth > depth && tls.innermost) {
    if (tls.st.depth == 1) {
      int d = discard(&tls.fwd, fn);
      if (st == LUTRA_OK) st = d;
      tls.trigger_claimed = false;
    }
    leave(tls.innermost);
  }
  return st;
}

int lutra_autocast_unref(lutra_autocast *a) {
  if (!a) return LUTRA_OK;
  /* collected (or freed) while still entered on this thread: nobody can exit it any more, so
   * leave it and every scope inside it now rather than keep the thread in its state forever */
  if (a->active && a->owner == &tls) lutra_autocast_unwind(a->saved.depth);
  if (a->active) {
    /* still entered: keep it (the thread state points at it); release marks it instead */
    a->obj.flags |= LUTRA_OBJ_FREED;
    return lutra_error(LUTRA_ESTATE, "lutra_autocast_unref",
                       "scope is still entered by another thread; exit it there first");
  }
  if (a->recipe) lutra_recipe_unref(a->recipe);
  lutra_group_unref(a->group);
  free(a);
  return LUTRA_OK;
}

int lutra_autocast_destroy(lutra_autocast *a) {
  static const char fn[] = "lutra_autocast_destroy";
  TRY(lutra_check_object(a, LUTRA_MAGIC_AUTOCAST, fn, "scope"));
  CHECK_STATE(!a->active, "scope is still entered; exit it first");
  a->obj.flags |= LUTRA_OBJ_FREED;
  return LUTRA_OK;
}

/* enter and exit look the thread's state up once (t): each lookup of a thread-local in a shared
 * library is a __tls_get_addr call, and they run on every step. GCC rematerializes &tls with a
 * new call rather than keep it in a register; the empty asm makes t a value it must keep. */
static inline thread_state *this_thread(void) {
  thread_state *t = &tls;
  __asm__("" : "+r"(t));
  return t;
}

int lutra_autocast_enter(lutra_autocast *a) {
  static const char fn[] = "lutra_autocast_enter";
  TRY(lutra_check_object(a, LUTRA_MAGIC_AUTOCAST, fn, "scope"));
  CHECK_STATE(!a->active, "scope is already entered");
  thread_state *t = this_thread();
  a->saved = t->st;
  a->saved_innermost = t->innermost;
  a->active = true;
  a->owner = t;
  t->st.recipe = a->recipe;
  t->st.group = a->group;
  t->st.enabled = a->enabled;
  t->st.calibrating = a->calibrating;
  t->st.depth++;
  t->innermost = a;
  return LUTRA_OK;
}

/* The outermost exit's update did not return OK: LUTRA_RULES_PENDING (the scope exits, and the
 * caller runs the rules set aside), or an error (the scope stays entered). Out of line, so that
 * the exit of a scope without Lua rules costs what it did. */
static __attribute__((noinline, cold)) int exit_pending(lutra_autocast *a, int st) {
  if (st != LUTRA_RULES_PENDING) return st;
  tls.trigger_claimed = false;
  leave(a);
  return st;
}

int lutra_autocast_exit(lutra_autocast *a) {
  static const char fn[] = "lutra_autocast_exit";
  TRY(lutra_check_object(a, LUTRA_MAGIC_AUTOCAST, fn, "scope"));
  thread_state *t = this_thread();
  CHECK_STATE(a->active, "scope is not entered");
  CHECK_STATE(a->owner == t, "scope was entered by another thread: exit it on that thread");
  CHECK_STATE(t->innermost == a, "scope is not the innermost one (exit the inner scopes first)");
  if (t->st.depth == 1) {
    if (t->fwd.count) {
      int st = flush(&t->fwd, a, fn);
      if (st != LUTRA_OK) return exit_pending(a, st);
    }
    t->trigger_claimed = false;
  }
  t->st = a->saved;
  t->innermost = a->saved_innermost;
  a->active = false;
  a->owner = NULL;
  return LUTRA_OK;
}

int lutra_autocast_state(int *depth, int *enabled, int *calibrating) {
  static const char fn[] = "lutra_autocast_state";
  CHECK_ARG(depth && enabled && calibrating, "output pointers must not be NULL");
  *depth = tls.st.depth;
  *enabled = tls.st.enabled;
  *calibrating = tls.st.calibrating;
  return LUTRA_OK;
}

int lutra_autocast_update_stats(uint64_t *updates, int *last_count) {
  static const char fn[] = "lutra_autocast_update_stats";
  CHECK_ARG(updates && last_count, "output pointers must not be NULL");
  *updates = tls.updates;
  *last_count = tls.last_count;
  return LUTRA_OK;
}
