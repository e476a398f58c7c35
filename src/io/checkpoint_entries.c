/* The entries of a checkpoint (io/checkpoint_entries.h): a walk over the module tree through
 * the checkpoint protocol (nn/module.h), then the optimizer's buffers named after the
 * parameters they belong to, then the generator. */
#include "io/checkpoint_entries.h"
#include "backend/device.h"
#include "core/error.h"
#include "core/object.h"
#include "fp8/autocast.h"
#include "fp8/quantizer.h"
#include "nn/module.h"
#include "optim/optim_state.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int add(ckpt_entries *E, const ckpt_entry *proto, const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int add(ckpt_entries *E, const ckpt_entry *proto, const char *fn, const char *fmt, ...) {
  if (E->count == E->cap) {
    int cap = E->cap ? E->cap * 2 : 32;
    ckpt_entry *e = realloc(E->e, (size_t)cap * sizeof *e);
    if (!e) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate the entry list");
    E->e = e, E->cap = cap;
  }
  char name[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof name)
    return lutra_error(LUTRA_EINVAL, fn, "a tensor name is longer than %zu bytes", sizeof name - 1);
  ckpt_entry *e = &E->e[E->count];
  *e = *proto;
  e->name = strdup(name);
  if (!e->name) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a name");
  E->count++;
  return LUTRA_OK;
}

static const char *st_dtype_of(int dtype) {
  switch (dtype) {
  case LUTRA_F32:
    return "F32";
  case LUTRA_BF16:
    return "BF16";
  case LUTRA_F16:
    return "F16";
  case LUTRA_E4M3:
    return "F8_E4M3";
  case LUTRA_E5M2:
    return "F8_E5M2";
  case LUTRA_E8M0:
    return "F8_E8M0";
  case LUTRA_I32:
    return "I32";
  default:
    return NULL;
  }
}

static int tensor_entry(ckpt_entries *E, lutra_tensor *t, entry_kind kind, const char *fn,
                        const char *prefix, const char *name, const char *suffix) {
  CHECK_STATE(!(t->flags & LUTRA_TENSOR_FREED), "tensor %s%s%s was freed", prefix, name, suffix);
  const char *dtype = st_dtype_of(t->dtype);
  CHECK_ARG(dtype && t->scaling == LUTRA_SCALING_NONE, "tensor %s%s%s has dtype %s", prefix, name,
            suffix, lutra_dtype_name(t->dtype));
  ckpt_entry e = {.kind = kind,
                  .dtype = dtype,
                  .lutra_dtype = t->dtype,
                  .ndim = t->ndim,
                  .bytes = (size_t)t->numel * lutra_dtype_size(t->dtype),
                  .ptr = t->data,
                  .param = kind == ENTRY_PARAM ? t : NULL};
  memcpy(e.shape, t->shape, sizeof e.shape);
  TRY(lutra_backend_get(t->device, &e.be, fn));
  return add(E, &e, fn, "%s%s%s", prefix, name, suffix);
}

/* f32 [n] backend memory of be */
static int f32_entry(ckpt_entries *E, float *p, int64_t n, const lutra_backend *be, const char *fn,
                     const char *prefix, const char *name, const char *suffix) {
  ckpt_entry e = {.kind = ENTRY_STATE,
                  .dtype = "F32",
                  .lutra_dtype = LUTRA_F32,
                  .ndim = 1,
                  .shape = {n},
                  .bytes = (size_t)n * 4,
                  .ptr = p,
                  .be = be};
  return add(E, &e, fn, "%s%s%s", prefix, name, suffix);
}

static void destroy_fresh(ckpt_pending *p) {
  for (int i = 0; i < p->q.count; i++)
    lutra_quantizer_owner_drop(p->q.q[i]);
  p->q.count = 0;
  if (p->state) p->module->ops->checkpoint->drop_fp8_state(p->module, p->state);
  p->state = NULL;
}

/* p: fresh quantizers (p->q.fresh) or fresh state (p->state); freed when it cannot be kept */
static int keep_pending(ckpt_entries *E, ckpt_pending *p, const char *fn) {
  if (E->npending == E->pending_cap) {
    int cap = E->pending_cap ? E->pending_cap * 2 : 8;
    ckpt_pending *grown = realloc(E->pending, (size_t)cap * sizeof *grown);
    if (!grown) {
      destroy_fresh(p);
      return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate the quantizer list");
    }
    E->pending = grown, E->pending_cap = cap;
  }
  E->pending[E->npending++] = *p;
  return LUTRA_OK;
}

