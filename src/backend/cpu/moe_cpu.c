/* MoE routing on the CPU: the references of kernels/moe.cu (semantics at lutra_topk_args and
 * lutra_permute_args in backend/backend.h). The top-k selection and every sum run in the order
 * the kernels use, so integers and permutations agree bit for bit, the f32 combines too, and
 * the softmax differs only where CUDA's double exp differs from libm's in the last bit. */
#include "cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- top-k router -------------------------------------------------------------------------- */

static float topk_key(float v) {
  return isnan(v) ? -INFINITY : v;
}

/* (v, i) ranks before (bv, bi): larger value, then the lower index */
static bool ranks_before(float v, int32_t i, float bv, int32_t bi) {
  return v > bv || (v == bv && i < bi);
}

/* the k best (key, index) pairs of row base, best first: an insertion that bubbles each
 * candidate down the sorted list, as the kernel does */
static void topk_select(const void *logits, int dtype, int64_t base, int64_t experts, int k,
                        float *bv, int32_t *bi) {
  for (int i = 0; i < k; i++) {
    bv[i] = -INFINITY;
    bi[i] = INT32_MAX;
  }
  for (int64_t j = 0; j < experts; j++) {
    float cv = topk_key(lutra_elem_load(logits, dtype, base + j));
    int32_t ci = (int32_t)j;
    for (int i = 0; i < k; i++) {
      if (ranks_before(cv, ci, bv[i], bi[i])) {
        float tv = bv[i];
        int32_t ti = bi[i];
        bv[i] = cv;
        bi[i] = ci;
        cv = tv;
        ci = ti;
      }
    }
  }
}

/* the softmax's denominator: over the k selected (renormalize) or over all experts */
static double topk_denominator(const lutra_topk_args *a, int64_t base, const float *key, float mx,
                               double *e) {
  double sum = 0.0;
  for (int i = 0; i < a->k; i++) {
    e[i] = exp((double)(key[i] - mx));
    if (a->renormalize) sum += e[i];
  }
  if (!a->renormalize)
    for (int64_t j = 0; j < a->experts; j++)
      sum += exp((double)(topk_key(lutra_elem_load(a->logits, a->dtype, base + j)) - mx));
  return sum;
}

static int check_topk(const lutra_topk_args *a, const char *fn) {
  CHECK_ARG(a != NULL, "arguments are NULL");
  CHECK_FLOAT_DTYPE(a->dtype, "logits");
  CHECK_ARG(a->tokens > 0 && a->experts > 0, "shape must be positive (got [%lld, %lld])",
            (long long)a->tokens, (long long)a->experts);
  CHECK_ARG(a->k >= 1 && a->k <= LUTRA_MOE_MAX_K && a->k <= a->experts,
            "k = %d is outside 1..min(%d, experts = %lld)", (int)a->k, LUTRA_MOE_MAX_K,
            (long long)a->experts);
  CHECK_ARG(a->logits && a->indices, "logits and indices must not be NULL");
  return LUTRA_OK;
}

int lutra_cpu_moe_topk_forward(const lutra_topk_args *a) {
  static const char fn[] = "lutra_cpu_moe_topk_forward";
  TRY(check_topk(a, fn));
  CHECK_ARG(a->probs, "probs must not be NULL");
  const int k = a->k;
  for (int64_t t = 0; t < a->tokens; t++) {
    const int64_t base = t * a->experts;
    float bv[LUTRA_MOE_MAX_K] = {0};
    int32_t bi[LUTRA_MOE_MAX_K] = {0};
    double e[LUTRA_MOE_MAX_K];
    topk_select(a->logits, a->dtype, base, a->experts, k, bv, bi);
    const double sum = topk_denominator(a, base, bv, bv[0], e);
    for (int i = 0; i < k; i++) {
      a->probs[t * k + i] = (float)(e[i] / sum * (double)a->scaling_factor);
      a->indices[t * k + i] = bi[i];
    }
  }
  return LUTRA_OK;
}

