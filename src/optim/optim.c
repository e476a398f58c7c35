/* Optimizers: the parameter list, master weights and moments are gathered once at creation,
 * so a step is one backend call over all tensors with no lookups.
 *
 * AdamW's step count: args.step on the host (the CPU's bias corrections read it), and for a
 * device backend also a counter in device memory (args.device_step) that the step's kernel reads
 * and advances itself, so that a CUDA graph which captured a step takes the next step at every
 * replay. Eagerly both advance together; a capture advances only the host count (the captured
 * kernel runs at replays), so the host count is a count of step calls, the device one of steps
 * run. A device backend keeps the counter for SGD too: its scheduled lr reads it.
 *
 * The schedule, clipping and decay groups are applied inside the backend's step (the lr computed
 * from the step count where the step runs, the gradient norm reduced in backend memory), so a
 * step is one backend call with no host read, capturable as a whole. */
#include "backend/backend.h"
#include "backend/device.h"
#include "backend/optim_math.h"
#include "core/error.h"
#include "core/object.h"
#include "nn/module.h"
#include "optim/grad_accum.h"
#include "optim/optim_state.h"
#include "parallel/group.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct lutra_optim {
  lutra_object obj;
  lutra_optim_desc desc;
  lutra_module *module; /* retained: the parameters live in it */
  const lutra_backend *be;
  lutra_optim_args args;
  void **buffers; /* backend allocations behind master, m, v and the device step counter */
  int nbuffers;
  /* [i]: the parameter whose f32 master is args.master[i] (NULL: none), watched for writes made
   * through the API, which must reach the master before the next step or be overwritten by it */
  lutra_tensor **mastered;
  /* [i]: parameter i, marked LUTRA_TENSOR_UPDATED by every step (a module's cached FP8 copy of it
   * is stale from then: what ends a gradient-accumulation window, lutra/checkpoint.h) */
  lutra_tensor **params;
  /* the data-parallel sync a step last checked for its gradients (parallel/group.h) */
  lutra_dist_settle_cache settle;
  uint8_t *decays;        /* args.decays: [i] 1 when parameter i takes weight decay */
  lutra_grad_accum accum; /* lutra_optim_accumulate's sums */
};

void lutra_optim_defaults(int kind, lutra_optim_desc *d) {
  if (!d) return;
  memset(d, 0, sizeof *d);
  d->kind = kind;
  d->lr = kind == LUTRA_OPTIM_ADAMW ? 1e-3f : 1e-2f;
  d->weight_decay = kind == LUTRA_OPTIM_ADAMW ? 1e-2f : 0.0f;
  d->beta1 = 0.9f;
  d->beta2 = 0.999f;
  d->eps = 1e-8f;
}

int lutra_lr_schedule_check(const lutra_lr_schedule *s, const char *fn, const char *context) {
  CHECK_ARG(s->kind == LUTRA_LR_CONSTANT || s->kind == LUTRA_LR_WARMUP_COSINE ||
                s->kind == LUTRA_LR_WARMUP_LINEAR,
            "%sunknown schedule kind %d (expected constant, warmup_cosine or warmup_linear)",
            context, (int)s->kind);
  CHECK_ARG(s->warmup_steps >= 0, "%swarmup_steps must be >= 0, got %lld", context,
            (long long)s->warmup_steps);
  CHECK_ARG(s->kind == LUTRA_LR_CONSTANT || s->total_steps >= s->warmup_steps,
            "%stotal_steps (%lld) must be >= warmup_steps (%lld)", context,
            (long long)s->total_steps, (long long)s->warmup_steps);
  CHECK_ARG(isfinite(s->min_lr) && s->min_lr >= 0, "%smin_lr must be finite and >= 0, got %g",
            context, (double)s->min_lr);
  return LUTRA_OK;
}

static int check_desc(const lutra_optim_desc *d, const char *fn) {
  CHECK_ARG(d->kind == LUTRA_OPTIM_SGD || d->kind == LUTRA_OPTIM_ADAMW,
            "unknown optimizer kind %d (expected sgd or adamw)", d->kind);
  CHECK_ARG(isfinite(d->lr) && d->lr >= 0, "lr must be finite and >= 0");
  CHECK_ARG(isfinite(d->weight_decay) && d->weight_decay >= 0,
            "weight_decay must be finite and >= 0");
  CHECK_ARG(d->momentum >= 0 && d->momentum < 1, "momentum must be in [0, 1)");
  CHECK_ARG(d->beta1 >= 0 && d->beta1 < 1 && d->beta2 >= 0 && d->beta2 < 1,
            "beta1 and beta2 must be in [0, 1)");
  CHECK_ARG(d->eps > 0 && isfinite(d->eps), "eps must be finite and > 0");
  CHECK_ARG(d->max_grad_norm >= 0, "max_grad_norm must be >= 0 (0: no clipping), got %g",
            (double)d->max_grad_norm);
  CHECK_ARG(d->decay == LUTRA_DECAY_ALL || d->decay == LUTRA_DECAY_MATRICES,
            "unknown decay rule %d (expected LUTRA_DECAY_ALL or LUTRA_DECAY_MATRICES)",
            (int)d->decay);
  return lutra_lr_schedule_check(&d->schedule, fn, "");
}

