/* FP8 scaled dot-product attention on the CPU (lutra_attention_args with fp8 = 1): the
 * reference for cuDNN's sdpa_fp8 and sdpa_fp8_backward, emulating where they round. Codes are
 * decoded and descaled exactly (lutra_decode times the f32 descale, in f64); every sum is f64,
 * as in attention_cpu.c; what cuDNN keeps in FP8 between its GEMMs is rounded here to the same
 * format with the same scale (RNE, saturating: lutra_encode):
 *   forward   P = softmax(scale q k^T) (stats: its log-sum-exp), amax_S = max P;
 *             O = (fp8_E4M3(P scale_S) descale_S) V, amax_O = max |O|; out = fp8_E4M3(O scale_O)
 *   backward  D_i = dO_i . O_i, P recomputed from stats, dV = (fp8_E4M3(P scale_S) descale_S)^T dO;
 *             dS = scale P (dO V^T - D) (the softmax scale folded in, as cuDNN's graph does),
 *             amax_dP = max |dS|, dS~ = fp8_g(dS scale_dP) descale_dP;
 *             dQ = dS~ K, dK = dS~^T Q, each amax taken, out = fp8_g(x scale_dQKV)
 * (fp8_g: the grad dtype, E5M2 under HYBRID). cuDNN's accumulation order and f32 sums differ:
 * and its fused kernels may round at other points of the same precision (this follows the
 * reference graphs of cudnn-frontend's sdpa nodes): GPU and this agree within a few FP8
 * roundings, not bit for bit. No dropout (the module refuses it with FP8). The backward descales q,
 * k, v and O with the scales the forward saved, and uses the saved scale of S. */
#include "cpu.h"

#include <math.h>
#include <string.h>

static inline int64_t at(const int64_t st[4], int64_t b, int64_t s, int64_t h, int64_t d) {
  return b * st[0] + s * st[1] + h * st[2] + d * st[3];
}

/* element i of FP8 codes p, descaled */
static inline double load8(const void *p, int dtype, int64_t i, double descale) {
  return (double)lutra_decode(dtype, ((const uint8_t *)p)[i]) * descale;
}

/* x rounded as cuDNN stores it in FP8 with this scale, read back descaled */
static inline double round8(int dtype, double x, float scale, float descale) {
  return (double)lutra_decode(dtype, lutra_encode(dtype, (float)x * scale)) * (double)descale;
}

static inline void store8(void *p, int dtype, int64_t i, double x, float scale) {
  ((uint8_t *)p)[i] = (uint8_t)lutra_encode(dtype, (float)x * scale);
}

static void load_row8(const void *p, int dtype, const int64_t st[4], int64_t b, int64_t s,
                      int64_t h, int64_t d, double descale, double *row) {
  for (int64_t e = 0; e < d; e++)
    row[e] = load8(p, dtype, at(st, b, s, h, e), descale);
}

/* scores[j] = scale * q_i . k_j for the keys row i sees; returns how many */
static int64_t scores8(const lutra_attention_args *a, const double *qrow, int64_t b, int64_t g,
                       int64_t i, double descale, double *s) {
  const int64_t len = a->causal ? i + 1 : a->s_kv;
  for (int64_t j = 0; j < len; j++) {
    double dot = 0.0;
    for (int64_t e = 0; e < a->d; e++)
      dot += qrow[e] * load8(a->k, LUTRA_E4M3, at(a->k_stride, b, j, g, e), descale);
    s[j] = (double)a->scale * dot;
  }
  return len;
}