void ckpt_adopt(ckpt_entries *E) {
  for (int i = 0; i < E->npending; i++) {
    ckpt_pending *p = &E->pending[i];
    const lutra_checkpoint_ops *ck = p->module->ops->checkpoint;
    if (p->q.fresh) ck->adopt_quantizers(p->module, p->recipe, &p->q);
    if (p->state) ck->adopt_fp8_state(p->module, p->recipe, p->state);
    p->q.count = 0; /* the module's now */
    p->state = NULL;
  }
}

static int host_entry(ckpt_entries *E, entry_kind kind, const char *dtype, void *p,
                      const char *name, const char *fn) {
  ckpt_entry e = {.kind = kind,
                  .dtype = dtype,
                  .lutra_dtype = -1,
                  .ndim = 1,
                  .shape = {1},
                  .bytes = 8,
                  .ptr = p};
  return add(E, &e, fn, "%s", name);
}

static int state_entries(ckpt_entries *E, const char *prefix, const char *name,
                         const lutra_quantizer_state_view *v, const char *fn) {
  char pre[512];
  int n = snprintf(pre, sizeof pre, "%sfp8.%s.", prefix, name);
  CHECK_ARG(n > 0 && (size_t)n < sizeof pre, "a quantizer name is too long");
  TRY(f32_entry(E, v->scale, 1, v->be, fn, pre, "scale", ""));
  TRY(f32_entry(E, v->scale_inv, 1, v->be, fn, pre, "scale_inv", ""));
  if (v->amax_history)
    TRY(f32_entry(E, v->amax_history, v->history_len, v->be, fn, pre, "amax_history", ""));
  if (v->calls) {
    /* optional: a file written before the count was saved loads, its resume drawing the
     * stochastic-rounding seeds from the count the quantizer has */
    char name[600];
    snprintf(name, sizeof name, "%squantizations", pre);
    TRY(host_entry(E, ENTRY_STATE, "U64", v->calls, name, fn));
    E->e[E->count - 1].optional = true;
  }
  return LUTRA_OK;
}

/* lutra_fp8_state_sink.add: the entries of one view of a module's state */
typedef struct sink_ctx {
  ckpt_entries *E;
  const char *prefix;
} sink_ctx;

static int sink_add(void *ctx, const char *name, const lutra_quantizer_state_view *v,
                    const char *fn) {
  sink_ctx *c = ctx;
  return state_entries(c->E, c->prefix, name, v, fn);
}

static int quantizer_entries(ckpt_entries *E, lutra_module *m, const lutra_recipe *build_for,
                             const char *prefix, const char *fn) {
  const lutra_checkpoint_ops *ck = m->ops->checkpoint;
  if (ck->fp8_state) {
    /* the entries are added before the fresh state is kept: on failure the state is freed
     * here, and entries pointing into it are freed (not used) with the list */
    ckpt_pending p = {.module = m, .recipe = build_for};
    sink_ctx ctx = {E, prefix};
    TRY(ck->fp8_state(m, build_for, &(lutra_fp8_state_sink){sink_add, &ctx}, &p.state, fn));
    if (p.state) TRY(keep_pending(E, &p, fn));
  }
  if (!ck->quantizers) return LUTRA_OK;
  ckpt_pending p = {.module = m, .recipe = build_for};
  TRY(ck->quantizers(m, build_for, &p.q, fn));
  if (p.q.fresh) TRY(keep_pending(E, &p, fn));
  for (int i = 0; i < p.q.count; i++) {
    if (!p.q.q[i]) continue;
    lutra_quantizer_state_view v;
    TRY(lutra_quantizer_state(p.q.q[i], &v));
    TRY(state_entries(E, prefix, p.q.name[i], &v, fn));
  }
  return LUTRA_OK;
}

/* <prefix>rng_state, U64 [2]: the generator of a module that has one to save. Optional: a file
 * written before it was saved loads, the generator left as it is. */
