/* Activations (the tanh GELU and TransformerEngine's other kinds) and the bias gradient on the CPU:
 * the references of kernels/activation.cu. Plain loops over F32/BF16/F16 through
 * lutra_elem_load/store, math in f32, the bias gradient's column sums in double. */
#include "cpu.h"
#include "simd_cpu.h"

#include <dlfcn.h>
#include <math.h>

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

/* ---- the other kinds (TransformerEngine's activations) -------------------------------------
 * Each is the f32 operation sequence of kernels/activation_math.cuh, operation for operation:
 * ReLU and SquaredReLU are exact there; the sigmoid kinds go through expf, Tanh through tanhf and
 * expf and the erf GELU through erff, whose CUDA versions may differ from libm in the last bits. */

#define QGELU_K      1.702f
#define SQRT1_2      0.70710678118654752f /* 1 / sqrt 2 */
#define INV_SQRT_2PI 0.39894228040143268f /* 1 / sqrt(2 pi) */

static inline float relu(float x) {
  return x > 0.0f ? x : 0.0f;
}
static inline float relu_grad(float x) {
  return x > 0.0f ? 1.0f : 0.0f;
}

/* x sigmoid(k x) = x / (1 + e), e = exp(-k x); k = 1 for SiLU, 1.702 for QuickGELU */
static inline float sig_act(float x, float k) {
  return x / (1.0f + expf(-k * x));
}
/* d/dx = s + k x s (1 - s), s = 1 / (1 + e), 1 - s = e s; the tails as gelu_grad's */
static inline float sig_act_grad(float x, float k) {
  float e = expf(-k * x);
  if (isinf(e)) return 0.0f;
  float s = 1.0f / (1.0f + e);
  float q = e * s * s;
  if (q == 0.0f) return s;
  return s + k * x * q;
}

static inline float srelu(float x) {
  return x > 0.0f ? x * x : 0.0f;
}
static inline float srelu_grad(float x) {
  return x > 0.0f ? 2.0f * x : 0.0f;
}

/* tanh(x): glibc's four-lane tanhf (libmvec, _ZGVbN4v_tanhf: at most 4 ulp from libm's tanhf
 * by glibc's table; several times faster than libm's, which dominated a Tanh policy's PPO
 * update) where the C library has it, found once at load, else libm's tanhf. Every CPU tanh forward
 * goes through it, one element as four lanes when alone, so the value of an element never depends
 * on the path (or on its neighbours). CUDA's tanhf may be a few ulps off either, as expf. */