int lutra_cpu_attention_fp8_forward(const lutra_attention_args *a) {
  static const char fn[] = "lutra_cpu_attention_forward (fp8)";
  CHECK_ARG(a->fp8_state, "fp8_state is NULL");
  CHECK_ARG(a->dropout == 0.0f, "FP8 attention runs without dropout");
  float *st = a->fp8_state;
  const double dqkv = *lutra_attention_scale_inv(st, LUTRA_ATTENTION_FP8_QKV, 0);
  const float scale_s = *lutra_attention_scale(st, LUTRA_ATTENTION_FP8_S, 0);
  const float descale_s = *lutra_attention_scale_inv(st, LUTRA_ATTENTION_FP8_S, 0);
  const float scale_o = *lutra_attention_scale(st, LUTRA_ATTENTION_FP8_O, 0);
  double *row = a->workspace, *qrow = row + a->s_kv, *acc = qrow + 2 * a->d;
  const int64_t group = a->h / a->h_kv;
  double amax_s = 0.0, amax_o = 0.0;
  for (int64_t b = 0; b < a->b; b++)
    for (int64_t h = 0; h < a->h; h++)
      for (int64_t i = 0; i < a->s_q; i++) {
        const int64_t g = h / group;
        load_row8(a->q, LUTRA_E4M3, a->q_stride, b, i, h, a->d, dqkv, qrow);
        const int64_t len = scores8(a, qrow, b, g, i, dqkv, row);
        double max, sum;
        lutra_cpu_softmax_sums(row, len, &max, &sum);
        a->stats[(b * a->h + h) * a->s_q + i] = (float)(max + log(sum));
        memset(acc, 0, (size_t)a->d * sizeof *acc);
        for (int64_t j = 0; j < len; j++) {
          const double p = exp(row[j] - max) / sum;
          amax_s = fmax(amax_s, p);
          const double p8 = round8(LUTRA_E4M3, p, scale_s, descale_s);
          for (int64_t e = 0; e < a->d; e++)
            acc[e] += p8 * load8(a->v, LUTRA_E4M3, at(a->v_stride, b, j, g, e), dqkv);
        }
        for (int64_t e = 0; e < a->d; e++) {
          amax_o = fmax(amax_o, fabs(acc[e]));
          store8(a->out, LUTRA_E4M3, at(a->o_stride, b, i, h, e), acc[e], scale_o);
        }
      }
  *lutra_attention_amax(st, LUTRA_ATTN_AMAX_S) = (float)amax_s;
  *lutra_attention_amax(st, LUTRA_ATTN_AMAX_O) = (float)amax_o;
  return LUTRA_OK;
}

/* what every row of the backward reads: the scales and the running amaxes */
typedef struct fp8_bwd {
  double dqkv, do_inv, o_inv, descale_s, descale_dp;
  float scale_s, scale_dp, scale_dqkv;
  double amax_dp, amax_dq, amax_dk, amax_dv;
  int gd; /* the grad dtype */
} fp8_bwd;

/* query row (b, h, i)'s part of the backward: dq's row written, dK and dV of its key/value head
 * g accumulated into dk_acc and dv_acc [s_kv, d] */
static void backward_row8(const lutra_attention_args *a, fp8_bwd *c, int64_t b, int64_t h,
                          int64_t g, int64_t i, double *dk_acc, double *dv_acc) {
  const int64_t d = a->d;
  double *row = a->workspace, *qrow = row + a->s_kv, *dorow = qrow + d, *acc = dorow + d;
  load_row8(a->q, LUTRA_E4M3, a->q_stride, b, i, h, d, c->dqkv, qrow);
  load_row8(a->dout, c->gd, a->o_stride, b, i, h, d, c->do_inv, dorow);
  double delta = 0.0; /* D_i = dO_i . O_i */
  for (int64_t e = 0; e < d; e++)
    delta += dorow[e] * load8(a->out, LUTRA_E4M3, at(a->o_stride, b, i, h, e), c->o_inv);
  const double lse = a->stats[(b * a->h + h) * a->s_q + i], scale = (double)a->scale;
  const int64_t len = scores8(a, qrow, b, g, i, c->dqkv, row);
  memset(acc, 0, (size_t)d * sizeof *acc);
  for (int64_t j = 0; j < len; j++) {
    const double p = exp(row[j] - lse);
    const double p8 = round8(LUTRA_E4M3, p, c->scale_s, (float)c->descale_s);
    double dp = 0.0; /* dO_i . v_j */
    for (int64_t e = 0; e < d; e++)
      dp += dorow[e] * load8(a->v, LUTRA_E4M3, at(a->v_stride, b, j, g, e), c->dqkv);
    const double ds = scale * p * (dp - delta);
    c->amax_dp = fmax(c->amax_dp, fabs(ds));
    const double ds8 = round8(c->gd, ds, c->scale_dp, (float)c->descale_dp);
    for (int64_t e = 0; e < d; e++) {
      dv_acc[j * d + e] += p8 * dorow[e];
      dk_acc[j * d + e] += ds8 * qrow[e];
      acc[e] += ds8 * load8(a->k, LUTRA_E4M3, at(a->k_stride, b, j, g, e), c->dqkv);
    }
  }
  for (int64_t e = 0; e < d; e++) {
    const double dq = acc[e];
    c->amax_dq = fmax(c->amax_dq, fabs(dq));
    store8(a->dq, c->gd, at(a->q_stride, b, i, h, e), dq, c->scale_dqkv);
  }
}

