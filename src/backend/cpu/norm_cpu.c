/* LayerNorm and RMSNorm on the CPU: the references of kernels/norm.cu (lutra_norm_args in
 * backend/backend.h). Plain loops over F32/BF16/F16 through lutra_elem_load/store.
 *
 * What the CUDA kernels match exactly and what only within a bound:
 * - the row statistics (mean, rstd) and the backward's row sums (c1, c2) are f32 sums added in
 *   the kernels' order (row_sum below: NORM_LANES lanes over 16-byte chunks, a butterfly per 32
 *   lanes, the groups in order), and the divisions and square root after them are the kernels'
 *   correctly rounded f32 operations, so they are the kernels' bits;
 * - given the same mean and rstd, every element formula below (xhat, y, dxhat, dx) is a fixed
 *   sequence of f32 roundings without FMA that the kernels repeat through fadd/fmul
 *   (kernels/common/f32.cuh): exact;
 * - the column sums dgamma/dbeta are double here; the kernels add per-row-block partials (f32
 *   groups of rows into doubles) in a fixed order: deterministic there, equal to these within
 *   a bound (spec/gpu/norm_gpu.lua states it as an NMSE). */
#include "cpu.h"

#include <math.h>
#include <string.h>

static int check_args(const lutra_norm_args *a, bool backward, const char *fn) {
  CHECK_ARG(a, "arguments are NULL");
  CHECK_FLOAT_DTYPE(a->dtype, "activation");
  CHECK_ARG(a->param_dtype == LUTRA_F32 || a->param_dtype == LUTRA_BF16,
            "unsupported parameter dtype %d (expected F32 or BF16)", (int)a->param_dtype);
  CHECK_ARG(a->rows >= 0 && a->hidden > 0, "bad shape [%lld, %lld]", (long long)a->rows,
            (long long)a->hidden);
  CHECK_ARG(a->x && a->gamma && (a->rms || a->beta), "x, gamma or beta is NULL");
  if (backward) {
    CHECK_ARG(a->dy && a->rstd && (a->rms || a->mean) && a->dgamma && (a->rms || a->dbeta),
              "dy, the saved statistics, dgamma or dbeta is NULL");
    CHECK_ARG(!a->dx_add || a->dx, "dx_add is given without dx");
  } else {
    CHECK_ARG(a->y, "y is NULL");
  }
  return LUTRA_OK;
}

/* the effective scale g of column c */
static inline float gamma_at(const lutra_norm_args *a, int64_t c) {
  float g = lutra_elem_load(a->gamma, a->param_dtype, c);
  return a->zero_centered_gamma ? g + 1.0f : g;
}

/* The kernels' order for a row's sum of term(c): lane t of NORM_LANES (kernels/norm.cu's
 * kRowThreads) adds the chunks t, t + NORM_LANES, ... of V columns each (V = 16 bytes of the
 * activation dtype when a row is a whole number of 16-byte vectors, else 1), in column order;
 * each group of 32 lanes is summed by a butterfly (lane l adds lane l ^ o for o = 16 .. 1), and
 * the groups' sums are added from 0.0 in order. All in f32, as TransformerEngine's norms add. */
enum { NORM_LANES = 256 };

typedef float (*norm_term)(const lutra_norm_args *a, int64_t o, int64_t c, const void *ctx);

static float row_sum(const lutra_norm_args *a, int64_t o, norm_term term, const void *ctx) {
  const int64_t h = a->hidden, esz = (int64_t)lutra_dtype_size(a->dtype);
  const int64_t v = (h * esz) % 16 == 0 ? 16 / esz : 1;
  float lane[32], total = 0.0f;
  /* a group whose lanes start past the row sums +0 in every lane and adds +0 to total, which is
   * never -0 (it starts +0, and +0 + -0 is +0): the groups from the first such one on change
   * nothing, and narrow rows (hidden < 256 v) skip most of the work */
  for (int g = 0; g < NORM_LANES / 32 && (int64_t)32 * g * v < h; g++) {
    for (int l = 0; l < 32; l++) {
      float s = 0.0f;
      for (int64_t c = (int64_t)(32 * g + l) * v; c < h; c += NORM_LANES * v)
        for (int64_t k = 0; k < v && c + k < h; k++)
          s += term(a, o, c + k, ctx);
      lane[l] = s;
    }
    for (int off = 16; off > 0; off >>= 1) {
      float next[32];
      for (int l = 0; l < 32; l++)
        next[l] = lane[l] + lane[l ^ off];
      memcpy(lane, next, sizeof lane);
    }
    total += lane[0];
  }
  return total;
}

static float term_x(const lutra_norm_args *a, int64_t o, int64_t c, const void *ctx) {
  (void)ctx;
  return lutra_elem_load(a->x, a->dtype, o + c);
}

/* ctx: the row's mean as rounded to f32 (NULL for RMSNorm: x itself) */
static float term_sq(const lutra_norm_args *a, int64_t o, int64_t c, const void *ctx) {
  const float x = lutra_elem_load(a->x, a->dtype, o + c);
  const float d = ctx ? x - *(const float *)ctx : x;
  return d * d;
}

