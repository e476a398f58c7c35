/* Scaled dot-product attention on the CPU (lutra_attention_args): the reference the cuDNN shim
 * is checked against. An exact softmax per row: the scores, their max, the sum of exponentials
 * and every sum over a row or over head_dim in f64; values are read from the tensors' dtype
 * (BF16 and F16 widened) and written once, rounded to it. stats is the log-sum-exp of each row
 * of scaled scores (max + log(sum), cuDNN's Stats); the backward recomputes the weights from it:
 *   P = exp(S - stats), D_i = sum(dO_i * O_i), dS = P * (Z * dO V^T - D_i),
 *   dQ = scale * dS K, dK = scale * dS^T Q, dV = (P * Z)^T dO,
 * Z the dropout's mask times 1 / (1 - p) (1 without dropout). GQA's dK and dV are summed in f64
 * over the query heads sharing a key/value head, in a fixed order: the same bits every run.
 * Dropout's mask is this file's own counter-based hash (cuDNN's Philox mask differs): weight
 * (b, h, i, j) is kept when u >= p, u = (r >> 11) * 2^-53 with
 *   r = mix(mix(mix(seed) ^ offset) ^ (((b * h_count + h) * s_q + i) * s_kv + j))
 * and mix splitmix64's finalizer (the specs recompute it). FP8 (a->fp8): attention_fp8_cpu.c. */
#include "cpu.h"

#include <math.h>
#include <string.h>

static inline uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* the rows and row pieces the workspace holds (f64): the scores of one row [s_kv], q's row,
 * dO's row and an accumulator [d each], and the backward's dK and dV of one key/value head
 * [s_kv, d each] */
static int64_t workspace_doubles(const lutra_attention_args *a) {
  return a->s_kv + 3 * a->d + 2 * a->s_kv * a->d;
}

static int check_args(const lutra_attention_args *a, const char *fn) {
  CHECK_ARG(a != NULL, "arguments are NULL");
  CHECK_FLOAT_DTYPE(a->dtype, "attention");
  CHECK_ARG(a->b > 0 && a->s_q > 0 && a->s_kv > 0 && a->h > 0 && a->h_kv > 0 && a->d > 0,
            "shape b %lld, s_q %lld, s_kv %lld, h %lld, h_kv %lld, d %lld", (long long)a->b,
            (long long)a->s_q, (long long)a->s_kv, (long long)a->h, (long long)a->h_kv,
            (long long)a->d);
  CHECK_ARG(a->h % a->h_kv == 0, "h %lld is not a multiple of h_kv %lld", (long long)a->h,
            (long long)a->h_kv);
  CHECK_ARG(!a->causal || a->s_q == a->s_kv, "causal needs s_q == s_kv (got %lld and %lld)",
            (long long)a->s_q, (long long)a->s_kv);
  CHECK_ARG(a->dropout >= 0.0f && a->dropout < 1.0f, "dropout %g is outside [0, 1)",
            (double)a->dropout);
  return LUTRA_OK;
}

static int check_run(const lutra_attention_args *a, const char *fn) {
  TRY(check_args(a, fn));
  CHECK_ARG(a->q && a->k && a->v && a->out && a->stats, "q, k, v, out and stats must not be NULL");
  const int64_t need = workspace_doubles(a) * (int64_t)sizeof(double);
  CHECK_ARG(a->workspace && a->workspace_bytes >= need,
            "a workspace of %lld bytes (attention_plan asks for %lld)",
            (long long)a->workspace_bytes, (long long)need);
  return LUTRA_OK;
}

int lutra_cpu_attention_plan(const lutra_attention_args *a, void **plan, size_t *workspace_bytes,
                             int *deterministic) {
  static const char fn[] = "lutra_cpu_attention_plan";
  TRY(check_args(a, fn));
  CHECK_ARG(plan && workspace_bytes && deterministic, "plan outputs are NULL");
  *plan = NULL; /* nothing to build: the loops read the arguments */
  *workspace_bytes = (size_t)workspace_doubles(a) * sizeof(double);
  *deterministic = 1;
  return LUTRA_OK;
}