int lutra_cpu_attention_fp8_backward(const lutra_attention_args *a) {
  static const char fn[] = "lutra_cpu_attention_backward (fp8)";
  CHECK_ARG(a->fp8_state, "fp8_state is NULL");
  CHECK_ARG(a->dropout == 0.0f, "FP8 attention runs without dropout");
  CHECK_ARG(a->grad_dtype == LUTRA_E4M3 || a->grad_dtype == LUTRA_E5M2,
            "grad_dtype %d is not e4m3 or e5m2", (int)a->grad_dtype);
  float *st = a->fp8_state;
  fp8_bwd c = {
      .dqkv = *lutra_attention_scale_inv(st, LUTRA_ATTENTION_FP8_QKV, 1),
      .o_inv = *lutra_attention_scale_inv(st, LUTRA_ATTENTION_FP8_O, 1),
      .descale_s = *lutra_attention_scale_inv(st, LUTRA_ATTENTION_FP8_S, 1),
      .scale_s = *lutra_attention_scale(st, LUTRA_ATTENTION_FP8_S, 1),
      .do_inv = *lutra_attention_scale_inv(st, LUTRA_ATTENTION_FP8_DO, 0),
      .scale_dp = *lutra_attention_scale(st, LUTRA_ATTENTION_FP8_DP, 0),
      .descale_dp = *lutra_attention_scale_inv(st, LUTRA_ATTENTION_FP8_DP, 0),
      .scale_dqkv = *lutra_attention_scale(st, LUTRA_ATTENTION_FP8_DQKV, 0),
      .gd = a->grad_dtype,
  };
  const int64_t d = a->d, group = a->h / a->h_kv;
  double *dk_acc = (double *)a->workspace + a->s_kv + 3 * d, *dv_acc = dk_acc + a->s_kv * d;
  for (int64_t b = 0; b < a->b; b++)
    for (int64_t g = 0; g < a->h_kv; g++) {
      memset(dk_acc, 0, (size_t)(2 * a->s_kv * d) * sizeof *dk_acc);
      for (int64_t h = g * group; h < (g + 1) * group; h++)
        for (int64_t i = 0; i < a->s_q; i++)
          backward_row8(a, &c, b, h, g, i, dk_acc, dv_acc);
      for (int64_t j = 0; j < a->s_kv; j++)
        for (int64_t e = 0; e < d; e++) {
          c.amax_dk = fmax(c.amax_dk, fabs(dk_acc[j * d + e]));
          c.amax_dv = fmax(c.amax_dv, fabs(dv_acc[j * d + e]));
          store8(a->dk, c.gd, at(a->k_stride, b, j, g, e), dk_acc[j * d + e], c.scale_dqkv);
          store8(a->dv, c.gd, at(a->v_stride, b, j, g, e), dv_acc[j * d + e], c.scale_dqkv);
        }
    }
  *lutra_attention_amax(st, LUTRA_ATTN_AMAX_DP) = (float)c.amax_dp;
  *lutra_attention_amax(st, LUTRA_ATTN_AMAX_DQ) = (float)c.amax_dq;
  *lutra_attention_amax(st, LUTRA_ATTN_AMAX_DK) = (float)c.amax_dk;
  *lutra_attention_amax(st, LUTRA_ATTN_AMAX_DV) = (float)c.amax_dv;
  return LUTRA_OK;
}
