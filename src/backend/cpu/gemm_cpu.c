/* GEMM on the CPU: operands upcast to f32 in the caller's workspace, then one cblas_sgemm.
 *
 * D [m, n] = op(B) [m, k] @ op(A) [k, n] (+ bias [n] on every row) (+ D_old if accumulate) (+ C),
 * row-major, op(X) = X^T when X.trans. Operands are passed to BLAS in their stored layout with
 * the matching CblasTrans flag; nothing is transposed explicitly. Everything is computed in f32
 * and rounded once into D's dtype at the end. lutra_cpu_gemm never allocates: the plan says
 * how much workspace it needs (one 64-byte-rounded region per non-f32 operand, plus an f32
 * scratch for D when D is not f32).
 *
 * Epilogues (lutra_gemm_epilogue in lutra.h), the reference for every backend: applied to the
 * f32 result before its single rounding into D's dtype. GELU and GELU_AUX take gelu() of the
 * f32 pre-activation P + bias (aux receives that pre-activation, rounded once into its dtype);
 * DGELU multiplies the f32 result by gelu'(aux) (aux as stored); the bias gradients (the column
 * sums of the f32 DGELU result for DGELU_BGRAD, the k-sums of op(B) as stored for BGRADB) are
 * accumulated in double and rounded once into dbias's dtype, as lutra_cpu_bias_grad does. */
#include "cpu.h"
#include "simd_cpu.h"

#include <cblas.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

enum { WS_ALIGN = 64 };

static bool operand_dtype_ok(int dtype) {
  return dtype == LUTRA_F32 || dtype == LUTRA_BF16 || dtype == LUTRA_F16 || dtype == LUTRA_E4M3 ||
         dtype == LUTRA_E5M2 || dtype == LUTRA_E2M1;
}

