/* The CPU reference of GroupedLinear's grouped operations: a loop over the experts on the CPU's
 * own quantizers and GEMM. Expert e's FP8 slice is exactly what a Linear quantizes from the
 * expert's rows padded with zero rows to the layout's alignment (backend/grouped_layout.h), and
 * its GEMMs are the ones that Linear runs on it, so GroupedLinear equals num_gemms Linears bit
 * for bit. The padded copy, and the f32 upcast of FP8 operands, go through one grow-once
 * per-thread buffer: the reference pays a pass more where the CUDA kernels read in place. */
#include "backend/grouped_layout.h"
#include "cpu.h"

#include <stdlib.h>
#include <string.h>

static _Thread_local struct {
  char *ptr;
  size_t bytes;
} scratch;

static int scratch_get(size_t bytes, void **out, const char *fn) {
  if (bytes > scratch.bytes) {
    char *p = realloc(scratch.ptr, bytes);
    if (!p) return lutra_error(LUTRA_ENOMEM, fn, "no memory for %zu bytes of scratch", bytes);
    scratch.ptr = p;
    scratch.bytes = bytes;
  }
  *out = scratch.ptr;
  return LUTRA_OK;
}

static size_t round64(size_t b) {
  return (b + 63) / 64 * 64;
}

/* the CPU sees backend memory directly: the splits are checked before anything is written */
static int check_splits(const int32_t *splits, int num, int64_t total, const char *fn) {
  CHECK_ARG(splits, "splits are NULL");
  int64_t sum = 0;
  for (int e = 0; e < num; e++) {
    CHECK_ARG(splits[e] >= 0, "m_splits[%d] is %d: a split must be >= 0", e, (int)splits[e]);
    sum += splits[e];
  }
  CHECK_ARG(sum == total, "m_splits sum to %lld, the input has %lld rows", (long long)sum,
            (long long)total);
  return LUTRA_OK;
}

/* ---- grouped quantization -------------------------------------------------------------------
 */

/* The r rows from row R of the matrix an activation inside the cast quantizes, into out: the
 * activation's own CPU entry on those rows, so the values are the unfused kernel's bit for bit,
 * and a copy into act_out. */
static int act_rows(const lutra_grouped_quant_args *a, int64_t R, int64_t r, void *out) {
  const int64_t cols = a->cols;
  const size_t es = lutra_dtype_size(a->x_dtype);
  const bool gated = lutra_act_is_gated(a->act_kind);
  lutra_act_args aa = {.out = out, .dtype = a->x_dtype, .act = a->act_kind};
  if (a->act_forward) {
    const int64_t in_cols = gated ? 2 * cols : cols;
    aa.x = (const char *)a->act + (size_t)(R * in_cols) * es;
    aa.rows = r;
    aa.cols = in_cols;
    aa.n = r * in_cols;
    TRY(lutra_cpu_backend.activation_forward(&aa));
  } else {
    aa.x = (const char *)a->act + (size_t)(R * cols) * es;
    aa.dy = (const char *)a->x + (size_t)(R * (gated ? cols / 2 : cols)) * es;
    aa.rows = r;
    aa.cols = cols;
    aa.n = r * cols;
    TRY(lutra_cpu_backend.activation_backward(&aa));
  }
  if (a->act_out)
    memcpy((char *)a->act_out + (size_t)(R * cols) * es, out, (size_t)(r * cols) * es);
  return LUTRA_OK;
}