static void optim_buffers_free(lutra_optim *o) {
  for (int i = 0; i < o->nbuffers; i++)
    o->be->free(o->buffers[i]);
  free(o->buffers);
  free(o->args.value);
  free(o->args.value_dtype);
  free(o->args.grad);
  free(o->args.grad_dtype);
  free(o->args.master);
  free(o->mastered);
  free(o->params);
  free(o->decays);
  free(o->args.m);
  free(o->args.v);
  free(o->args.numel);
  memset(&o->args, 0, sizeof o->args);
  if (o->accum.be) lutra_grad_accum_free(&o->accum);
  o->buffers = NULL;
  o->mastered = NULL;
  o->params = NULL;
  o->decays = NULL;
  o->nbuffers = 0;
  if (o->module) lutra_module_unref(o->module);
  o->module = NULL;
}

/* A zeroed f32 buffer of n elements, or a copy of value converted to f32. */
static int state_buffer(lutra_optim *o, int64_t n, const lutra_tensor *init, float **out,
                        const char *fn) {
  void *p;
  if (o->be->alloc((size_t)n * 4, &p) != LUTRA_OK)
    return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate optimizer state");
  o->buffers[o->nbuffers++] = p;
  *out = p;
  if (init) return o->be->convert(init->data, init->dtype, p, LUTRA_F32, n);
  return o->be->memset(p, 0, (size_t)n * 4);
}

static int gather(lutra_optim *o, int count, const char *fn) {
  lutra_optim_args *a = &o->args;
  a->count = count;
  a->value = calloc((size_t)count, sizeof *a->value);
  a->value_dtype = calloc((size_t)count, sizeof *a->value_dtype);
  a->grad = calloc((size_t)count, sizeof *a->grad);
  a->grad_dtype = calloc((size_t)count, sizeof *a->grad_dtype);
  a->master = calloc((size_t)count, sizeof *a->master);
  o->mastered = calloc((size_t)count, sizeof *o->mastered);
  o->params = calloc((size_t)count, sizeof *o->params);
  a->m = calloc((size_t)count, sizeof *a->m);
  a->v = calloc((size_t)count, sizeof *a->v);
  a->numel = calloc((size_t)count, sizeof *a->numel);
  o->decays = calloc((size_t)count, 1);
  o->buffers = calloc((size_t)count * 3 + 2, sizeof *o->buffers);
  if (!a->value || !a->value_dtype || !a->grad || !a->grad_dtype || !a->master || !o->mastered ||
      !o->params || !a->m || !a->v || !a->numel || !o->decays || !o->buffers)
    return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate the parameter list");
  bool adamw = o->desc.kind == LUTRA_OPTIM_ADAMW;
  for (int i = 0; i < count; i++) {
    lutra_param p;
    TRY(o->module->ops->param(o->module, i, &p));
    lutra_tensor *g = p.main_grad ? p.main_grad : p.grad;
    CHECK_ARG(p.value->device == o->be->device, "parameters on different devices");
    a->value[i] = p.value->data;
    a->value_dtype[i] = p.value->dtype;
    a->grad[i] = g->data;
    a->grad_dtype[i] = g->dtype;
    a->numel[i] = p.value->numel;
    o->params[i] = p.value;
    o->decays[i] = o->desc.decay == LUTRA_DECAY_ALL || p.value->ndim >= 2;
    if (p.value->dtype != LUTRA_F32) {
      TRY(state_buffer(o, p.value->numel, p.value, &a->master[i], fn));
      o->mastered[i] = p.value;
      p.value->flags &= ~(uint32_t)LUTRA_TENSOR_WRITTEN;
    }
    if (adamw || o->desc.momentum != 0) TRY(state_buffer(o, p.value->numel, NULL, &a->m[i], fn));
    if (adamw) TRY(state_buffer(o, p.value->numel, NULL, &a->v[i], fn));
  }
  a->decays = o->decays;
  float *clip;
  TRY(state_buffer(o, LUTRA_CLIP_DOUBLES * 2, NULL, &clip, fn));
  a->clip = (double *)clip;
  if (o->be->device != LUTRA_CPU) {
    /* zeroed: 0 steps taken, no block arrived (int64 step | uint32 arrivals | pad) */
    float *counter;
    TRY(state_buffer(o, 4, NULL, &counter, fn));
    a->device_step = (int64_t *)counter;
    a->arrivals = (uint32_t *)(counter + 2);
  }
  return LUTRA_OK;
}