#if defined(__x86_64__) && defined(__GLIBC__)
#include <immintrin.h>
typedef __m128 (*tanh4_fn)(__m128);
static tanh4_fn tanh4;
__attribute__((constructor)) static void find_libmvec(void) {
  void *lib = dlopen("libmvec.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib) tanh4 = (tanh4_fn)dlsym(lib, "_ZGVbN4v_tanhf");
}
static inline float tanh_act(float x) {
  return tanh4 ? _mm_cvtss_f32(tanh4(_mm_set1_ps(x))) : tanhf(x);
}
static void tanh_f32(const float *restrict x, float *restrict y, int64_t n) {
  int64_t i = 0;
  if (tanh4)
    for (; i + 4 <= n; i += 4)
      _mm_storeu_ps(y + i, tanh4(_mm_loadu_ps(x + i)));
  for (; i < n; i++)
    y[i] = tanh_act(x[i]);
}
#else
static inline float tanh_act(float x) {
  return tanhf(x);
}
static void tanh_f32(const float *restrict x, float *restrict y, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    y[i] = tanhf(x[i]);
}
#endif
/* its derivative 1 - tanh(x)^2 = 4 e / (1 + e)^2, e = exp(-2 |x|), = 4 e s^2 with
 * s = 1 / (1 + e): from x, as the other kinds, and without the cancellation in 1 - t^2 that
 * leaves the tails no digits (e <= 1, so no overflow; e = 0 far out gives 0) */
static inline float tanh_grad(float x) {
  const float e = expf(-2.0f * fabsf(x));
  const float s = 1.0f / (1.0f + e);
  return 4.0f * e * s * s;
}

static inline float gelu_erf(float x) {
  return 0.5f * x * (1.0f + erff(x * SQRT1_2));
}
/* Phi(x) + x phi(x) */
static inline float gelu_erf_grad(float x) {
  return 0.5f * (1.0f + erff(x * SQRT1_2)) + x * (INV_SQRT_2PI * expf(-0.5f * x * x));
}

/* the element function of kind act (the gate's for gated kinds) and its derivative */
static float act_f(int act, float x) {
  switch (act) {
  case LUTRA_ACT_GELU_TANH:
  case LUTRA_ACT_GEGLU:
    return gelu(x);
  case LUTRA_ACT_RELU:
  case LUTRA_ACT_REGLU:
    return relu(x);
  case LUTRA_ACT_SILU:
  case LUTRA_ACT_SWIGLU:
    return sig_act(x, 1.0f);
  case LUTRA_ACT_QGELU:
    return sig_act(x, QGELU_K);
  case LUTRA_ACT_SRELU:
    return srelu(x);
  case LUTRA_ACT_TANH:
    return tanh_act(x);
  default:
    return gelu_erf(x);
  }
}

static float act_df(int act, float x) {
  switch (act) {
  case LUTRA_ACT_GELU_TANH:
  case LUTRA_ACT_GEGLU:
    return gelu_grad(x);
  case LUTRA_ACT_RELU:
  case LUTRA_ACT_REGLU:
    return relu_grad(x);
  case LUTRA_ACT_SILU:
  case LUTRA_ACT_SWIGLU:
    return sig_act_grad(x, 1.0f);
  case LUTRA_ACT_QGELU:
    return sig_act_grad(x, QGELU_K);
  case LUTRA_ACT_SRELU:
    return srelu_grad(x);
  case LUTRA_ACT_TANH:
    return tanh_grad(x);
  default:
    return gelu_erf_grad(x);
  }
}

/* An f32 element-wise forward with the kind chosen once, outside the loop: the same functions
 * (so the same values), but a loop per kind that the compiler inlines and vectorizes where it can
 * (ReLU, SquaredReLU), instead of a call and a dtype and kind switch per element (a small
 * policy's inference forward spent a third of its time there). */
#define ACT_LOOP(expr)                                                                             \
  for (int64_t i = 0; i < n; i++) {                                                                \
    const float v = x[i];                                                                          \
    y[i] = (expr);                                                                                 \
  }                                                                                                \
  return LUTRA_OK
/* ReLU four lanes at a time: the bits of x where x > 0, else +0 (NaN: +0), as relu() gives; one
 * at a time, gcc's compare and branch per element mispredicts on signs that look random */
static void relu_f32(const float *restrict x, float *restrict y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    lutra_f32x4 v = lutra_f32x4_load(x + i);
    lutra_i32x4 bits;
    memcpy(&bits, &v, sizeof bits);
    bits &= v > (lutra_f32x4){0.0f, 0.0f, 0.0f, 0.0f};
    memcpy(&v, &bits, sizeof v);
    lutra_f32x4_store(y + i, v);
  }
  for (; i < n; i++)
    y[i] = relu(x[i]);
}

static int act_forward_f32(int act, const float *restrict x, float *restrict y, int64_t n) {
  switch (act) {
  case LUTRA_ACT_GELU_TANH:
    ACT_LOOP(gelu(v));
  case LUTRA_ACT_RELU:
    relu_f32(x, y, n);
    return LUTRA_OK;
  case LUTRA_ACT_SILU:
    ACT_LOOP(sig_act(v, 1.0f));
  case LUTRA_ACT_QGELU:
    ACT_LOOP(sig_act(v, QGELU_K));
  case LUTRA_ACT_SRELU:
    ACT_LOOP(srelu(v));
  case LUTRA_ACT_TANH:
    tanh_f32(x, y, n);
    return LUTRA_OK;
  default:
    ACT_LOOP(gelu_erf(v));
  }
}
#undef ACT_LOOP

/* The f32 backward, dx = dy act'(x), with the kind chosen once, as the forward's loops: the same
 * functions, without a call and two dtype switches per element. */
#define DACT_LOOP(expr)                                                                            \
  for (int64_t i = 0; i < n; i++) {                                                                \
    const float v = x[i];                                                                          \
    dx[i] = dy[i] * (expr);                                                                        \
  }                                                                                                \
  return LUTRA_OK