static int rng_entry(ckpt_entries *E, lutra_module *m, const char *prefix, const char *fn) {
  const lutra_checkpoint_ops *ck = m->ops->checkpoint;
  uint64_t state[2];
  bool has = false;
  if (ck->rng_get) TRY(ck->rng_get(m, state, &has, fn));
  if (!has) return LUTRA_OK;
  if (E->nrng == E->rng_cap) {
    int cap = E->rng_cap ? E->rng_cap * 2 : 8;
    ckpt_rng **grown = realloc(E->rng, (size_t)cap * sizeof *grown);
    if (!grown) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate the generator list");
    E->rng = grown, E->rng_cap = cap;
  }
  ckpt_rng *r = malloc(sizeof *r);
  if (!r) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a generator's state");
  *r = (ckpt_rng){.module = m, .state = {state[0], state[1]}};
  E->rng[E->nrng++] = r;
  ckpt_entry e = {.kind = ENTRY_STATE,
                  .dtype = "U64",
                  .lutra_dtype = -1,
                  .ndim = 1,
                  .shape = {2},
                  .bytes = sizeof r->state,
                  .ptr = r->state,
                  .optional = true};
  return add(E, &e, fn, "%srng_state", prefix);
}

/* The name of the parameter whose value is t among the entries [0, n) of E, or NULL. */
static const char *param_name_of(const ckpt_entries *E, int n, const lutra_tensor *t) {
  for (int i = 0; i < n; i++)
    if (E->e[i].kind == ENTRY_PARAM && E->e[i].param == t) return E->e[i].name;
  return NULL;
}

/* A parameter a module earlier in the walk holds too (a tied weight, nn/tie.h): stored once, under
 * that module's name; a load notes the second name, so that a file storing it there (saved from
 * a model without the tie) is refused by name rather than as an unknown tensor. */
static int tied_entry(ckpt_entries *E, const char *first, const char *fn, const char *prefix,
                      const char *name) {
  if (E->saving) return LUTRA_OK;
  ckpt_entry e = {
      .kind = ENTRY_TIED, .dtype = "", .lutra_dtype = -1, .optional = true, .tied_to = first};
  return add(E, &e, fn, "%s%s", prefix, name);
}

static int walk(ckpt_entries *E, lutra_module *m, const char *prefix,
                const lutra_checkpoint_objects *o, const lutra_recipe *build_for, int depth,
                const char *fn) {
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(depth < 64, "the module tree is deeper than 64 levels");
  const lutra_checkpoint_ops *ck = m->ops->checkpoint;
  /* a kind that does not say what it holds may hold state a file would silently leave out */
  if (!ck)
    return lutra_error(LUTRA_EUNSUPPORTED, fn,
                       "module '%.*s' is a %s, a module kind that does not support checkpoints",
                       *prefix ? (int)strlen(prefix) - 1 : 6, *prefix ? prefix : "(root)",
                       m->ops->kind);
  /* the FP8 weight cached for the rest of the window is not in the file: refused, not saved
   * into a checkpoint that would resume differently */
  if (E->saving && o->fp8 && ck->in_accumulation_window && ck->in_accumulation_window(m))
    return lutra_error(LUTRA_ESTATE, fn,
                       "module '%.*s' (%s) is between the micro-batches of a gradient-accumulation "
                       "window under delayed scaling: its FP8 weight, cached by the forward with "
                       "is_first_microbatch true, is not saved, and a resumed forward with "
                       "is_first_microbatch false would quantize it again under the updated scale; "
                       "save after the optimizer step",
                       *prefix ? (int)strlen(prefix) - 1 : 6, *prefix ? prefix : "(root)",
                       m->ops->kind);
  char pre[512];
  if (ck->num_children) {
    int n = ck->num_children(m);
    for (int i = 0; i < n; i++) {
      const char *name;
      lutra_module *c = ck->child(m, i, &name);
      int len = !name   ? snprintf(pre, sizeof pre, "%s%d.", prefix, i)
                : *name ? snprintf(pre, sizeof pre, "%s%s.", prefix, name)
                        : snprintf(pre, sizeof pre, "%s", prefix); /* "": no level */
      CHECK_ARG(len > 0 && (size_t)len < sizeof pre, "a module name is too long");
      TRY(walk(E, c, pre, o, build_for, depth + 1, fn));
    }
  } else {
    int n = m->ops->num_params(m);
    for (int i = 0; i < n; i++) {
      lutra_param p;
      TRY(m->ops->param(m, i, &p));
      const char *name = ck->param_name ? ck->param_name(m, i) : NULL;
      char fallback[32];
      if (!name) {
        snprintf(fallback, sizeof fallback, "param%d", i);
        name = i == 0 ? "weight" : i == 1 ? "bias" : fallback;
      }
      const char *first = param_name_of(E, E->count, p.value);
      if (first) {
        TRY(tied_entry(E, first, fn, prefix, name));
        continue;
      }
      TRY(tensor_entry(E, p.value, ENTRY_PARAM, fn, prefix, name, ""));
      if (o->main_grads && p.main_grad)
        TRY(tensor_entry(E, p.main_grad, ENTRY_STATE, fn, prefix, name, ".main_grad"));
    }
  }
  if (o->fp8) TRY(quantizer_entries(E, m, build_for, prefix, fn));
  return rng_entry(E, m, prefix, fn);
}