int lutra_cpu_moe_topk_backward(const lutra_topk_args *a) {
  static const char fn[] = "lutra_cpu_moe_topk_backward";
  TRY(check_topk(a, fn));
  CHECK_ARG(a->dprobs && a->dlogits, "dprobs and dlogits must not be NULL");
  const int k = a->k;
  const int64_t experts = a->experts;
  for (int64_t t = 0; t < a->tokens; t++) {
    const int32_t *idx = a->indices + t * k;
    for (int i = 0; i < k; i++)
      CHECK_ARG(idx[i] >= 0 && idx[i] < experts, "index %d of token %lld is outside [0, %lld)",
                (int)idx[i], (long long)t, (long long)experts);
  }
  const double s = (double)a->scaling_factor;
  for (int64_t t = 0; t < a->tokens; t++) {
    const int64_t base = t * experts;
    const int32_t *idx = a->indices + t * k;
    const float *g = a->dprobs + t * k;
    float key[LUTRA_MOE_MAX_K];
    double e[LUTRA_MOE_MAX_K];
    float mx = -INFINITY;
    for (int i = 0; i < k; i++) {
      key[i] = topk_key(lutra_elem_load(a->logits, a->dtype, base + idx[i]));
      mx = fmaxf(mx, key[i]);
    }
    const double sum = topk_denominator(a, base, key, mx, e);
    /* G = sum_i g_i q_i, the softmax's q = e / sum */
    double G = 0.0;
    for (int i = 0; i < k; i++)
      G += (double)g[i] * (e[i] / sum);
    if (a->renormalize) {
      for (int64_t j = 0; j < experts; j++)
        lutra_elem_store(a->dlogits, a->dtype, base + j, 0.0f);
      for (int i = 0; i < k; i++) {
        const double q = e[i] / sum;
        lutra_elem_store(a->dlogits, a->dtype, base + idx[i], (float)(s * q * ((double)g[i] - G)));
      }
    } else {
      for (int64_t j = 0; j < experts; j++) {
        const double q =
            exp((double)(topk_key(lutra_elem_load(a->logits, a->dtype, base + j)) - mx)) / sum;
        lutra_elem_store(a->dlogits, a->dtype, base + j, (float)(s * q * (0.0 - G)));
      }
      for (int i = 0; i < k; i++) {
        const double q = e[i] / sum;
        lutra_elem_store(a->dlogits, a->dtype, base + idx[i], (float)(s * q * ((double)g[i] - G)));
      }
    }
  }
  return LUTRA_OK;
}

/* ---- permutation ------------------------------------------------------------------------- */

static int check_permute(const lutra_permute_args *a, const char *fn) {
  CHECK_ARG(a != NULL, "arguments are NULL");
  CHECK_ARG(a->tokens > 0 && a->k > 0 && a->experts > 0 && a->hidden > 0,
            "tokens, k, experts and hidden must be positive (got %lld, %d, %d, %lld)",
            (long long)a->tokens, (int)a->k, (int)a->experts, (long long)a->hidden);
  CHECK_ARG(a->tokens * a->k <= INT32_MAX, "tokens * k = %lld exceeds 2^31-1 rows",
            (long long)(a->tokens * a->k));
  CHECK_FLOAT_DTYPE(a->dtype, "rows");
  CHECK_ARG(a->row_map, "row_map must not be NULL");
  return LUTRA_OK;
}

static size_t row_bytes(const lutra_permute_args *a) {
  return (size_t)a->hidden * lutra_dtype_size(a->dtype);
}

int lutra_cpu_moe_permute(const lutra_permute_args *a) {
  static const char fn[] = "lutra_cpu_moe_permute";
  TRY(check_permute(a, fn));
  CHECK_ARG(a->indices && a->m_splits && a->scratch, "indices, m_splits and scratch are NULL");
  const int64_t slots = a->tokens * a->k;
  for (int64_t s = 0; s < slots; s++)
    CHECK_ARG(a->indices[s] >= 0 && a->indices[s] < a->experts,
              "index %d of token %lld (choice %lld) is outside [0, %d)", (int)a->indices[s],
              (long long)(s / a->k), (long long)(s % a->k), (int)a->experts);
  int32_t *next = a->scratch; /* the next free row of each expert */
  memset(a->m_splits, 0, (size_t)a->experts * sizeof(int32_t));
  for (int64_t s = 0; s < slots; s++)
    a->m_splits[a->indices[s]]++;
  int32_t offset = 0;
  for (int32_t e = 0; e < a->experts; e++) {
    next[e] = offset;
    offset += a->m_splits[e];
  }
  for (int64_t s = 0; s < slots; s++)
    a->row_map[s] = next[a->indices[s]]++;
  if (!a->x) return LUTRA_OK;
  CHECK_ARG(a->out, "out must not be NULL with x");
  const size_t rb = row_bytes(a);
  for (int64_t s = 0; s < slots; s++)
    memcpy((char *)a->out + (size_t)a->row_map[s] * rb,
           (const char *)a->x + (size_t)(s / a->k) * rb, rb);
  return LUTRA_OK;
}