static int quantize_one(const lutra_grouped_quant_args *a, int e, const void *rows, int64_t R,
                        int64_t r, int64_t p, int64_t P, int64_t *srow, int64_t *scol,
                        const char *fn) {
  const lutra_grouped_fp8 *o = &a->out;
  const int64_t cols = a->cols;
  const size_t esize = lutra_dtype_size(a->x_dtype), ssize = lutra_grouped_scale_size(o->scaling);
  void *pad = NULL;
  if (p > 0) {
    TRY(scratch_get((size_t)(p * cols) * esize, &pad, fn));
    if (r > 0 && a->act)
      TRY(act_rows(a, R, r, pad));
    else if (r > 0)
      memcpy(pad, rows, (size_t)(r * cols) * esize);
    memset((char *)pad + (size_t)(r * cols) * esize, 0, (size_t)((p - r) * cols) * esize);
  }
  void *db = a->dbias ? a->dbias[e] : NULL;
  lutra_quant_args q = {
      .x = pad,
      .x_dtype = a->x_dtype,
      .out_dtype = o->dtype,
      .rows = p,
      .cols = cols,
      .data = o->data ? (char *)o->data + P * cols : NULL,
      .scale_inv = o->scale_inv ? (char *)o->scale_inv + *srow * (int64_t)ssize : NULL,
      .col_data = o->col_data ? (char *)o->col_data + P * cols : NULL,
      .col_scale_inv = o->col_scale_inv ? (char *)o->col_scale_inv + *scol * (int64_t)ssize : NULL,
      .power_2_scale = a->power_2_scale,
      .amax_epsilon = a->amax_epsilon,
      .block_dim = a->block_dim,
      .dbias = db,
      .dbias_dtype = a->dbias_dtype,
      .dbias_accumulate = a->dbias_accumulate,
      .skip = a->skip,
  };
  *srow += lutra_grouped_scale_region(o->scaling, p, cols, false);
  *scol += lutra_grouped_scale_region(o->scaling, p, cols, true);
  float *amax = a->amax ? a->amax + (int64_t)e * a->amax_stride : NULL;
  if (p == 0) { /* nothing to quantize; an empty expert's bias gradient is zero */
    if (db && !a->dbias_accumulate && !(a->skip && *a->skip))
      for (int64_t c = 0; c < cols; c++)
        lutra_elem_store(db, a->dbias_dtype, c, 0.0f);
    if (a->kind == LUTRA_QUANT_CURRENT && amax && !(a->skip && *a->skip)) *amax = 0.0f;
    return LUTRA_OK;
  }
  switch (a->kind) {
  case LUTRA_QUANT_DELAYED:
    q.scale = a->scale + 4 * e;
    q.amax = amax;
    return lutra_cpu_backend.cast(&q);
  case LUTRA_QUANT_CURRENT:
    TRY(lutra_cpu_current_scale(pad, a->x_dtype, p * cols, a->fp8_max, a->power_2_scale,
                                a->amax_epsilon, amax, a->scale + 4 * e, a->work + 4 * e, a->skip));
    q.scale = a->scale + 4 * e;
    return lutra_cpu_backend.cast(&q);
  case LUTRA_QUANT_MXFP8:
    return lutra_cpu_backend.quantize_mxfp8(&q);
  default:
    return lutra_cpu_backend.quantize_block(&q);
  }
}

int lutra_cpu_grouped_quantize(const lutra_grouped_quant_args *a) {
  static const char fn[] = "lutra_cpu_grouped_quantize";
  CHECK_ARG(a && a->num > 0 && a->cols > 0, "bad grouped quantization arguments");
  CHECK_ARG(a->out.align > 0, "align must be positive");
  CHECK_ARG(lutra_cpu_float_dtype(a->x_dtype), "unsupported input dtype %d", (int)a->x_dtype);
  CHECK_ARG(!a->act || (!a->xs && a->act_kind > LUTRA_ACT_NONE && a->act_kind < LUTRA_ACT_COUNT &&
                        (a->kind == LUTRA_QUANT_DELAYED || a->kind == LUTRA_QUANT_CURRENT) &&
                        (a->act_forward || a->x)),
            "an activation inside a grouped cast takes token rows, a known kind, per-tensor "
            "scaling and (backward) the output's gradient");
  CHECK_ARG(!(a->act && lutra_act_is_gated(a->act_kind) && !a->act_forward && a->cols % 2),
            "a gated activation's gradient needs an even number of columns");
  if (!a->xs) TRY(check_splits(a->splits, a->num, a->total_rows, fn));
  const size_t esize = lutra_dtype_size(a->x_dtype);
  int64_t R = 0, P = 0, srow = 0, scol = 0;
  for (int e = 0; e < a->num; e++) {
    int64_t r = a->xs ? a->rows_each : a->splits[e];
    int64_t p = lutra_grouped_roundup(r, a->out.align);
    const void *rows = a->xs    ? a->xs[e]
                       : a->act ? NULL /* formed from act by act_rows */
                                : (const char *)a->x + (size_t)(R * a->cols) * esize;
    TRY(quantize_one(a, e, rows, R, r, p, P, &srow, &scol, fn));
    R += r;
    P += p;
  }
  return LUTRA_OK;
}

/* ---- grouped GEMM -----------------------------------------------------------------------------
 */

/* FP8 operand slice [rows, cols] of expert e, dequantized into f32 at dst */
static int dequant(const lutra_grouped_fp8 *q, bool columnwise, int64_t rows, int64_t cols,
                   int64_t data_off, int64_t scale_off, float *dst) {
  if (rows == 0 || cols == 0) return LUTRA_OK;
  int64_t ss = lutra_grouped_scale_size(q->scaling);
  return lutra_cpu_dequantize(&(lutra_dequant_args){
      .data = (const char *)(columnwise ? q->col_data : q->data) + data_off,
      .scale_inv = (const char *)(columnwise ? q->col_scale_inv : q->scale_inv) + scale_off * ss,
      .dtype = q->dtype,
      .scaling = q->scaling,
      .rows = rows,
      .cols = cols,
      .out = dst,
      .out_dtype = LUTRA_F32});
}