static int cmp_entry(const void *a, const void *b) {
  return strcmp(((const ckpt_entry *)a)->name, ((const ckpt_entry *)b)->name);
}

static int optim_entries(ckpt_entries *E, lutra_optim *opt, const char *fn) {
  lutra_optim_view v;
  TRY(lutra_optim_view_of(opt, &v, fn));
  /* names: the model's, else a walk of the optimizer's own module (names only) */
  ckpt_entries own = {0};
  const ckpt_entries *names = E;
  int nnames = E->count;
  if (nnames == 0) {
    lutra_checkpoint_objects plain = {0};
    int st = walk(&own, v.module, "", &plain, NULL, 0, fn);
    if (st != LUTRA_OK) {
      ckpt_entries_free(&own);
      return st;
    }
    names = &own, nnames = own.count;
  }
  int st = LUTRA_OK;
  bool adamw = v.kind == LUTRA_OPTIM_ADAMW;
  for (int i = 0; i < v.args->count && st == LUTRA_OK; i++) {
    lutra_param p;
    st = v.module->ops->param(v.module, i, &p);
    if (st != LUTRA_OK) break;
    const char *name = param_name_of(names, nnames, p.value);
    if (!name) {
      st = lutra_error(LUTRA_EINVAL, fn,
                       "the optimizer's parameter %d is not in the model: the optimizer's "
                       "module must be the model or a module inside it",
                       i);
      break;
    }
    char pre[512];
    snprintf(pre, sizeof pre, "optim.%s.", name);
    if (v.args->master[i]) {
      st = f32_entry(E, v.args->master[i], v.args->numel[i], v.be, fn, pre, "master", "");
      if (st == LUTRA_OK) {
        ckpt_entry *e = &E->e[E->count - 1];
        e->kind = ENTRY_MASTER;
        e->param = v.mastered[i];
      }
    }
    if (st == LUTRA_OK && v.args->m[i])
      st = f32_entry(E, v.args->m[i], v.args->numel[i], v.be, fn, pre,
                     adamw ? "exp_avg" : "momentum_buffer", "");
    if (st == LUTRA_OK && v.args->v[i])
      st = f32_entry(E, v.args->v[i], v.args->numel[i], v.be, fn, pre, "exp_avg_sq", "");
    /* the state has the parameter's shape (torch's), not the flat f32 buffer's */
    for (int k = 0; st == LUTRA_OK && k < (int)(v.args->master[i] != NULL) +
                                              (v.args->m[i] != NULL) + (v.args->v[i] != NULL);
         k++) {
      ckpt_entry *e = &E->e[E->count - 1 - k];
      e->ndim = p.value->ndim;
      memcpy(e->shape, p.value->shape, sizeof e->shape);
    }
  }
  ckpt_entries_free(&own);
  TRY(st);
  E->optim = opt;
  E->host.step = v.args->step;
  E->host.device_step = v.args->step;
  TRY(host_entry(E, ENTRY_STEP, "I64", &E->host.step, "optim.step", fn));
  if (v.args->device_step) {
    ckpt_entry e = {.kind = ENTRY_DEVICE_STEP,
                    .dtype = "I64",
                    .lutra_dtype = -1,
                    .ndim = 1,
                    .shape = {1},
                    .bytes = 8,
                    .ptr = v.args->device_step,
                    .be = v.be};
    return add(E, &e, fn, "optim.device_step");
  }
  return host_entry(E, ENTRY_DEVICE_STEP, "I64", &E->host.device_step, "optim.device_step", fn);
}