void lutra_cpu_attention_plan_free(void *plan) {
  (void)plan;
}

static inline int64_t at(const int64_t st[4], int64_t b, int64_t s, int64_t h, int64_t d) {
  return b * st[0] + s * st[1] + h * st[2] + d * st[3];
}

/* The row (b, s, h) of a [b, s, h, d] tensor: f32 rows contiguous in d are read through a
 * pointer (the common case: no dtype switch or stride arithmetic per element, which were most
 * of these loops' time); any other layout or dtype through lutra_elem_load. The same values. */
typedef struct attn_row {
  const float *f32;
  const void *p;
  int dtype;
  int64_t base, step;
} attn_row;
static inline attn_row row_of(const void *p, int dtype, const int64_t st[4], int64_t b, int64_t s,
                              int64_t h) {
  const int64_t base = at(st, b, s, h, 0);
  return (attn_row){dtype == LUTRA_F32 && st[3] == 1 ? (const float *)p + base : NULL, p, dtype,
                    base, st[3]};
}
static inline float row_at(attn_row r, int64_t e) {
  return r.f32 ? r.f32[e] : lutra_elem_load(r.p, r.dtype, r.base + e * r.step);
}

static void load_row(const void *p, int dtype, const int64_t st[4], int64_t b, int64_t s, int64_t h,
                     int64_t d, double *row) {
  const attn_row r = row_of(p, dtype, st, b, s, h);
  for (int64_t e = 0; e < d; e++)
    row[e] = row_at(r, e);
}

/* the dropout's factor of weight (b, h, i, j): 0 or 1 / (1 - p); 1 without dropout */
static inline double keep_factor(const lutra_attention_args *a, uint64_t stream, int64_t b,
                                 int64_t h, int64_t i, int64_t j) {
  if (a->dropout == 0.0f) return 1.0;
  const uint64_t idx =
      (((uint64_t)b * (uint64_t)a->h + (uint64_t)h) * (uint64_t)a->s_q + (uint64_t)i) *
          (uint64_t)a->s_kv +
      (uint64_t)j;
  const double u = (double)(mix(stream ^ idx) >> 11) * 0x1p-53;
  return u >= (double)a->dropout ? 1.0 / (1.0 - (double)a->dropout) : 0.0;
}

/* scores[j] = scale * q_i . k_j for the keys row i sees; returns how many */
static int64_t scores(const lutra_attention_args *a, const double *qrow, int64_t b, int64_t g,
                      int64_t i, double *s) {
  const int64_t len = a->causal ? i + 1 : a->s_kv;
  const double scale = (double)a->scale;
  for (int64_t j = 0; j < len; j++) {
    const attn_row k = row_of(a->k, a->dtype, a->k_stride, b, j, g);
    double dot = 0.0;
    for (int64_t e = 0; e < a->d; e++)
      dot += qrow[e] * row_at(k, e);
    s[j] = scale * dot;
  }
  return len;
}

int lutra_cpu_attention_forward(const lutra_attention_args *a) {
  static const char fn[] = "lutra_cpu_attention_forward";
  TRY(check_run(a, fn));
  if (a->fp8) return lutra_cpu_attention_fp8_forward(a);
  double *row = a->workspace, *qrow = row + a->s_kv, *acc = qrow + 2 * a->d;
  const int64_t group = a->h / a->h_kv;
  const uint64_t stream = mix(mix(a->seed) ^ a->offset);
  for (int64_t b = 0; b < a->b; b++)
    for (int64_t h = 0; h < a->h; h++)
      for (int64_t i = 0; i < a->s_q; i++) {
        const int64_t g = h / group;
        load_row(a->q, a->dtype, a->q_stride, b, i, h, a->d, qrow);
        const int64_t len = scores(a, qrow, b, g, i, row);
        double max, sum;
        lutra_cpu_softmax_sums(row, len, &max, &sum);
        a->stats[(b * a->h + h) * a->s_q + i] = (float)(max + log(sum));
        memset(acc, 0, (size_t)a->d * sizeof *acc);
        for (int64_t j = 0; j < len; j++) {
          const double p = exp(row[j] - max) / sum * keep_factor(a, stream, b, h, i, j);
          if (p == 0.0) continue;
          const attn_row v = row_of(a->v, a->dtype, a->v_stride, b, j, g);
          for (int64_t e = 0; e < a->d; e++)
            acc[e] += p * row_at(v, e);
        }
        for (int64_t e = 0; e < a->d; e++)
          lutra_elem_store(a->out, a->dtype, at(a->o_stride, b, i, h, e), (float)acc[e]);
      }
  return LUTRA_OK;
}

