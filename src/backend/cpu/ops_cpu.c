/* Activations, losses and optimizer steps on the CPU: plain loops over F32/BF16/F16 through
 * lutra_elem_load/store, math in f32, long reductions (loss means, bias grads) in double. */
#include "cpu.h"

#include <math.h>

static bool float_dtype_ok(int dtype) {
  return dtype == LUTRA_F32 || dtype == LUTRA_BF16 || dtype == LUTRA_F16;
}

#define CHECK_DTYPE(dtype, what)                                                                   \
  CHECK_ARG(float_dtype_ok(dtype), "unsupported %s dtype %d (expected F32, BF16, F16)", what,      \
            (int)(dtype))

/* ---- GELU (tanh approximation, as TransformerEngine) ------------------------------------- */

#define GELU_C 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* Evaluated through 0.5 (1 + tanh(u)) = 1 / (1 + e), e = exp(-2u): the same formula, without
 * the cancellation in 1 + tanh(u) that costs the negative tail its digits in f32. */
static inline float gelu_exp(float x) {
  return expf(-2.0f * GELU_C * (x + GELU_A * x * x * x));
}

static inline float gelu(float x) {
  return x / (1.0f + gelu_exp(x));
}

/* d/dx of 0.5 x (1 + tanh(u)), u = c (x + a x^3), t = tanh(u):
 *   0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2)
 * with s = 0.5 (1 + t) = 1 / (1 + e) and 0.5 (1 - t^2) = 2 s (1 - s) = 2 e s^2. */
static inline float gelu_grad(float x) {
  float e = gelu_exp(x);
  if (isinf(e)) return 0.0f; /* far negative tail */
  float s = 1.0f / (1.0f + e);
  float k = e * s * s;
  if (k == 0.0f) return s; /* far positive tail: skip 0 * inf for huge x */
  return s + 2.0f * k * x * GELU_C * (1.0f + 3.0f * GELU_A * x * x);
}

/* the same formulas for the GEMM epilogues (gemm_cpu.c) */
float lutra_cpu_gelu(float x) {
  return gelu(x);
}
float lutra_cpu_gelu_grad(float x) {
  return gelu_grad(x);
}

int lutra_cpu_gelu_forward(const void *x, void *y, int dtype, int64_t n) {
  static const char fn[] = "lutra_cpu_gelu_forward";
  CHECK_DTYPE(dtype, "tensor");
  CHECK_ARG(n >= 0, "negative element count %lld", (long long)n);
  CHECK_ARG(n == 0 || (x && y), "x and y must not be NULL");
  for (int64_t i = 0; i < n; i++)
    lutra_elem_store(y, dtype, i, gelu(lutra_elem_load(x, dtype, i)));
  return LUTRA_OK;
}

int lutra_cpu_gelu_grad_product(const void *x, const void *dy, int dtype, int64_t n, float *out) {
  static const char fn[] = "lutra_cpu_gelu_grad_product";
  CHECK_DTYPE(dtype, "tensor");
  CHECK_ARG(n >= 0, "negative element count %lld", (long long)n);
  CHECK_ARG(n == 0 || (x && dy && out), "x, dy and out must not be NULL");
  for (int64_t i = 0; i < n; i++)
    out[i] = lutra_elem_load(dy, dtype, i) * gelu_grad(lutra_elem_load(x, dtype, i));
  return LUTRA_OK;
}

int lutra_cpu_gelu_backward(const void *x, const void *dy, void *dx, int dtype, int64_t n) {
  static const char fn[] = "lutra_cpu_gelu_backward";
  CHECK_DTYPE(dtype, "tensor");
  CHECK_ARG(n >= 0, "negative element count %lld", (long long)n);
  CHECK_ARG(n == 0 || (x && dy && dx), "x, dy and dx must not be NULL");
  for (int64_t i = 0; i < n; i++) {
    float xi = lutra_elem_load(x, dtype, i), gi = lutra_elem_load(dy, dtype, i);
    lutra_elem_store(dx, dtype, i, gi * gelu_grad(xi));
  }
  return LUTRA_OK;
}

/* ---- bias gradient --------------------------------------------------------------------- */

enum { BIAS_CHUNK = 256 };

int lutra_cpu_bias_grad(const void *dy, int dtype, int64_t rows, int64_t cols, void *db,
                        int db_dtype, int accumulate) {
  static const char fn[] = "lutra_cpu_bias_grad";
  CHECK_DTYPE(dtype, "dy");
  CHECK_DTYPE(db_dtype, "db");
  CHECK_ARG(rows >= 0 && cols >= 0, "negative shape [%lld, %lld]", (long long)rows,
            (long long)cols);
  CHECK_ARG(cols == 0 || db, "db must not be NULL");
  CHECK_ARG(rows == 0 || cols == 0 || dy, "dy must not be NULL");
  /* column chunks, rows walked in order: no allocation, row-major access */
  double acc[BIAS_CHUNK];
  for (int64_t c0 = 0; c0 < cols; c0 += BIAS_CHUNK) {
    int64_t w = cols - c0 < BIAS_CHUNK ? cols - c0 : BIAS_CHUNK;
    for (int64_t j = 0; j < w; j++)
      acc[j] = accumulate ? lutra_elem_load(db, db_dtype, c0 + j) : 0.0;
    for (int64_t r = 0; r < rows; r++) {
      int64_t base = r * cols + c0;
      for (int64_t j = 0; j < w; j++)
        acc[j] += lutra_elem_load(dy, dtype, base + j);
    }
    for (int64_t j = 0; j < w; j++)
      lutra_elem_store(db, db_dtype, c0 + j, (float)acc[j]);
  }
  return LUTRA_OK;
}