int ckpt_collect(const lutra_checkpoint_objects *o, bool for_load, ckpt_entries *E,
                 const char *fn) {
  memset(E, 0, sizeof *E);
  E->saving = !for_load;
  int st = LUTRA_OK;
  if (o->model) st = walk(E, o->model, "", o, for_load ? o->recipe : NULL, 0, fn);
  if (st == LUTRA_OK && o->optim) st = optim_entries(E, o->optim, fn);
  if (st == LUTRA_OK && o->rng) {
    st = lutra_seed_state(&E->host.rng);
    if (st == LUTRA_OK) st = host_entry(E, ENTRY_RNG, "U64", &E->host.rng, "rng.state", fn);
  }
  if (st == LUTRA_OK && E->count) qsort(E->e, (size_t)E->count, sizeof *E->e, cmp_entry);
  for (int i = 1; st == LUTRA_OK && i < E->count; i++)
    if (strcmp(E->e[i - 1].name, E->e[i].name) == 0)
      st = lutra_error(LUTRA_EINVAL, fn, "two tensors of the objects are named '%s'", E->e[i].name);
  if (st != LUTRA_OK) ckpt_entries_free(E);
  return st;
}

void ckpt_entries_free(ckpt_entries *E) {
  for (int i = 0; i < E->count; i++)
    free(E->e[i].name);
  for (int i = 0; i < E->npending; i++)
    destroy_fresh(&E->pending[i]);
  free(E->pending);
  for (int i = 0; i < E->nrng; i++)
    free(E->rng[i]);
  free(E->rng);
  free(E->e);
  memset(E, 0, sizeof *E);
}

ckpt_entry *ckpt_find(const ckpt_entries *E, const char *name) {
  if (!E->count) return NULL;
  ckpt_entry key = {.name = (char *)name};
  return bsearch(&key, E->e, (size_t)E->count, sizeof *E->e, cmp_entry);
}

int ckpt_apply_host(ckpt_entries *E, const lutra_checkpoint_objects *o, const float *lr,
                    const char *fn) {
  for (int i = 0; i < E->count; i++)
    if (E->e[i].kind == ENTRY_PARAM)
      E->e[i].param->flags |=
          LUTRA_TENSOR_WRITTEN | LUTRA_TENSOR_UPDATED | LUTRA_TENSOR_LOADED | LUTRA_TENSOR_REPACK;
  /* a master loaded with its parameter is the newer copy: the step must not overwrite it */
  for (int i = 0; i < E->count; i++)
    if (E->e[i].kind == ENTRY_MASTER && E->e[i].param)
      E->e[i].param->flags &= ~(uint32_t)LUTRA_TENSOR_WRITTEN;
  if (E->optim) {
    lutra_optim_view v;
    TRY(lutra_optim_view_of(E->optim, &v, fn));
    v.args->step = E->host.step;
    /* the file's state is a step's end (a save inside a window is refused): the sums of a window
     * this optimizer had open belong to no step of it, and would be averaged into the next */
    *v.window = 0;
    if (lr) *v.lr = *lr;
  }
  if (o->rng) TRY(lutra_manual_seed(E->host.rng));
  /* a generator the file did not hold gets back the state read from it */
  for (int i = 0; i < E->nrng; i++)
    E->rng[i]->module->ops->checkpoint->rng_set(E->rng[i]->module, E->rng[i]->state);
  return LUTRA_OK;
}

int lutra_optim_steps(const lutra_optim *o, int64_t *host, int64_t *device) {
  static const char fn[] = "lutra_optim_steps";
  lutra_optim_view v;
  TRY(lutra_optim_view_of((lutra_optim *)o, &v, fn));
  if (host) *host = v.args->step;
  if (!device) return LUTRA_OK;
  if (!v.args->device_step) {
    *device = v.args->step;
    return LUTRA_OK;
  }
  int st = v.be->to_host(device, v.args->device_step, sizeof *device);
  return st == LUTRA_OK ? st : lutra_error_wrap(st, fn);
}