int lutra_optim_new(const lutra_optim_desc *d, lutra_module *m, lutra_optim **out) {
  static const char fn[] = "lutra_optim_new";
  CHECK_ARG(d, "desc is NULL");
  CHECK_ARG(out, "out is NULL");
  TRY(check_desc(d, fn));
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  int count = m->ops->num_params(m);
  CHECK_ARG(count > 0, "module %s has no parameters", m->ops->kind);
  lutra_param first;
  TRY(m->ops->param(m, 0, &first));
  const lutra_backend *be;
  TRY(lutra_backend_get(first.value->device, &be, fn));
  lutra_optim *o = calloc(1, sizeof *o);
  if (!o) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate an optimizer");
  o->obj.magic = LUTRA_MAGIC_OPTIM;
  o->obj.refs = 1;
  o->desc = *d;
  o->be = be;
  o->module = m;
  lutra_module_retain(m);
  int st = gather(o, count, fn);
  if (st != LUTRA_OK) {
    optim_buffers_free(o);
    free(o);
    return st;
  }
  *out = o;
  return LUTRA_OK;
}

int lutra_optim_unref(lutra_optim *o) {
  if (!o) return LUTRA_OK;
  optim_buffers_free(o);
  free(o);
  return LUTRA_OK;
}

int lutra_optim_destroy(lutra_optim *o) {
  static const char fn[] = "lutra_optim_destroy";
  TRY(lutra_check_object(o, LUTRA_MAGIC_OPTIM, fn, "optimizer"));
  optim_buffers_free(o);
  o->obj.flags |= LUTRA_OBJ_FREED;
  return LUTRA_OK;
}

int lutra_optim_step(lutra_optim *o) {
  static const char fn[] = "lutra_optim_step";
  TRY(lutra_check_object(o, LUTRA_MAGIC_OPTIM, fn, "optimizer"));
  CHECK_STATE(!(o->module->obj.flags & LUTRA_OBJ_FREED), "the optimized module was freed");
  lutra_optim_args *a = &o->args;
  /* a data-parallel average still running on these gradients ends first (lutra/dist.h) */
  TRY(lutra_dist_settle_grads(a->grad, a->count, &o->settle, fn));
  /* a parameter written through the API since the last step: its master follows the new value
   * (a host flag per parameter; no work when nothing was written) */
  for (int32_t i = 0; i < a->count; i++) {
    lutra_tensor *p = o->mastered[i];
    if (!p || !(p->flags & LUTRA_TENSOR_WRITTEN)) continue;
    TRY(o->be->convert(p->data, p->dtype, a->master[i], LUTRA_F32, p->numel));
    p->flags &= ~(uint32_t)LUTRA_TENSOR_WRITTEN;
  }
  a->lr = o->desc.lr;
  a->momentum = o->desc.momentum;
  a->weight_decay = o->desc.weight_decay;
  a->beta1 = o->desc.beta1;
  a->beta2 = o->desc.beta2;
  a->eps = o->desc.eps;
  a->schedule = o->desc.schedule;
  a->max_grad_norm = o->desc.max_grad_norm;
  /* an accumulation window: the step reads the mean of its sums instead of the gradients */
  const void **grads = a->grad;
  int32_t *grad_dtypes = a->grad_dtype;
  lutra_grad_accum *g = &o->accum;
  if (g->micro_batches > 0) {
    TRY(lutra_grad_accum_mean(g, a));
    a->grad = g->grad;
    a->grad_dtype = g->dtype;
  }
  a->step++;
  int st = o->desc.kind == LUTRA_OPTIM_ADAMW ? o->be->adamw_step(a) : o->be->sgd_step(a);
  a->grad = grads;
  a->grad_dtype = grad_dtypes;
  if (st != LUTRA_OK) {
    a->step--;
    return st;
  }
  g->micro_batches = 0;
  for (int32_t i = 0; i < a->count; i++)
    o->params[i]->flags |= LUTRA_TENSOR_UPDATED | LUTRA_TENSOR_REPACK;
  return LUTRA_OK;
}