/* ---- losses ---------------------------------------------------------------------------- */

int lutra_cpu_mse(const void *pred, const void *target, int dtype, int64_t n, float *loss,
                  void *dpred) {
  static const char fn[] = "lutra_cpu_mse";
  CHECK_DTYPE(dtype, "pred");
  CHECK_ARG(n > 0, "element count must be positive (got %lld)", (long long)n);
  CHECK_ARG(pred && target && loss, "pred, target and loss must not be NULL");
  double sum = 0.0;
  const float scale = 2.0f / (float)n;
  for (int64_t i = 0; i < n; i++) {
    float diff = lutra_elem_load(pred, dtype, i) - lutra_elem_load(target, dtype, i);
    sum += (double)diff * (double)diff;
    if (dpred) lutra_elem_store(dpred, dtype, i, scale * diff);
  }
  *loss = (float)(sum / (double)n);
  return LUTRA_OK;
}

int lutra_cpu_softmax_xent(const void *logits, int dtype, const int32_t *labels, int64_t rows,
                           int64_t cols, float *loss, void *dlogits) {
  static const char fn[] = "lutra_cpu_softmax_xent";
  CHECK_DTYPE(dtype, "logits");
  CHECK_ARG(rows > 0 && cols > 0, "shape must be positive (got [%lld, %lld])", (long long)rows,
            (long long)cols);
  CHECK_ARG(logits && labels && loss, "logits, labels and loss must not be NULL");
  for (int64_t r = 0; r < rows; r++)
    CHECK_ARG(labels[r] >= 0 && labels[r] < cols, "label %d at row %lld is out of range [0, %lld)",
              (int)labels[r], (long long)r, (long long)cols);
  double total = 0.0;
  const float inv_rows = 1.0f / (float)rows;
  for (int64_t r = 0; r < rows; r++) {
    int64_t base = r * cols;
    float mx = -INFINITY;
    for (int64_t j = 0; j < cols; j++) {
      float v = lutra_elem_load(logits, dtype, base + j);
      if (v > mx) mx = v;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < cols; j++)
      sum += (double)expf(lutra_elem_load(logits, dtype, base + j) - mx);
    float log_sum = (float)log(sum);
    float target = lutra_elem_load(logits, dtype, base + labels[r]); /* before dlogits is written */
    total += (double)(mx - target) + (double)log_sum;
    if (dlogits) {
      float inv_sum = (float)(1.0 / sum);
      for (int64_t j = 0; j < cols; j++) {
        float p = expf(lutra_elem_load(logits, dtype, base + j) - mx) * inv_sum;
        if (j == labels[r]) p -= 1.0f;
        lutra_elem_store(dlogits, dtype, base + j, p * inv_rows);
      }
    }
  }
  *loss = (float)(total / (double)rows);
  return LUTRA_OK;
}

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
    CHECK_ARG(float_dtype_ok(a->value_dtype[i]),
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

int lutra_cpu_sgd_step(const lutra_optim_args *a) {
  static const char fn[] = "lutra_cpu_sgd_step";
  const bool momentum = a && a->momentum != 0.0f;
  TRY(check_optim(a, momentum, false, fn));
  const float lr = a->lr, mu = a->momentum, wd = a->weight_decay;
  for (int32_t t = 0; t < a->count; t++) {
    const int64_t n = a->numel[t];
    void *value = a->value[t];
    const int vdt = a->value_dtype[t], gdt = a->grad_dtype[t];
    const void *grad = a->grad[t];
    float *master = a->master ? a->master[t] : NULL;
    float *mbuf = momentum ? a->m[t] : NULL;
    for (int64_t i = 0; i < n; i++) {
      float w = master ? master[i] : lutra_elem_load(value, vdt, i);
      float g = lutra_elem_load(grad, gdt, i) + wd * w;
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
  const float lr = a->lr, wd = a->weight_decay, b1 = a->beta1, b2 = a->beta2, eps = a->eps;
  const float bc1 = (float)(1.0 - pow((double)b1, (double)a->step));
  const float bc2 = (float)(1.0 - pow((double)b2, (double)a->step));
  const float decay = lr * wd;
  for (int32_t t = 0; t < a->count; t++) {
    const int64_t n = a->numel[t];
    void *value = a->value[t];
    const int vdt = a->value_dtype[t], gdt = a->grad_dtype[t];
    const void *grad = a->grad[t];
    float *master = a->master ? a->master[t] : NULL;
    float *m = a->m[t], *v = a->v[t];
    for (int64_t i = 0; i < n; i++) {
      float w = master ? master[i] : lutra_elem_load(value, vdt, i);
      float g = lutra_elem_load(grad, gdt, i);
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