/* bytes for `count` f32 values rounded up to WS_ALIGN; false on overflow */
static bool f32_region(int64_t rows, int64_t cols, size_t *bytes) {
  if (rows < 0 || cols < 0) return false;
  if (rows == 0 || cols == 0) {
    *bytes = 0;
    return true;
  }
  if ((uint64_t)rows > SIZE_MAX / 4 / (uint64_t)cols) return false;
  size_t b = (size_t)rows * (size_t)cols * 4;
  if (b > SIZE_MAX - (WS_ALIGN - 1)) return false;
  *bytes = (b + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN;
  return true;
}

/* Workspace bytes for a GEMM of this shape and these dtypes; false on overflow. */
static bool workspace_need(int64_t m, int64_t n, int64_t k, int a_dtype, int b_dtype, int d_dtype,
                           size_t *need) {
  size_t a = 0, b = 0, d = 0;
  if (a_dtype != LUTRA_F32 && !f32_region(k, n, &a)) return false;
  if (b_dtype != LUTRA_F32 && !f32_region(m, k, &b)) return false;
  if (d_dtype != LUTRA_F32 && !f32_region(m, n, &d)) return false;
  if (a > SIZE_MAX - b || a + b > SIZE_MAX - d) return false;
  *need = a + b + d;
  return true;
}

int lutra_cpu_gemm_plan(lutra_gemm_plan *p) {
  static const char fn[] = "lutra_cpu_gemm_plan";
  CHECK_ARG(p != NULL, "plan is NULL");
  const lutra_gemm_key *key = &p->key;
  CHECK_ARG(key->m >= 0 && key->n >= 0 && key->k >= 0,
            "negative GEMM dimensions (m=%lld, n=%lld, k=%lld)", (long long)key->m,
            (long long)key->n, (long long)key->k);
  CHECK_ARG(operand_dtype_ok(key->a_dtype), "unsupported dtype %d for operand A",
            (int)key->a_dtype);
  CHECK_ARG(operand_dtype_ok(key->b_dtype), "unsupported dtype %d for operand B",
            (int)key->b_dtype);
  CHECK_ARG(lutra_cpu_float_dtype(key->d_dtype),
            "unsupported dtype %d for D (expected F32, BF16, F16)", (int)key->d_dtype);
  CHECK_ARG(key->bias_dtype == -1 || lutra_cpu_float_dtype(key->bias_dtype),
            "unsupported bias dtype %d (expected F32, BF16, F16, or -1 for no bias)",
            (int)key->bias_dtype);
  CHECK_ARG(key->epilogue >= 0 && key->epilogue < LUTRA_NUM_EPILOGUES, "unknown epilogue %d",
            (int)key->epilogue);
  CHECK_ARG(key->aux_dtype == -1 || lutra_cpu_float_dtype(key->aux_dtype),
            "unsupported aux dtype %d (expected F32, BF16, F16, or -1 for no aux)",
            (int)key->aux_dtype);
  CHECK_ARG(key->dbias_dtype == -1 || lutra_cpu_float_dtype(key->dbias_dtype),
            "unsupported dbias dtype %d (expected F32, BF16, F16, or -1 for no dbias)",
            (int)key->dbias_dtype);
  size_t need;
  CHECK_ARG(workspace_need(key->m, key->n, key->k, key->a_dtype, key->b_dtype, key->d_dtype, &need),
            "workspace size overflows for m=%lld, n=%lld, k=%lld", (long long)key->m,
            (long long)key->n, (long long)key->k);
  p->workspace_bytes = need;
  p->backend_plan = NULL;
  return LUTRA_OK;
}

void lutra_cpu_gemm_plan_free(lutra_gemm_plan *p) {
  if (p) p->backend_plan = NULL; /* nothing is held on the CPU */
}

/* Checks one operand against the [rows, cols] that op(X) needs: op(X) is [want_r, want_c]. */
static int check_operand(const lutra_gemm_operand *x, const char *name, int64_t want_r,
                         int64_t want_c, const char *fn) {
  if (!operand_dtype_ok(x->dtype))
    return lutra_error(
        LUTRA_EINVAL, fn,
        "unsupported dtype %d for operand %s (expected F32, BF16, F16, E4M3, E5M2, E2M1)",
        (int)x->dtype, name);
  int64_t r = x->trans ? x->cols : x->rows, c = x->trans ? x->rows : x->cols;
  if (r != want_r || c != want_c)
    return lutra_error(
        LUTRA_EINVAL, fn,
        "operand %s is stored [%lld, %lld] with trans=%d, so op(%s) is [%lld, %lld]; "
        "expected [%lld, %lld]",
        name, (long long)x->rows, (long long)x->cols, (int)(x->trans != 0), name, (long long)r,
        (long long)c, (long long)want_r, (long long)want_c);
  if (x->rows > 0 && x->cols > 0 && x->data == NULL)
    return lutra_error(LUTRA_EINVAL, fn, "operand %s has no data", name);
  if (lutra_dtype_is_quantized(x->dtype) && x->rows > 0 && x->cols > 0) {
    if (x->scaling == LUTRA_SCALING_NONE)
      return lutra_error(LUTRA_EINVAL, fn, "FP8 operand %s has no scaling mode", name);
    if (x->scale_inv == NULL)
      return lutra_error(LUTRA_EINVAL, fn, "FP8 operand %s has no scale_inv", name);
  }
  return LUTRA_OK;
}

/* Upcasts operand x into dst (f32, stored layout), or returns its own data when already f32. */
static int upcast(const lutra_gemm_operand *x, float *dst, const float **out) {
  int64_t count = x->rows * x->cols;
  if (x->dtype == LUTRA_F32) {
    *out = x->data;
    return LUTRA_OK;
  }
  if (lutra_dtype_is_quantized(x->dtype)) {
    lutra_dequant_args d;
    memset(&d, 0, sizeof d);
    d.data = x->data;
    d.scale_inv = x->scale_inv;
    d.dtype = x->dtype;
    d.scaling = x->scaling;
    d.rows = x->rows;
    d.cols = x->cols;
    d.out = dst;
    d.out_dtype = LUTRA_F32;
    TRY(lutra_cpu_dequantize(&d));
    /* NVFP4 on Hopper runs as a BF16 GEMM of the dequantized operands (lutra/nvfp4.h): the
     * same BF16 values here (MXFP8 and FP8 dequantize to BF16 exactly, so they need no step) */
    if (x->dtype == LUTRA_E2M1)
      for (int64_t i = 0; i < count; i++)
        dst[i] = bf16_to_f32(f32_to_bf16(dst[i]));
  } else {
    for (int64_t i = 0; i < count; i++)
      dst[i] = lutra_elem_load(x->data, x->dtype, i);
  }
  *out = dst;
  return LUTRA_OK;
}

/* Checks the epilogue's buffers (the front has checked shapes, devices and combinations). */
static int check_epilogue(const lutra_gemm_args *g, const char *fn) {
  const int e = g->epilogue;
  CHECK_ARG(e >= 0 && e < LUTRA_NUM_EPILOGUES, "unknown epilogue %d", e);
  const bool aux =
      e == LUTRA_EPILOGUE_GELU_AUX || e == LUTRA_EPILOGUE_DGELU || e == LUTRA_EPILOGUE_DGELU_BGRAD;
  const bool dbias = e == LUTRA_EPILOGUE_DGELU_BGRAD || e == LUTRA_EPILOGUE_BGRADB;
  const int64_t mn = g->m * g->n, nb = e == LUTRA_EPILOGUE_BGRADB ? g->m : g->n;
  if (aux) {
    CHECK_ARG(g->aux_dtype == g->d_dtype, "aux dtype %d differs from D's %d", (int)g->aux_dtype,
              (int)g->d_dtype);
    CHECK_ARG(g->aux != NULL || mn == 0, "epilogue %d needs aux", e);
  }
  if (dbias) {
    CHECK_ARG(lutra_cpu_float_dtype(g->dbias_dtype),
              "unsupported dbias dtype %d (expected F32, BF16, F16)", (int)g->dbias_dtype);
    CHECK_ARG(g->dbias != NULL || nb == 0, "epilogue %d needs dbias", e);
  }
  CHECK_ARG(!(e == LUTRA_EPILOGUE_BGRADB && !lutra_cpu_float_dtype(g->b.dtype)),
            "BGRADB sums operand B, which must be F32, BF16 or F16");
  return LUTRA_OK;
}

/* BGRADB: dbias[i] = sum_k op(B)[i, k], from B as stored ([m, k], or [k, m] when transposed) */
static int bgradb(const lutra_gemm_args *g) {
  if (g->b.trans)
    return lutra_cpu_bias_grad(&(lutra_bias_grad_args){.dy = g->b.data,
                                                       .dtype = g->b.dtype,
                                                       .rows = g->k,
                                                       .cols = g->m,
                                                       .db = g->dbias,
                                                       .db_dtype = g->dbias_dtype});
  for (int64_t i = 0; i < g->m; i++) {
    double acc = 0.0;
    for (int64_t c = 0; c < g->k; c++)
      acc += lutra_elem_load(g->b.data, g->b.dtype, i * g->k + c);
    lutra_elem_store(g->dbias, g->dbias_dtype, i, (float)acc);
  }
  return LUTRA_OK;
}

/* GELU, GELU_AUX, DGELU, DGELU_BGRAD on the f32 result df [m, n] (bias already added) */
static int apply_epilogue(const lutra_gemm_args *g, float *df) {
  const int64_t mn = g->m * g->n;
  switch (g->epilogue) {
  case LUTRA_EPILOGUE_GELU:
    for (int64_t i = 0; i < mn; i++)
      df[i] = lutra_cpu_gelu(df[i]);
    return LUTRA_OK;
  case LUTRA_EPILOGUE_GELU_AUX:
    for (int64_t i = 0; i < mn; i++) {
      lutra_elem_store(g->aux, g->aux_dtype, i, df[i]);
      df[i] = lutra_cpu_gelu(df[i]);
    }
    return LUTRA_OK;
  case LUTRA_EPILOGUE_DGELU:
  case LUTRA_EPILOGUE_DGELU_BGRAD:
    for (int64_t i = 0; i < mn; i++)
      df[i] = df[i] * lutra_cpu_gelu_grad(lutra_elem_load(g->aux, g->aux_dtype, i));
    if (g->epilogue == LUTRA_EPILOGUE_DGELU_BGRAD)
      return lutra_cpu_bias_grad(&(lutra_bias_grad_args){.dy = df,
                                                         .dtype = LUTRA_F32,
                                                         .rows = g->m,
                                                         .cols = g->n,
                                                         .db = g->dbias,
                                                         .db_dtype = g->dbias_dtype});
    return LUTRA_OK;
  default:
    return LUTRA_OK;
  }
}

int lutra_cpu_gemm(const lutra_gemm_args *g) {
  static const char fn[] = "lutra_cpu_gemm";
  CHECK_ARG(g != NULL, "arguments are NULL");
  const int64_t m = g->m, n = g->n, k = g->k;
  CHECK_ARG(m >= 0 && n >= 0 && k >= 0, "negative GEMM dimensions (m=%lld, n=%lld, k=%lld)",
            (long long)m, (long long)n, (long long)k);
  /* op(B) is [m, k], op(A) is [k, n] */
  TRY(check_operand(&g->a, "A", k, n, fn));
  TRY(check_operand(&g->b, "B", m, k, fn));
  CHECK_ARG(lutra_cpu_float_dtype(g->d_dtype),
            "unsupported dtype %d for D (expected F32, BF16, F16)", (int)g->d_dtype);
  CHECK_ARG(g->d != NULL || m == 0 || n == 0, "D is NULL");
  CHECK_ARG(g->bias == NULL || lutra_cpu_float_dtype(g->bias_dtype),
            "unsupported bias dtype %d (expected F32, BF16, F16)", (int)g->bias_dtype);
  TRY(check_epilogue(g, fn));
  CHECK_ARG(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX,
            "dimensions m=%lld, n=%lld, k=%lld exceed the BLAS integer range", (long long)m,
            (long long)n, (long long)k);
  CHECK_ARG(g->a.cols <= INT_MAX && g->b.cols <= INT_MAX,
            "leading dimensions exceed the BLAS integer range");

  size_t need;
  CHECK_ARG(workspace_need(m, n, k, g->a.dtype, g->b.dtype, g->d_dtype, &need),
            "workspace size overflows for m=%lld, n=%lld, k=%lld", (long long)m, (long long)n,
            (long long)k);
  if (g->plan) {
    const lutra_gemm_key *key = &g->plan->key;
    CHECK_ARG(key->m == m && key->n == n && key->k == k && key->a_dtype == g->a.dtype &&
                  key->b_dtype == g->b.dtype && key->d_dtype == g->d_dtype,
              "plan (m=%lld, n=%lld, k=%lld) does not match the arguments (m=%lld, n=%lld, "
              "k=%lld) or their dtypes",
              (long long)key->m, (long long)key->n, (long long)key->k, (long long)m, (long long)n,
              (long long)k);
    if (g->plan->workspace_bytes > need) need = g->plan->workspace_bytes;
  }
  CHECK_ARG(g->workspace_bytes >= need, "workspace of %zu bytes is smaller than the %zu needed",
            g->workspace_bytes, need);
  CHECK_ARG(need == 0 || g->workspace != NULL, "workspace is NULL");
  CHECK_ARG(need == 0 || (uintptr_t)g->workspace % sizeof(float) == 0,
            "workspace %p is not aligned for f32", g->workspace);

  /* BGRADB reads only B: its dbias [m] exists even when D is empty */
  if (g->epilogue == LUTRA_EPILOGUE_BGRADB) TRY(bgradb(g));
  if (m == 0 || n == 0) { /* empty D; DGELU_BGRAD's dbias [n] sums no rows */
    if (g->epilogue == LUTRA_EPILOGUE_DGELU_BGRAD)
      for (int64_t j = 0; j < n; j++)
        lutra_elem_store(g->dbias, g->dbias_dtype, j, 0.0f);
    return LUTRA_OK;
  }

  /* carve the workspace: A, B, then D scratch, each 64-byte rounded */
  char *ws = g->workspace;
  float *a_ws = NULL, *b_ws = NULL, *d_ws = NULL;
  size_t off = 0, bytes;
  if (g->a.dtype != LUTRA_F32) {
    a_ws = (float *)(void *)(ws + off);
    f32_region(k, n, &bytes);
    off += bytes;
  }
  if (g->b.dtype != LUTRA_F32) {
    b_ws = (float *)(void *)(ws + off);
    f32_region(m, k, &bytes);
    off += bytes;
  }
  if (g->d_dtype != LUTRA_F32) d_ws = (float *)(void *)(ws + off);

  const float *af = NULL, *bf = NULL;
  if (k > 0) {
    TRY(upcast(&g->a, a_ws, &af));
    TRY(upcast(&g->b, b_ws, &bf));
  }

  /* f32 destination: D itself, or the scratch holding D_old when accumulating */
  float *df = g->d_dtype == LUTRA_F32 ? (float *)g->d : d_ws;
  const int64_t mn = m * n;
  if (g->accumulate && g->d_dtype != LUTRA_F32)
    for (int64_t i = 0; i < mn; i++)
      df[i] = lutra_elem_load(g->d, g->d_dtype, i);

  /* the bias as BLAS's C (beta 1): see lutra_gemm_args.bias_first */
  const bool bias_first =
      g->bias_first && g->bias && g->bias_dtype == LUTRA_F32 && !g->accumulate && k > 0;
  if (bias_first)
    for (int64_t i = 0; i < m; i++)
      memcpy(df + i * n, g->bias, (size_t)n * sizeof(float));
  if (k > 0) {
    const int lda = g->a.cols > 1 ? (int)g->a.cols : 1;
    const int ldb = g->b.cols > 1 ? (int)g->b.cols : 1;
    cblas_sgemm(CblasRowMajor, g->b.trans ? CblasTrans : CblasNoTrans,
                g->a.trans ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, bf, ldb, af,
                lda, g->accumulate || bias_first ? 1.0f : 0.0f, df, (int)n);
  } else if (!g->accumulate) {
    for (int64_t i = 0; i < mn; i++)
      df[i] = 0.0f;
  }

  const void *bias_after = bias_first ? NULL : g->bias; /* added to the product, then */
  if (bias_after && g->bias_dtype == LUTRA_F32) {       /* the common case: four lanes at a time */
    const float *restrict bias = bias_after;
    for (int64_t i = 0; i < m; i++) {
      float *restrict row = df + i * n;
      int64_t j = 0;
      for (; j + 4 <= n; j += 4)
        lutra_f32x4_store(row + j, lutra_f32x4_load(row + j) + lutra_f32x4_load(bias + j));
      for (; j < n; j++)
        row[j] += bias[j];
    }
  } else if (bias_after) {
    for (int64_t i = 0; i < m; i++) {
      float *row = df + i * n;
      for (int64_t j = 0; j < n; j++)
        row[j] += lutra_elem_load(bias_after, g->bias_dtype, j);
    }
  }
  if (g->c) /* the addend after the bias, in f32, rounded once with the rest below */
    for (int64_t i = 0; i < mn; i++)
      df[i] += lutra_elem_load(g->c, g->d_dtype, i);
  TRY(apply_epilogue(g, df));

  if (g->d_dtype != LUTRA_F32)
    for (int64_t i = 0; i < mn; i++)
      lutra_elem_store(g->d, g->d_dtype, i, df[i]);
  return LUTRA_OK;
}
