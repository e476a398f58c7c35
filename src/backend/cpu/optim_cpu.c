/* SGD and AdamW steps on the CPU: the references of kernels/optim.cu, bit for bit (the kernels'
 * element updates round where these do). */
#include "cpu.h"

#include "backend/optim_math.h"

#include <math.h>

/* ---- optimizers ------------------------------------------------------------------------ */

/* Checks every tensor of the step before any is touched, so a refusal leaves all unchanged. */
static int check_optim(const lutra_optim_args *a, bool need_m, bool need_v, const char *fn) {
  CHECK_ARG(a != NULL, "arguments are NULL");
  CHECK_ARG(a->count >= 0, "negative tensor count %d", (int)a->count);
  if (a->count == 0) return LUTRA_OK;
  CHECK_ARG(a->value && a->value_dtype && a->grad && a->grad_dtype && a->numel,
            "value, value_dtype, grad, grad_dtype and numel must not be NULL");
  if (need_m) CHECK_ARG(a->m != NULL, "first-moment/momentum buffers (m) are NULL");
  if (need_v) CHECK_ARG(a->v != NULL, "second-moment buffers (v) are NULL");
  for (int32_t i = 0; i < a->count; i++) {
    CHECK_ARG(a->numel[i] >= 0, "tensor %d: negative element count %lld", (int)i,
              (long long)a->numel[i]);
    CHECK_ARG(lutra_cpu_float_dtype(a->value_dtype[i]),
              "tensor %d: unsupported value dtype %d (expected F32, BF16, F16)", (int)i,
              (int)a->value_dtype[i]);
    CHECK_ARG(a->grad_dtype[i] == LUTRA_F32 || a->grad_dtype[i] == a->value_dtype[i],
              "tensor %d: grad dtype %d must be F32 or the value dtype %d", (int)i,
              (int)a->grad_dtype[i], (int)a->value_dtype[i]);
    if (a->numel[i] == 0) continue;
    CHECK_ARG(a->value[i] && a->grad[i], "tensor %d: value or grad is NULL", (int)i);
    if (need_m) CHECK_ARG(a->m[i] != NULL, "tensor %d: m buffer is NULL", (int)i);
    if (need_v) CHECK_ARG(a->v[i] != NULL, "tensor %d: v buffer is NULL", (int)i);
  }
  return LUTRA_OK;
}

/* The factor the gradients are scaled by: 1 without clipping (and no multiply, see grad_at);
 * with it the sum of squares of every gradient element in double, tensor by tensor, stored in
 * a->clip[LUTRA_CLIP_SUMSQ] for lutra_optim_grad_norm. */
static float clip_factor(const lutra_optim_args *a) {
  if (!(a->max_grad_norm > 0.0f)) return 1.0f;
  double sumsq = 0.0;
  for (int32_t t = 0; t < a->count; t++)
    for (int64_t i = 0; i < a->numel[t]; i++) {
      const double g = lutra_elem_load(a->grad[t], a->grad_dtype[t], i);
      sumsq += g * g;
    }
  if (a->clip) a->clip[LUTRA_CLIP_SUMSQ] = sumsq;
  return lutra_clip_factor(sumsq, a->max_grad_norm);
}

static inline float grad_at(const void *grad, int dtype, int64_t i, bool clipping, float factor) {
  const float g = lutra_elem_load(grad, dtype, i);
  return clipping ? g * factor : g;
}

static inline bool decays(const lutra_optim_args *a, int32_t t) {
  return !a->decays || a->decays[t];
}

/* The step index of the lr: the host count (a direct SGD call may leave it 0: the first step). */
static int64_t step_of(const lutra_optim_args *a) {
  return a->step >= 1 ? a->step : 1;
}

int lutra_cpu_sgd_step(const lutra_optim_args *a) {
  static const char fn[] = "lutra_cpu_sgd_step";
  const bool momentum = a && a->momentum != 0.0f;
  TRY(check_optim(a, momentum, false, fn));
  const float lr = lutra_lr_at(&a->schedule, a->lr, step_of(a));
  const float mu = a->momentum;
  const bool clipping = a->max_grad_norm > 0.0f;
  const float factor = clip_factor(a);
  for (int32_t t = 0; t < a->count; t++) {
    const float wd = decays(a, t) ? a->weight_decay : 0.0f;
    const int64_t n = a->numel[t];
    void *value = a->value[t];
    const int vdt = a->value_dtype[t], gdt = a->grad_dtype[t];
    const void *grad = a->grad[t];
    float *master = a->master ? a->master[t] : NULL;
    float *mbuf = momentum ? a->m[t] : NULL;
    for (int64_t i = 0; i < n; i++) {
      float w = master ? master[i] : lutra_elem_load(value, vdt, i);
      float g = grad_at(grad, gdt, i, clipping, factor) + wd * w;
      if (mbuf) {
        mbuf[i] = mu * mbuf[i] + g;
        g = mbuf[i];
      }
      w -= lr * g;
      if (master) master[i] = w;
      lutra_elem_store(value, vdt, i, w);
    }
  }
  return LUTRA_OK;
}

int lutra_cpu_adamw_step(const lutra_optim_args *a) {
  static const char fn[] = "lutra_cpu_adamw_step";
  TRY(check_optim(a, true, true, fn));
  CHECK_ARG(a->step >= 1, "step must be >= 1 (1-based), got %lld", (long long)a->step);
  CHECK_ARG(a->beta1 >= 0.0f && a->beta1 < 1.0f && a->beta2 >= 0.0f && a->beta2 < 1.0f,
            "betas must be in [0, 1) (got %g, %g)", (double)a->beta1, (double)a->beta2);
  const float lr = lutra_lr_at(&a->schedule, a->lr, a->step);
  const float b1 = a->beta1, b2 = a->beta2, eps = a->eps;
  const float bc1 = (float)(1.0 - pow((double)b1, (double)a->step));
  const float bc2 = (float)(1.0 - pow((double)b2, (double)a->step));
  const bool clipping = a->max_grad_norm > 0.0f;
  const float factor = clip_factor(a);
  for (int32_t t = 0; t < a->count; t++) {
    const float decay = decays(a, t) ? lr * a->weight_decay : 0.0f;
    const int64_t n = a->numel[t];
    void *value = a->value[t];
    const int vdt = a->value_dtype[t], gdt = a->grad_dtype[t];
    const void *grad = a->grad[t];
    float *master = a->master ? a->master[t] : NULL;
    float *m = a->m[t], *v = a->v[t];
    for (int64_t i = 0; i < n; i++) {
      float w = master ? master[i] : lutra_elem_load(value, vdt, i);
      float g = grad_at(grad, gdt, i, clipping, factor);
      w -= decay * w;
      m[i] = b1 * m[i] + (1.0f - b1) * g;
      v[i] = b2 * v[i] + (1.0f - b2) * g * g;
      float mhat = m[i] / bc1, vhat = v[i] / bc2;
      w -= lr * mhat / (sqrtf(vhat) + eps);
      if (master) master[i] = w;
      lutra_elem_store(value, vdt, i, w);
    }
  }
  return LUTRA_OK;
}