static int act_backward_f32(int act, const float *restrict x, const float *restrict dy,
                            float *restrict dx, int64_t n) {
  switch (act) {
  case LUTRA_ACT_GELU_TANH:
    DACT_LOOP(gelu_grad(v));
  case LUTRA_ACT_RELU:
    DACT_LOOP(relu_grad(v));
  case LUTRA_ACT_SILU:
    DACT_LOOP(sig_act_grad(v, 1.0f));
  case LUTRA_ACT_QGELU:
    DACT_LOOP(sig_act_grad(v, QGELU_K));
  case LUTRA_ACT_SRELU:
    DACT_LOOP(srelu_grad(v));
  case LUTRA_ACT_TANH:
    DACT_LOOP(tanh_grad(v));
  default:
    DACT_LOOP(gelu_erf_grad(v));
  }
}
#undef DACT_LOOP

/* The checks both directions share; unknown kinds are refused before any buffer is looked at. */
static int check_act(const lutra_act_args *a, bool backward, const char *fn) {
  CHECK_ARG(a != NULL, "arguments are NULL");
  if (a->act <= LUTRA_ACT_NONE || a->act >= LUTRA_ACT_COUNT)
    return lutra_error(LUTRA_EINVAL, fn, "unknown activation kind %d (expected 1..%d)", (int)a->act,
                       LUTRA_ACT_COUNT - 1);
  CHECK_FLOAT_DTYPE(a->dtype, "tensor");
  int64_t n = a->n;
  if (lutra_act_is_gated(a->act)) {
    CHECK_ARG(a->rows >= 0 && a->cols >= 0, "negative shape [%lld, %lld]", (long long)a->rows,
              (long long)a->cols);
    CHECK_ARG(a->cols % 2 == 0,
              "gated activation input [%lld, %lld]: the last dim must be even (2h)",
              (long long)a->rows, (long long)a->cols);
    n = a->rows * a->cols;
  }
  CHECK_ARG(n >= 0, "negative element count %lld", (long long)n);
  if (backward)
    CHECK_ARG(n == 0 || (a->x && a->dy && a->out), "x, dy and dx must not be NULL");
  else
    CHECK_ARG(n == 0 || (a->x && a->out), "x and y must not be NULL");
  return LUTRA_OK;
}

int lutra_cpu_activation_forward(const lutra_act_args *a) {
  static const char fn[] = "lutra_cpu_activation_forward";
  TRY(check_act(a, false, fn));
  const void *x = a->x;
  void *y = a->out;
  const int dtype = a->dtype, act = a->act;
  if (lutra_act_is_gated(act)) {
    const int64_t h = a->cols / 2;
    for (int64_t r = 0; r < a->rows; r++)
      for (int64_t j = 0; j < h; j++) {
        float g = lutra_elem_load(x, dtype, r * a->cols + j);
        float b = lutra_elem_load(x, dtype, r * a->cols + h + j);
        lutra_elem_store(y, dtype, r * h + j, act_f(act, g) * b);
      }
    return LUTRA_OK;
  }
  if (dtype == LUTRA_F32) return act_forward_f32(act, x, y, a->n);
  for (int64_t i = 0; i < a->n; i++)
    lutra_elem_store(y, dtype, i, act_f(act, lutra_elem_load(x, dtype, i)));
  return LUTRA_OK;
}

int lutra_cpu_activation_backward(const lutra_act_args *a) {
  static const char fn[] = "lutra_cpu_activation_backward";
  TRY(check_act(a, true, fn));
  const void *x = a->x, *dy = a->dy;
  void *dx = a->out;
  const int dtype = a->dtype, act = a->act;
  if (lutra_act_is_gated(act)) {
    const int64_t h = a->cols / 2;
    for (int64_t r = 0; r < a->rows; r++)
      for (int64_t j = 0; j < h; j++) {
        const int64_t ia = r * a->cols + j, ib = ia + h;
        float g = lutra_elem_load(x, dtype, ia), b = lutra_elem_load(x, dtype, ib);
        float d = lutra_elem_load(dy, dtype, r * h + j);
        lutra_elem_store(dx, dtype, ia, d * b * act_df(act, g));
        lutra_elem_store(dx, dtype, ib, d * act_f(act, g));
      }
    return LUTRA_OK;
  }
  if (dtype == LUTRA_F32) return act_backward_f32(act, x, dy, dx, a->n);
  for (int64_t i = 0; i < a->n; i++) {
    float xi = lutra_elem_load(x, dtype, i), gi = lutra_elem_load(dy, dtype, i);
    lutra_elem_store(dx, dtype, i, gi * act_df(act, xi));
  }
  return LUTRA_OK;
}