/* out[t] = sum_i w_i x[row_map[t k + i]], w_i = probs[t k + i] or 1: row by row into an f32
 * accumulator row (a grow-once per-thread buffer), each element's adds in the order i = 0..k-1 */
static _Thread_local struct {
  float *ptr;
  int64_t n;
} acc_row;

static int combine(const lutra_permute_args *a, bool weighted, const char *fn) {
  const int k = a->k;
  const int64_t hidden = a->hidden;
  if (hidden > acc_row.n) {
    float *p = realloc(acc_row.ptr, (size_t)hidden * sizeof(float));
    if (!p)
      return lutra_error(LUTRA_ENOMEM, fn, "no memory for an accumulator row (%lld floats)",
                         (long long)hidden);
    acc_row.ptr = p;
    acc_row.n = hidden;
  }
  float *acc = acc_row.ptr;
  for (int64_t t = 0; t < a->tokens; t++) {
    for (int64_t h = 0; h < hidden; h++)
      acc[h] = 0.0f;
    for (int i = 0; i < k; i++) {
      const int32_t r = a->row_map[t * k + i];
      if (r < 0) continue;
      const float w = weighted ? lutra_elem_load(a->probs, a->probs_dtype, t * k + i) : 1.0f;
      const int64_t base = (int64_t)r * hidden;
      if (a->dtype == LUTRA_F32) {
        const float *x = (const float *)a->x + base;
        for (int64_t h = 0; h < hidden; h++)
          acc[h] = acc[h] + (weighted ? w * x[h] : x[h]);
      } else {
        for (int64_t h = 0; h < hidden; h++) {
          const float v = lutra_elem_load(a->x, a->dtype, base + h);
          acc[h] = acc[h] + (weighted ? w * v : v);
        }
      }
    }
    for (int64_t h = 0; h < hidden; h++)
      lutra_elem_store(a->out, a->dtype, t * hidden + h, acc[h]);
  }
  return LUTRA_OK;
}

int lutra_cpu_moe_permute_backward(const lutra_permute_args *a) {
  static const char fn[] = "lutra_cpu_moe_permute_backward";
  TRY(check_permute(a, fn));
  CHECK_ARG(a->x && a->out, "x and out must not be NULL");
  return combine(a, false, fn);
}

int lutra_cpu_moe_unpermute(const lutra_permute_args *a) {
  static const char fn[] = "lutra_cpu_moe_unpermute";
  TRY(check_permute(a, fn));
  CHECK_ARG(a->x && a->out && a->probs, "x, out and probs must not be NULL");
  CHECK_FLOAT_DTYPE(a->probs_dtype, "probs");
  return combine(a, true, fn);
}

int lutra_cpu_moe_unpermute_backward(const lutra_permute_args *a) {
  static const char fn[] = "lutra_cpu_moe_unpermute_backward";
  TRY(check_permute(a, fn));
  CHECK_ARG(a->x && a->out && a->probs && a->dy && a->dprobs,
            "x, out, probs, dy and dprobs must not be NULL");
  CHECK_FLOAT_DTYPE(a->probs_dtype, "probs");
  const int64_t slots = a->tokens * a->k, hidden = a->hidden;
  for (int64_t s = 0; s < slots; s++) {
    const int32_t r = a->row_map[s];
    const int64_t t = s / a->k;
    if (r < 0) {
      lutra_elem_store(a->dprobs, a->probs_dtype, s, 0.0f);
      continue;
    }
    const float p = lutra_elem_load(a->probs, a->probs_dtype, s);
    double dot = 0.0;
    for (int64_t h = 0; h < hidden; h++) {
      const float g = lutra_elem_load(a->dy, a->dtype, t * hidden + h);
      dot += (double)g * (double)lutra_elem_load(a->x, a->dtype, (int64_t)r * hidden + h);
      lutra_elem_store(a->out, a->dtype, (int64_t)r * hidden + h, p * g);
    }
    lutra_elem_store(a->dprobs, a->probs_dtype, s, (float)dot);
  }
  return LUTRA_OK;
}