/* where expert e's slice of a packed operand starts */
typedef struct slice_at {
  int64_t data, srow, scol;
} slice_at;

static void advance(slice_at *s, const lutra_grouped_fp8 *q, int64_t rows, int64_t cols) {
  if (q->align <= 0) return; /* an operand this pass does not read */
  int64_t p = lutra_grouped_roundup(rows, q->align);
  s->data += p * cols;
  s->srow += lutra_grouped_scale_region(q->scaling, p, cols, false);
  s->scol += lutra_grouped_scale_region(q->scaling, p, cols, true);
}

/* One expert's GEMM as a Linear runs it (nn/linear/linear_core.c through gemm/gemm.c's TN rule). */
typedef struct expert_gemm {
  lutra_gemm_operand a, b;
  void *d;
  int64_t m, n, k;
  const void *bias;
  void *dbias;
  int32_t epilogue;
  int32_t accumulate;
} expert_gemm;

static int run_expert(const lutra_grouped_gemm_args *g, const expert_gemm *x, float *ws,
                      size_t ws_bytes) {
  return lutra_cpu_gemm(
      &(lutra_gemm_args){.a = x->a,
                         .b = x->b,
                         .d = x->d,
                         .d_dtype = g->pass == LUTRA_GROUPED_WGRAD ? g->dw_dtype : g->dtype,
                         .accumulate = x->accumulate,
                         .m = x->m,
                         .n = x->n,
                         .k = x->k,
                         .bias = x->bias,
                         .bias_dtype = x->bias ? g->bias_dtype : -1,
                         .epilogue = x->epilogue,
                         .dbias = x->dbias,
                         .dbias_dtype = x->dbias ? g->bias_dtype : -1,
                         .workspace = ws,
                         .workspace_bytes = ws_bytes});
}

static lutra_gemm_operand plain(const void *p, int dtype, int64_t rows, int64_t cols, int trans) {
  return (lutra_gemm_operand){
      .data = p, .dtype = dtype, .rows = rows, .cols = cols, .trans = trans};
}

static lutra_gemm_operand f32_op(const float *p, int64_t rows, int64_t cols, int trans) {
  return plain(p, LUTRA_F32, rows, cols, trans);
}