/* ---- an activation inside a cast (lutra_quant_args.act_kind) ----------------------------- */

/* v as the activation kernels store it in dtype, read back as f32 */
static inline float round_to(int dtype, float v) {
  if (dtype == LUTRA_F32) return v;
  uint16_t h;
  lutra_elem_store(&h, dtype, 0, v);
  return lutra_elem_load(&h, dtype, 0);
}

int lutra_cpu_act_matrix(const lutra_quant_args *a, float *out) {
  static const char fn[] = "lutra_cpu_act_matrix";
  const int act = a->act_kind ? a->act_kind : LUTRA_ACT_GELU_TANH, dtype = a->x_dtype;
  if (act <= LUTRA_ACT_NONE || act >= LUTRA_ACT_COUNT)
    return lutra_error(LUTRA_EINVAL, fn, "unknown activation kind %d (expected 1..%d)", act,
                       LUTRA_ACT_COUNT - 1);
  const bool gated = lutra_act_is_gated(act), fwd = a->act_forward != 0;
  const int64_t rows = a->rows, cols = a->cols;
  CHECK_ARG(!gated || fwd || cols % 2 == 0,
            "a gated activation's input gradient [%lld, %lld] needs an even last dim",
            (long long)rows, (long long)cols);
  CHECK_ARG(rows * cols == 0 || (a->act && (fwd || a->x)),
            "the activation's input (and, backward, its output gradient) must not be NULL");
  const void *p = a->act, *dy = a->x;
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t c = 0; c < cols; c++) {
      float v;
      if (!gated) {
        const float x = lutra_elem_load(p, dtype, r * cols + c);
        v = fwd ? act_f(act, x) : lutra_elem_load(dy, dtype, r * cols + c) * act_df(act, x);
      } else if (fwd) { /* pre [rows, 2 cols]: gate a, linear b */
        const float g = lutra_elem_load(p, dtype, r * 2 * cols + c);
        const float b = lutra_elem_load(p, dtype, r * 2 * cols + cols + c);
        v = act_f(act, g) * b;
      } else { /* pre [rows, cols], dy [rows, cols / 2] */
        const int64_t h = cols / 2, j = c < h ? c : c - h;
        const float g = lutra_elem_load(p, dtype, r * cols + j);
        const float d = lutra_elem_load(dy, dtype, r * h + j);
        v = c < h ? d * lutra_elem_load(p, dtype, r * cols + h + j) * act_df(act, g)
                  : d * act_f(act, g);
      }
      out[r * cols + c] = round_to(dtype, v);
    }
  }
  return LUTRA_OK;
}

/* ---- bias gradient --------------------------------------------------------------------- */

enum { BIAS_CHUNK = 256 };

int lutra_cpu_bias_grad(const lutra_bias_grad_args *a) {
  static const char fn[] = "lutra_cpu_bias_grad";
  CHECK_ARG(a != NULL, "arguments are NULL");
  const void *dy = a->dy;
  void *db = a->db;
  const int dtype = a->dtype, db_dtype = a->db_dtype, accumulate = a->accumulate;
  const int64_t rows = a->rows, cols = a->cols;
  CHECK_FLOAT_DTYPE(dtype, "dy");
  CHECK_FLOAT_DTYPE(db_dtype, "db");
  CHECK_ARG(rows >= 0 && cols >= 0, "negative shape [%lld, %lld]", (long long)rows,
            (long long)cols);
  CHECK_ARG(cols == 0 || db, "db must not be NULL");
  CHECK_ARG(rows == 0 || cols == 0 || dy, "dy must not be NULL");
  /* after the checks, as on CUDA, whose host side cannot read the flag */
  if (a->skip && *a->skip) return LUTRA_OK;
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