int lutra_optim_accumulate(lutra_optim *o) {
  static const char fn[] = "lutra_optim_accumulate";
  TRY(lutra_check_object(o, LUTRA_MAGIC_OPTIM, fn, "optimizer"));
  CHECK_STATE(!(o->module->obj.flags & LUTRA_OBJ_FREED), "the optimized module was freed");
  lutra_optim_args *a = &o->args;
  TRY(lutra_dist_settle_grads(a->grad, a->count, &o->settle, fn));
  o->accum.be = o->be;
  return lutra_grad_accum_add(&o->accum, a, fn);
}

int lutra_optim_accumulated(const lutra_optim *o, int32_t *micro_batches) {
  static const char fn[] = "lutra_optim_accumulated";
  TRY(lutra_check_object(o, LUTRA_MAGIC_OPTIM, fn, "optimizer"));
  CHECK_ARG(micro_batches, "micro_batches is NULL");
  *micro_batches = o->accum.micro_batches;
  return LUTRA_OK;
}

int lutra_optim_set_lr(lutra_optim *o, float lr) {
  static const char fn[] = "lutra_optim_set_lr";
  TRY(lutra_check_object(o, LUTRA_MAGIC_OPTIM, fn, "optimizer"));
  CHECK_ARG(isfinite(lr) && lr >= 0, "lr must be finite and >= 0");
  o->desc.lr = lr;
  return LUTRA_OK;
}

int lutra_optim_set_schedule(lutra_optim *o, const lutra_lr_schedule *s) {
  static const char fn[] = "lutra_optim_set_schedule";
  TRY(lutra_check_object(o, LUTRA_MAGIC_OPTIM, fn, "optimizer"));
  CHECK_ARG(s, "schedule is NULL");
  TRY(lutra_lr_schedule_check(s, fn, ""));
  o->desc.schedule = *s;
  return LUTRA_OK;
}

int lutra_optim_set_max_grad_norm(lutra_optim *o, float max_grad_norm) {
  static const char fn[] = "lutra_optim_set_max_grad_norm";
  TRY(lutra_check_object(o, LUTRA_MAGIC_OPTIM, fn, "optimizer"));
  CHECK_ARG(max_grad_norm >= 0, "max_grad_norm must be >= 0 (0: no clipping), got %g",
            (double)max_grad_norm);
  o->desc.max_grad_norm = max_grad_norm;
  return LUTRA_OK;
}

/* The checks of the queries below; out: the caller's result pointer, named what. */
static int check_query(const lutra_optim *o, const void *out, const char *what, const char *fn) {
  TRY(lutra_check_object(o, LUTRA_MAGIC_OPTIM, fn, "optimizer"));
  CHECK_ARG(out, "%s is NULL", what);
  CHECK_STATE(o->args.clip, "the optimizer was freed");
  return LUTRA_OK;
}

/* n bytes of o's backend memory into host memory (a synchronizing read on a device) */
static int read_back(const lutra_optim *o, void *dst, const void *src, size_t n, const char *fn) {
  int st = o->be->to_host(dst, src, n);
  return st == LUTRA_OK ? st : lutra_error_wrap(st, fn);
}

int lutra_optim_lr(const lutra_optim *o, float *lr) {
  static const char fn[] = "lutra_optim_lr";
  TRY(check_query(o, lr, "lr", fn));
  /* the steps run: the device's count where there is one (a captured step's replays count) */
  int64_t done = o->args.step;
  if (o->args.device_step) TRY(read_back(o, &done, o->args.device_step, sizeof done, fn));
  *lr = lutra_lr_at(&o->desc.schedule, o->desc.lr, done + 1);
  return LUTRA_OK;
}

int lutra_optim_grad_norm(const lutra_optim *o, float *norm) {
  static const char fn[] = "lutra_optim_grad_norm";
  TRY(check_query(o, norm, "norm", fn));
  double sumsq;
  TRY(read_back(o, &sumsq, o->args.clip + LUTRA_CLIP_SUMSQ, sizeof sumsq, fn));
  *norm = (float)sqrt(sumsq);
  return LUTRA_OK;
}

int lutra_optim_view_of(lutra_optim *o, lutra_optim_view *v, const char *fn) {
  TRY(lutra_check_object(o, LUTRA_MAGIC_OPTIM, fn, "optimizer"));
  CHECK_STATE(!(o->module->obj.flags & LUTRA_OBJ_FREED), "the optimized module was freed");
  *v = (lutra_optim_view){.kind = o->desc.kind,
                          .lr = &o->desc.lr,
                          .schedule = &o->desc.schedule,
                          .max_grad_norm = &o->desc.max_grad_norm,
                          .desc = &o->desc,
                          .args = &o->args,
                          .mastered = o->mastered,
                          .accumulated = o->accum.micro_batches,
                          .window = &o->accum.micro_batches,
                          .module = o->module,
                          .be = o->be};
  return LUTRA_OK;
}