int lutra_cpu_grouped_gemm(const lutra_grouped_gemm_args *g) {
  static const char fn[] = "lutra_cpu_grouped_gemm";
  CHECK_ARG(g && g->num > 0 && g->in > 0 && g->out > 0, "bad grouped GEMM arguments");
  CHECK_ARG(g->pass >= LUTRA_GROUPED_FPROP && g->pass <= LUTRA_GROUPED_WGRAD, "unknown pass %d",
            (int)g->pass);
  TRY(check_splits(g->splits, g->num, g->total_rows, fn));
  if (g->pass == LUTRA_GROUPED_FPROP && g->save_splits && g->save_splits != g->splits)
    memcpy(g->save_splits, g->splits, (size_t)g->num * sizeof(int32_t));
  const int64_t in = g->in, out = g->out;
  const size_t es = lutra_dtype_size(g->dtype);
  const lutra_grouped_fp8 *tok = g->pass == LUTRA_GROUPED_FPROP ? &g->xq : &g->dyq;
  const int64_t align = g->fp8 ? tok->align : 1;
  slice_at xs = {0}, dys = {0}, ws = {0};
  int64_t R = 0;
  for (int e = 0; e < g->num; e++) {
    const int64_t s = g->splits[e], p = lutra_grouped_roundup(s, align);
    /* scratch: the f32 operands and the padded output (FP8), then the GEMM's own workspace
     * (bf16 upcasts, D). FP8 GEMMs run on all p padded rows, as the Linear of the padded rows
     * does (BLAS may sum a row differently when m differs), and keep the first s. The operands
     * as laid out below: f_tok [p, wide], f_w [out, in], f_tok2 [p, in] (wide, not in + out:
     * sized for in + out, the padded output ran p (in - out) floats into the GEMM's workspace
     * when in > out). */
    const int64_t wide = in > out ? in : out;
    size_t opb = g->fp8 ? round64((size_t)(p * wide + in * out + p * in) * 4) +
                              round64((size_t)(p * wide) * es)
                        : 0;
    size_t gemmb = round64((size_t)(p * in + p * out + in * out) * 4) + 3 * 64;
    char *buf = NULL;
    TRY(scratch_get(opb + gemmb, (void **)&buf, fn));
    float *f_tok = (float *)(void *)buf, *f_w = f_tok + p * (in > out ? in : out);
    float *f_tok2 = f_w + in * out, *gemm_ws = (float *)(void *)(buf + opb);
    char *d_pad = (char *)(f_tok2 + p * in);
    expert_gemm x = {0};
    char *out_rows = g->pass == LUTRA_GROUPED_FPROP   ? (char *)g->y + (size_t)(R * out) * es
                     : g->pass == LUTRA_GROUPED_DGRAD ? (char *)g->dx + (size_t)(R * in) * es
                                                      : NULL;
    const char *xe = (const char *)g->x + (size_t)(R * in) * es;
    const char *dye = (const char *)g->dy + (size_t)(R * out) * es;
    switch (g->pass) {
    case LUTRA_GROUPED_FPROP:
      x = (expert_gemm){.m = s, .n = out, .k = in, .d = out_rows};
      x.bias = g->bias ? g->bias[e] : NULL;
      if (g->fp8) { /* Linear: B = xq rowwise [p, in], A = wq rowwise [out, in] used as T */
        TRY(dequant(&g->xq, false, p, in, xs.data, xs.srow, f_tok));
        TRY(dequant(&g->wq, false, out, in, ws.data, ws.srow, f_w));
        x.m = p;
        x.d = d_pad;
        x.b = f32_op(f_tok, p, in, 0);
        x.a = f32_op(f_w, out, in, 1);
      } else {
        x.b = plain(xe, g->dtype, s, in, 0);
        x.a = plain(g->w[e], g->dtype, out, in, 1);
      }
      break;
    case LUTRA_GROUPED_DGRAD:
      x = (expert_gemm){.m = s, .n = in, .k = out, .d = out_rows};
      if (g->fp8) { /* B = dyq rowwise [p, out], A = wq's columnwise copy [in, out] used as T */
        TRY(dequant(&g->dyq, false, p, out, dys.data, dys.srow, f_tok));
        TRY(dequant(&g->wq, true, in, out, ws.data, ws.scol, f_w));
        x.m = p;
        x.d = d_pad;
        x.b = f32_op(f_tok, p, out, 0);
        x.a = f32_op(f_w, in, out, 1);
      } else {
        x.b = plain(dye, g->dtype, s, out, 0);
        x.a = plain(g->w[e], g->dtype, out, in, 0);
      }
      break;
    default:
      x = (expert_gemm){.m = out, .n = in, .d = g->dw[e], .accumulate = g->accumulate};
      if (g->fp8) { /* B = dyq's columnwise [out, p], A = xq's columnwise [in, p] used as T */
        int64_t px = lutra_grouped_roundup(s, g->xq.align);
        CHECK_ARG(px == p, "the input and grad_output are padded differently (%d, %d rows)",
                  (int)g->xq.align, (int)g->dyq.align);
        TRY(dequant(&g->dyq, true, out, p, dys.data, dys.scol, f_tok));
        TRY(dequant(&g->xq, true, in, p, xs.data, xs.scol, f_tok2));
        x.k = p;
        x.b = f32_op(f_tok, out, p, 0);
        x.a = f32_op(f_tok2, in, p, 1);
      } else {
        x.k = s;
        x.b = plain(dye, g->dtype, s, out, 1);
        x.a = plain(xe, g->dtype, s, in, 0);
        /* Linear sums the bias gradient in the wgrad GEMM's BGRADB epilogue (overwriting) */
        if (g->db && !g->accumulate) {
          x.epilogue = LUTRA_EPILOGUE_BGRADB;
          x.dbias = g->db[e];
        }
      }
      break;
    }
    TRY(run_expert(g, &x, gemm_ws, gemmb));
    if (x.d == d_pad && s > 0) memcpy(out_rows, d_pad, (size_t)(s * x.n) * es);
    if (g->pass == LUTRA_GROUPED_WGRAD && !g->fp8 && g->db && g->accumulate)
      TRY(lutra_cpu_bias_grad(&(lutra_bias_grad_args){.dy = dye,
                                                      .dtype = g->dtype,
                                                      .rows = s,
                                                      .cols = out,
                                                      .db = g->db[e],
                                                      .db_dtype = g->bias_dtype,
                                                      .accumulate = 1}));
    if (g->fp8) {
      advance(&xs, &g->xq, s, in);
      advance(&dys, &g->dyq, s, out);
      advance(&ws, &g->wq, out, in);
    }
    R += s;
  }
  return LUTRA_OK;
}