/* query row (b, h, i)'s part of the backward: dq's row written, dK and dV of its key/value head
 * g accumulated into dk_acc and dv_acc [s_kv, d] */
static void backward_row(const lutra_attention_args *a, uint64_t stream, int64_t b, int64_t h,
                         int64_t g, int64_t i, double *dk_acc, double *dv_acc) {
  const int64_t d = a->d;
  double *row = a->workspace, *qrow = row + a->s_kv, *dorow = qrow + d, *acc = dorow + d;
  load_row(a->q, a->dtype, a->q_stride, b, i, h, d, qrow);
  load_row(a->dout, a->dtype, a->o_stride, b, i, h, d, dorow);
  double delta = 0.0; /* D_i = dO_i . O_i */
  const attn_row o = row_of(a->out, a->dtype, a->o_stride, b, i, h);
  for (int64_t e = 0; e < d; e++)
    delta += dorow[e] * row_at(o, e);
  const double lse = a->stats[(b * a->h + h) * a->s_q + i], scale = (double)a->scale;
  const int64_t len = scores(a, qrow, b, g, i, row);
  memset(acc, 0, (size_t)d * sizeof *acc);
  for (int64_t j = 0; j < len; j++) {
    const double p = exp(row[j] - lse), z = keep_factor(a, stream, b, h, i, j);
    const attn_row v = row_of(a->v, a->dtype, a->v_stride, b, j, g);
    const attn_row k = row_of(a->k, a->dtype, a->k_stride, b, j, g);
    double dp = 0.0; /* dO_i . v_j */
    for (int64_t e = 0; e < d; e++)
      dp += dorow[e] * row_at(v, e);
    const double ds = p * (z * dp - delta);
    for (int64_t e = 0; e < d; e++) {
      dv_acc[j * d + e] += p * z * dorow[e];
      dk_acc[j * d + e] += scale * ds * qrow[e];
      acc[e] += ds * row_at(k, e);
    }
  }
  for (int64_t e = 0; e < d; e++)
    lutra_elem_store(a->dq, a->dtype, at(a->q_stride, b, i, h, e), (float)(scale * acc[e]));
}

int lutra_cpu_attention_backward(const lutra_attention_args *a) {
  static const char fn[] = "lutra_cpu_attention_backward";
  TRY(check_run(a, fn));
  CHECK_ARG(a->dout && a->dq && a->dk && a->dv, "dout, dq, dk and dv must not be NULL");
  if (a->fp8) return lutra_cpu_attention_fp8_backward(a);
  const int64_t d = a->d, group = a->h / a->h_kv;
  double *dk_acc = (double *)a->workspace + a->s_kv + 3 * d, *dv_acc = dk_acc + a->s_kv * d;
  const uint64_t stream = mix(mix(a->seed) ^ a->offset);
  for (int64_t b = 0; b < a->b; b++)
    for (int64_t g = 0; g < a->h_kv; g++) {
      memset(dk_acc, 0, (size_t)(2 * a->s_kv * d) * sizeof *dk_acc);
      for (int64_t h = g * group; h < (g + 1) * group; h++)
        for (int64_t i = 0; i < a->s_q; i++)
          backward_row(a, stream, b, h, g, i, dk_acc, dv_acc);
      for (int64_t j = 0; j < a->s_kv; j++)
        for (int64_t e = 0; e < d; e++) {
          lutra_elem_store(a->dk, a->dtype, at(a->k_stride, b, j, g, e), (float)dk_acc[j * d + e]);
          lutra_elem_store(a->dv, a->dtype, at(a->v_stride, b, j, g, e), (float)dv_acc[j * d + e]);
        }
    }
  return LUTRA_OK;
}