int lutra_cpu_layernorm_forward(const lutra_norm_args *a) {
  TRY(check_args(a, false, "lutra_cpu_layernorm_forward"));
  const int64_t h = a->hidden;
  for (int64_t r = 0; r < a->rows; r++) {
    const int64_t o = r * h;
    const float mean = a->rms ? 0.0f : row_sum(a, o, term_x, NULL) / (float)h;
    /* LayerNorm: the biased variance; RMSNorm: mean(x^2) */
    const float var = row_sum(a, o, term_sq, a->rms ? NULL : &mean) / (float)h;
    const float rstd = 1.0f / sqrtf(var + a->eps);
    for (int64_t c = 0; c < h; c++) {
      float xhat = (lutra_elem_load(a->x, a->dtype, o + c) - mean) * rstd;
      float y = xhat * gamma_at(a, c);
      if (!a->rms) y = y + lutra_elem_load(a->beta, a->param_dtype, c);
      lutra_elem_store(a->y, a->dtype, o + c, y);
    }
    if (a->mean && !a->rms) a->mean[r] = mean;
    if (a->rstd) a->rstd[r] = rstd;
  }
  return LUTRA_OK;
}

/* the backward's row-sum terms; ctx: the row's {mean, rstd} */
static float term_dxhat_xhat(const lutra_norm_args *a, int64_t o, int64_t c, const void *ctx) {
  const float *st = ctx;
  float xhat = (lutra_elem_load(a->x, a->dtype, o + c) - st[0]) * st[1];
  float dxhat = lutra_elem_load(a->dy, a->dtype, o + c) * gamma_at(a, c);
  return dxhat * xhat;
}

static float term_dxhat(const lutra_norm_args *a, int64_t o, int64_t c, const void *ctx) {
  (void)ctx;
  return lutra_elem_load(a->dy, a->dtype, o + c) * gamma_at(a, c);
}

/* dgamma[c] = sum_r dy xhat, dbeta[c] = sum_r dy, each column summed in double in row order, for
 * NORM_COLUMNS columns at a time on the stack: no allocation per call (a training step's norm
 * backward allocates nothing), the same sums as one pass over the rows */
enum { NORM_COLUMNS = 64 };
static void column_sums(const lutra_norm_args *a) {
  const int64_t h = a->hidden;
  for (int64_t c0 = 0; c0 < h; c0 += NORM_COLUMNS) {
    const int64_t n = h - c0 < NORM_COLUMNS ? h - c0 : NORM_COLUMNS;
    double acc[2 * NORM_COLUMNS] = {0};
    for (int64_t r = 0; r < a->rows; r++) {
      const int64_t o = r * h;
      const float mean = a->rms ? 0.0f : a->mean[r], rstd = a->rstd[r];
      for (int64_t j = 0; j < n; j++) {
        float xhat = (lutra_elem_load(a->x, a->dtype, o + c0 + j) - mean) * rstd;
        float dy = lutra_elem_load(a->dy, a->dtype, o + c0 + j);
        acc[j] += (double)(dy * xhat);
        acc[NORM_COLUMNS + j] += dy;
      }
    }
    for (int64_t j = 0; j < n; j++) {
      lutra_elem_store(a->dgamma, a->param_dtype, c0 + j, (float)acc[j]);
      if (!a->rms) lutra_elem_store(a->dbeta, a->param_dtype, c0 + j, (float)acc[NORM_COLUMNS + j]);
    }
  }
}

/* dx = rstd (dxhat - xhat c1 - c2) (+ dx_add), dxhat = dy g, c1 = mean(dxhat xhat), c2 =
 * mean(dxhat) (RMSNorm: c2 = 0, xhat = x rstd); dgamma = sum_r dy xhat, dbeta = sum_r dy. */
int lutra_cpu_layernorm_backward(const lutra_norm_args *a) {
  static const char fn[] = "lutra_cpu_layernorm_backward";
  TRY(check_args(a, true, fn));
  const int64_t h = a->hidden;
  for (int64_t r = 0; a->dx && r < a->rows; r++) {
    const int64_t o = r * h;
    const float mean = a->rms ? 0.0f : a->mean[r], rstd = a->rstd[r];
    const float stats[2] = {mean, rstd};
    const float s1 = row_sum(a, o, term_dxhat_xhat, stats), s2 = row_sum(a, o, term_dxhat, stats);
    const float c1 = s1 / (float)h, c2 = a->rms ? 0.0f : s2 / (float)h;
    for (int64_t c = 0; c < h; c++) {
      float xhat = (lutra_elem_load(a->x, a->dtype, o + c) - mean) * rstd;
      float dxhat = lutra_elem_load(a->dy, a->dtype, o + c) * gamma_at(a, c);
      float t = xhat * c1;
      t = t + c2;
      float dx = (dxhat - t) * rstd;
      if (a->dx_add) dx += lutra_elem_load(a->dx_add, a->dtype, o + c);
      lutra_elem_store(a->dx, a->dtype, o + c, dx);
    }
  }
  column_sums(a);
  return LUTRA_OK;
}
