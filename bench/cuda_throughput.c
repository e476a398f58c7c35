/* GPU throughput of lutra's CUDA backend beside the raw library calls it wraps, in one run.
 *
 * Build (from the repository root, after `make` has built liblutra.so with CUDA):
 *   mkdir -p build && gcc -std=c11 -O2 -Wall -Wextra -Werror -D_GNU_SOURCE -Isrc \
 *     -I/usr/local/cuda/include bench/cuda_throughput.c -o build/cuda_throughput -L. -llutra \
 *     -L/usr/local/cuda/lib64 -lcudart -lcublasLt -Wl,-rpath,'$ORIGIN/..' \
 *     -Wl,-rpath,/usr/local/cuda/lib64
 * Run:
 *   build/cuda_throughput [TABLE.md]      (the final markdown table is also written to TABLE.md)
 *
 * What it measures
 * 1. GEMM TFLOP/s = 2*M*N*K / t at M=N=K=8192 and M=4096 N=4096 K=1024, BF16 (bf16 in, bf16
 *    out) and FP8 (E4M3 x E4M3, per-tensor scales from current-scaling quantizers, bf16 out, no
 *    fast accumulation: lutra_gemm's default). M x N x K maps onto lutra_gemm's TN layout
 *    D = op(B) op(A) as
 *        A = [N, K] (the "weight", transa = 1), B = [M, K] (the "input", transb = 0),
 *        D = B @ A^T = [M, N],
 *    which is column-major cuBLASLt TN with m = N, n = M, k = K. The raw figure is a
 *    cublasLtMatmul of the same problem on the same operands (for FP8: the same FP8 data, with
 *    copies of the two scale_inv values at 16-byte aligned addresses), with descriptors built
 *    here and the heuristic's first algorithm for a 32 MiB workspace, chosen once before
 *    timing. The FP8 figures time the GEMM only (the quantizations run once, before).
 *    Afterwards lutra's D and the raw D are compared element by element.
 * 2. Memory-bound kernels in GB/s = (bytes read + bytes written) / t, on a bf16 input of
 *    8192x8192 and 16384x16384 (skipped when the device lacks the memory), with n elements:
 *      cudaMemcpyAsync D2D of the 2n-byte input           read 2n + write 2n        = 4n
 *      current scaling, rowwise (amax pass + cast)        2n + (2n + n)             = 5n
 *      delayed scaling, rowwise (the cast alone: one kernel, scale given, amax fused
 *        into it)                                         2n + n                    = 3n
 *      current scaling, rowwise + columnwise (cast+transpose) 2n + (2n + n + n)     = 6n
 *      delayed scaling, rowwise + columnwise              2n + n + n                = 4n
 *      MXFP8, rowwise + columnwise                        2n + n + n + 2 * n/32     = 4n + n/16
 *    (the per-tensor scalars, a few dozen bytes, are not counted; every figure is the minimum
 *    traffic of the op: the input is counted once per pass that must read it). Each is also
 *    given as a % of the copy's GB/s. The amax pass alone is derived by difference
 *    (current - delayed) and printed as a detail line.
 *
 * How it times: lutra runs on its own stream, which the API does not hand out, so every figure
 * (lutra's and the raw one alike) is host wall time (CLOCK_MONOTONIC) around a batch of R
 * calls, with both streams synchronized before the batch and the op's own stream synchronized
 * after it (lutra_device_synchronize(LUTRA_CUDA) for lutra, cudaStreamSynchronize for the raw
 * stream). R is at least 20 and large enough for a batch of ~10 ms. Each op is warmed up, then
 * 9 batches are timed, the batches of the ops of one group alternating (lutra, raw, lutra, ...)
 * so they see the same clocks; the figure is the median batch. For the raw calls, cudaEvents
 * recorded on the raw stream around the same batch give a GPU-side time as a check of the
 * method (printed as "event-timed").
 *
 * Every CUDA, cuBLASLt and lutra status is checked; a failure prints the call, the status and
 * lutra_last_error() and exits with status 1. */
#include "lutra.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "support/checks.h"
#include "support/throughput.h"

/* ---- GEMMs ---------------------------------------------------------------------------- */

static cublasLtHandle_t raw_lt;
static void *raw_ws;

typedef struct gemm_case {
  int64_t m, n, k;
  int fp8;
  lutra_tensor *a, *b;           /* bf16 A [N, K], B [M, K] */
  lutra_quantizer *qa, *qb;      /* FP8 only */
  const lutra_tensor *ga, *gb;   /* the operands lutra_gemm and the raw call get */
  lutra_tensor *d_lutra, *d_raw; /* bf16 [M, N] */
  float *scales;                 /* raw FP8: A's scale_inv at [0], B's at [4] (16-byte aligned) */
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulAlgo_t algo;
  int algo_id;
  size_t algo_ws;
} gemm_case;

static void run_lutra_gemm(void *ctx) {
  gemm_case *c = ctx;
  LU(lutra_gemm(c->ga, 1, c->gb, 0, c->d_lutra, NULL, 0));
}

static const float ONE = 1.0f, ZERO = 0.0f;

static void run_raw_gemm(void *ctx) {
  gemm_case *c = ctx;
  CB(cublasLtMatmul(raw_lt, c->op, &ONE, c->ga->data, c->la, c->gb->data, c->lb, &ZERO,
                    c->d_raw->data, c->ld, c->d_raw->data, c->ld, &c->algo, raw_ws, RAW_WORKSPACE,
                    raw_stream));
}

static void raw_gemm_setup(gemm_case *c) {
  cudaDataType_t in = c->fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  CB(cublasLtMatmulDescCreate(&c->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t T = CUBLAS_OP_T, N = CUBLAS_OP_N;
  CB(cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_TRANSA, &T, sizeof T));
  CB(cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_TRANSB, &N, sizeof N));
  if (c->fp8) {
    int8_t fast = 0; /* as lutra_gemm */
    CB(cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
    CK(cudaMalloc((void **)&c->scales, 256));
    /* the operands were quantized on lutra's stream, which sync_all() has drained */
    CK(cudaMemcpy(c->scales, c->ga->scale_inv, sizeof(float), cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(c->scales + 4, c->gb->scale_inv, sizeof(float), cudaMemcpyDeviceToDevice));
    const float *sa = c->scales, *sb = c->scales + 4;
    CB(cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
    CB(cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
  }
  /* column-major views of the row-major operands: A^T is K x N, B^T is K x M, D^T is N x M */
  CB(cublasLtMatrixLayoutCreate(&c->la, in, (uint64_t)c->k, (uint64_t)c->n, c->k));
  CB(cublasLtMatrixLayoutCreate(&c->lb, in, (uint64_t)c->k, (uint64_t)c->m, c->k));
  CB(cublasLtMatrixLayoutCreate(&c->ld, CUDA_R_16BF, (uint64_t)c->n, (uint64_t)c->m, c->n));
  cublasLtMatmulPreference_t pref;
  CB(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = RAW_WORKSPACE;
  CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                          sizeof ws));
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  CB(cublasLtMatmulAlgoGetHeuristic(raw_lt, c->op, c->la, c->lb, c->ld, c->ld, pref, 1, &res,
                                    &found));
  CB(cublasLtMatmulPreferenceDestroy(pref));
  if (found < 1) die("cuBLASLt heuristic found no algorithm for the raw GEMM");
  c->algo = res.algo;
  c->algo_ws = res.workspaceSize;
  size_t written = 0;
  c->algo_id = -1;
  CB(cublasLtMatmulAlgoConfigGetAttribute(&c->algo, CUBLASLT_ALGO_CONFIG_ID, &c->algo_id,
                                          sizeof c->algo_id, &written));
}

static void raw_gemm_teardown(gemm_case *c) {
  CB(cublasLtMatmulDescDestroy(c->op));
  CB(cublasLtMatrixLayoutDestroy(c->la));
  CB(cublasLtMatrixLayoutDestroy(c->lb));
  CB(cublasLtMatrixLayoutDestroy(c->ld));
  if (c->scales) CK(cudaFree(c->scales));
}

/* a D tensor copied to the host as f32 (caller frees) */
static float *read_d(const lutra_tensor *d, int64_t n) {
  float *x = malloc((size_t)n * sizeof *x);
  if (!x) die("cannot allocate a host buffer for an output check");
  LU(lutra_tensor_get_f32(d, x, n));
  return x;
}

/* lutra's D against the raw D, both computed from the same operands. */
static void compare_outputs(const gemm_case *c) {
  int64_t n = c->m * c->n;
  float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
  if (!x || !y) die("cannot allocate host buffers for the output check");
  LU(lutra_tensor_get_f32(c->d_lutra, x, n));
  LU(lutra_tensor_get_f32(c->d_raw, y, n));
  double maxdiff = 0, maxabs = 0;
  int64_t same = 0, bad = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(x[i]) || !isfinite(y[i])) bad++;
    double d = fabs((double)x[i] - (double)y[i]);
    if (d > maxdiff) maxdiff = d;
    if (fabs((double)y[i]) > maxabs) maxabs = fabs((double)y[i]);
    if (x[i] == y[i]) same++;
  }
  free(x);
  free(y);
  printf("  check : lutra D vs raw D: max|diff| %.4g, max|D| %.4g, %.2f%% identical, %lld "
         "non-finite\n",
         maxdiff, maxabs, 100.0 * (double)same / (double)n, (long long)bad);
  if (maxabs == 0) die("the raw GEMM output is all zeros: the inputs are not random");
  if (bad) die("a GEMM output holds NaN or Inf");
  if (maxdiff > 0.05 * maxabs) die("lutra's GEMM output differs from the raw cuBLASLt output");
}

/* One GEMM problem on the bf16 operands a [N, K] and b [M, K] (shared by BF16 and FP8 runs). */
static void bench_gemm(lutra_tensor *a, lutra_tensor *b, int fp8, const lutra_recipe *cur) {
  int64_t m = b->shape[0], n = a->shape[0], k = a->shape[1];
  gemm_case c;
  memset(&c, 0, sizeof c);
  c.m = m;
  c.n = n;
  c.k = k;
  c.fp8 = fp8;
  const char *kind = fp8 ? "FP8 e4m3 x e4m3 (per-tensor) -> bf16" : "BF16 -> bf16";
  printf("\n[gemm] %s, M=%lld N=%lld K=%lld: lutra_gemm(A=[N,K] transa=1, B=[M,K] transb=0, "
         "D=[M,N]) = cuBLASLt TN m=%lld n=%lld k=%lld\n",
         kind, (long long)m, (long long)n, (long long)k, (long long)n, (long long)m, (long long)k);
  fflush(stdout);
  c.a = a;
  c.b = b;
  c.d_lutra = new_empty(m, n);
  c.d_raw = new_empty(m, n);
  if (fp8) {
    lutra_tensor *fa, *fb;
    LU(lutra_quantizer_new(cur, LUTRA_ROLE_WEIGHT, 1, 0, LUTRA_CUDA, &c.qa));
    LU(lutra_quantizer_new(cur, LUTRA_ROLE_INPUT, 1, 0, LUTRA_CUDA, &c.qb));
    LU(lutra_quantize(c.qa, c.a, &fa));
    LU(lutra_quantize(c.qb, c.b, &fb));
    if (fa->dtype != LUTRA_E4M3 || fb->dtype != LUTRA_E4M3 || fa->scaling != LUTRA_SCALING_TENSOR ||
        fb->scaling != LUTRA_SCALING_TENSOR || !fa->data || !fb->data)
      die("the current-scaling quantizers did not give per-tensor e4m3 rowwise tensors");
    float sa, sia, sb, sib;
    LU(lutra_quantizer_scale(c.qa, &sa, &sia));
    LU(lutra_quantizer_scale(c.qb, &sb, &sib));
    printf("  quantized A and B with current scaling: scale %.4g and %.4g\n", sa, sb);
    c.ga = fa;
    c.gb = fb;
  } else {
    c.ga = c.a;
    c.gb = c.b;
  }
  sync_all();
  raw_gemm_setup(&c);
  printf("  raw   : heuristic's first algorithm: config id %d, workspace %zu B (of %zu)\n",
         c.algo_id, c.algo_ws, RAW_WORKSPACE);

  bench_op ops[2] = {
      {.name = "lutra_gemm", .run = run_lutra_gemm, .ctx = &c, .on_lutra = 1},
      {.name = "cublasLtMatmul", .run = run_raw_gemm, .ctx = &c, .on_lutra = 0},
  };
  bench_group(ops, 2);
  double flop = 2.0 * (double)m * (double)n * (double)k;
  double tl = flop / ops[0].median * 1e-12, tr = flop / ops[1].median * 1e-12;
  for (int i = 0; i < 2; i++) {
    bench_op *o = &ops[i];
    printf("  %-6s: %9.2f us/call (min %.2f, max %.2f over %d batches of %d), %.1f TFLOP/s",
           i ? "raw" : "lutra", o->median * 1e6, o->min * 1e6, o->max * 1e6, BATCHES, o->reps,
           flop / o->median * 1e-12);
    if (!o->on_lutra)
      printf("; event-timed %.2f us/call = %.1f TFLOP/s", o->ev_median * 1e6,
             flop / o->ev_median * 1e-12);
    printf("\n");
  }
  printf("  lutra / raw: %.3fx\n", tl / tr);
  compare_outputs(&c);

  char what[192], lv[64], rv[64], ratio[64];
  snprintf(what, sizeof what, "GEMM %s, M=%lld N=%lld K=%lld", fp8 ? "FP8 e4m3 -> bf16" : "BF16",
           (long long)m, (long long)n, (long long)k);
  snprintf(lv, sizeof lv, "%.1f TFLOP/s", tl);
  snprintf(rv, sizeof rv, "%.1f TFLOP/s", tr);
  snprintf(ratio, sizeof ratio, "%.3fx", tl / tr);
  add_row(what, lv, rv, ratio);

  sync_all();
  raw_gemm_teardown(&c);
  if (fp8) {
    LU(lutra_quantizer_unref(c.qa));
    LU(lutra_quantizer_unref(c.qb));
  }
  LU(lutra_tensor_unref(c.d_lutra));
  LU(lutra_tensor_unref(c.d_raw));
}

/* Float8 block scaling (weight 128x128, input 1x128, TE's default block recipe) beside per-tensor
 * FP8, both through lutra_gemm on the same bf16 operands: shows whether the block-scaled GEMM
 * runs natively (near the per-tensor rate) or through the BF16 fallback (near the BF16 rate). */
static void bench_gemm_block(lutra_tensor *a, lutra_tensor *b, const lutra_recipe *cur,
                             const lutra_recipe *blk) {
  int64_t m = b->shape[0], n = a->shape[0], k = a->shape[1];
  printf("\n[gemm] FP8 e4m3 block-scaled (A 128x128, B 1x128) vs per-tensor -> bf16, M=%lld "
         "N=%lld K=%lld, both lutra_gemm TN\n",
         (long long)m, (long long)n, (long long)k);
  gemm_case c[2];
  const lutra_recipe *recipes[2] = {blk, cur};
  for (int i = 0; i < 2; i++) {
    memset(&c[i], 0, sizeof c[i]);
    c[i].m = m;
    c[i].n = n;
    c[i].k = k;
    c[i].fp8 = 1;
    c[i].a = a;
    c[i].b = b;
    c[i].d_lutra = new_empty(m, n);
    lutra_tensor *fa, *fb;
    LU(lutra_quantizer_new(recipes[i], LUTRA_ROLE_WEIGHT, 1, 0, LUTRA_CUDA, &c[i].qa));
    LU(lutra_quantizer_new(recipes[i], LUTRA_ROLE_INPUT, 1, 0, LUTRA_CUDA, &c[i].qb));
    LU(lutra_quantize(c[i].qa, a, &fa));
    LU(lutra_quantize(c[i].qb, b, &fb));
    c[i].ga = fa;
    c[i].gb = fb;
  }
  if (c[0].ga->scaling != LUTRA_SCALING_BLOCK_2D || c[0].gb->scaling != LUTRA_SCALING_BLOCK_1D)
    die("the block recipe did not give 128x128 weights and 1x128 inputs");
  sync_all();
  bench_op ops[2] = {
      {.name = "lutra_gemm block", .run = run_lutra_gemm, .ctx = &c[0], .on_lutra = 1},
      {.name = "lutra_gemm per-tensor", .run = run_lutra_gemm, .ctx = &c[1], .on_lutra = 1},
  };
  bench_group(ops, 2);
  double flop = 2.0 * (double)m * (double)n * (double)k;
  for (int i = 0; i < 2; i++)
    printf("  %-10s: %9.2f us/call (min %.2f, max %.2f), %.1f TFLOP/s\n",
           i ? "per-tensor" : "block", ops[i].median * 1e6, ops[i].min * 1e6, ops[i].max * 1e6,
           flop / ops[i].median * 1e-12);
  /* the two results agree to FP8 quantization noise */
  float *x = read_d(c[0].d_lutra, m * n), *y = read_d(c[1].d_lutra, m * n);
  double num = 0, den = 0;
  for (int64_t i = 0; i < m * n; i++) {
    double e = (double)x[i] - (double)y[i];
    num += e * e;
    den += (double)y[i] * (double)y[i];
  }
  free(x);
  free(y);
  printf("  check : NMSE(block, per-tensor) = %.3g\n", num / den);
  if (!(num / den < 1e-2)) die("block-scaled and per-tensor FP8 GEMMs disagree");
  char what[192], lv[64], rv[64], ratio[64];
  snprintf(what, sizeof what, "GEMM FP8 block-scaled (2D x 1D) -> bf16, M=%lld N=%lld K=%lld",
           (long long)m, (long long)n, (long long)k);
  snprintf(lv, sizeof lv, "%.1f TFLOP/s", flop / ops[0].median * 1e-12);
  snprintf(rv, sizeof rv, "%.1f TFLOP/s (per-tensor FP8)", flop / ops[1].median * 1e-12);
  snprintf(ratio, sizeof ratio, "%.3fx", ops[1].median / ops[0].median);
  add_row(what, lv, rv, ratio);
  sync_all();
  for (int i = 0; i < 2; i++) {
    LU(lutra_quantizer_unref(c[i].qa));
    LU(lutra_quantizer_unref(c[i].qb));
    LU(lutra_tensor_unref(c[i].d_lutra));
  }
}

/* ---- memory-bound kernels ------------------------------------------------------------- */

typedef struct quant_ctx {
  lutra_quantizer *q;
  const lutra_tensor *x;
} quant_ctx;

static void run_quantize(void *ctx) {
  quant_ctx *c = ctx;
  lutra_tensor *out;
  LU(lutra_quantize(c->q, c->x, &out));
}

typedef struct copy_ctx {
  void *dst;
  const void *src;
  size_t bytes;
} copy_ctx;

static void run_copy(void *ctx) {
  copy_ctx *c = ctx;
  CK(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, raw_stream));
}

static void bench_memory(int64_t dim, const lutra_recipe *cur, const lutra_recipe *del,
                         const lutra_recipe *mx) {
  const double n = (double)dim * (double)dim;
  /* input 2n + copy 2n + outputs (n + n + 2n + 2n + 2n + n/16), with a GiB to spare */
  double need = 12.1 * n + (double)(1ull << 30);
  size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));
  char what[192], lv[64], rv[64], ratio[64];
  if ((double)free_b < need) {
    printf("\n[memory] %lldx%lld skipped: needs %.2f GiB, %.2f GiB free\n", (long long)dim,
           (long long)dim, need / 1073741824.0, (double)free_b / 1073741824.0);
    snprintf(what, sizeof what, "memory-bound kernels, bf16 %lldx%lld", (long long)dim,
             (long long)dim);
    add_row(what, "skipped (memory)", "", "");
    return;
  }
  printf("\n[memory] bf16 input %lldx%lld: n = %.0f elements, %.1f MiB (GB = 1e9 bytes; bytes = "
         "read + written)\n",
         (long long)dim, (long long)dim, n, 2 * n / 1048576.0);
  fflush(stdout);
  lutra_tensor *x = new_randn(dim, dim, 3000 + (uint64_t)dim);
  copy_ctx cc = {.src = x->data, .bytes = (size_t)(2 * n)};
  CK(cudaMalloc(&cc.dst, cc.bytes));

  enum { COPY, CUR_ROW, DEL_ROW, CUR_RC, DEL_RC, MX_RC, NOPS };
  static const struct {
    const char *label;
    double bytes_per_elem;
    const char *count;
  } spec[NOPS] = {
      [COPY] = {"cudaMemcpyAsync D2D (raw stream)", 4.0, "read 2n + write 2n = 4n"},
      [CUR_ROW] = {"FP8 cast rowwise, current scaling (amax pass + cast)", 5.0,
                   "amax read 2n + cast read 2n + write n = 5n"},
      [DEL_ROW] = {"FP8 cast rowwise alone (delayed scaling: cast, amax fused)", 3.0,
                   "read 2n + write n = 3n"},
      [CUR_RC] = {"FP8 cast + transpose, current scaling (amax pass + cast)", 6.0,
                  "amax read 2n + cast read 2n + write n + n = 6n"},
      [DEL_RC] = {"FP8 cast + transpose alone (delayed scaling)", 4.0,
                  "read 2n + write n + n = 4n"},
      [MX_RC] = {"MXFP8 quantize rowwise + columnwise", 4.0 + 1.0 / 16.0,
                 "read 2n + write n + n + scales 2 * n/32 = 4n + n/16"},
  };
  quant_ctx qc[NOPS];
  memset(qc, 0, sizeof qc);
  LU(lutra_quantizer_new(cur, LUTRA_ROLE_INPUT, 1, 0, LUTRA_CUDA, &qc[CUR_ROW].q));
  LU(lutra_quantizer_new(del, LUTRA_ROLE_INPUT, 1, 0, LUTRA_CUDA, &qc[DEL_ROW].q));
  LU(lutra_quantizer_new(cur, LUTRA_ROLE_INPUT, 1, 1, LUTRA_CUDA, &qc[CUR_RC].q));
  LU(lutra_quantizer_new(del, LUTRA_ROLE_INPUT, 1, 1, LUTRA_CUDA, &qc[DEL_RC].q));
  LU(lutra_quantizer_new(mx, LUTRA_ROLE_INPUT, 1, 1, LUTRA_CUDA, &qc[MX_RC].q));
  bench_op ops[NOPS];
  memset(ops, 0, sizeof ops);
  for (int i = 0; i < NOPS; i++) {
    ops[i].name = spec[i].label;
    if (i == COPY) {
      ops[i].run = run_copy;
      ops[i].ctx = &cc;
      ops[i].on_lutra = 0;
    } else {
      qc[i].x = x;
      ops[i].run = run_quantize;
      ops[i].ctx = &qc[i];
      ops[i].on_lutra = 1;
    }
  }
  sync_all();
  bench_group(ops, NOPS);

  float scale, scale_inv;
  LU(lutra_quantizer_scale(qc[CUR_ROW].q, &scale, &scale_inv));
  printf("  (current-scaling scale from the input's amax: %.4g)\n", scale);
  double gbs[NOPS];
  for (int i = 0; i < NOPS; i++) {
    bench_op *o = &ops[i];
    double bytes = spec[i].bytes_per_elem * n;
    gbs[i] = bytes / o->median * 1e-9;
    printf("  %-60s %s = %.1f MB\n", spec[i].label, spec[i].count, bytes * 1e-6);
    printf("  %-60s %9.2f us/call (min %.2f, max %.2f; %d x %d), %7.1f GB/s", "", o->median * 1e6,
           o->min * 1e6, o->max * 1e6, BATCHES, o->reps, gbs[i]);
    if (i == COPY)
      printf("; event-timed %.2f us/call = %.1f GB/s\n", o->ev_median * 1e6,
             bytes / o->ev_median * 1e-9);
    else
      printf(", %.1f%% of copy\n", 100.0 * gbs[i] / gbs[COPY]);
  }
  double amax_row = ops[CUR_ROW].median - ops[DEL_ROW].median;
  double amax_rc = ops[CUR_RC].median - ops[DEL_RC].median;
  printf("  amax pass + scale kernel by difference (current - delayed): rowwise %.2f us, "
         "cast+transpose %.2f us; as 2n bytes: %.1f / %.1f GB/s\n",
         amax_row * 1e6, amax_rc * 1e6, amax_row > 0 ? 2 * n / amax_row * 1e-9 : 0.0,
         amax_rc > 0 ? 2 * n / amax_rc * 1e-9 : 0.0);

  for (int i = 0; i < NOPS; i++) {
    if (i == COPY) continue;
    snprintf(what, sizeof what, "%s, bf16 %lldx%lld (%s)", spec[i].label, (long long)dim,
             (long long)dim, spec[i].count);
    snprintf(lv, sizeof lv, "%.0f GB/s", gbs[i]);
    snprintf(rv, sizeof rv, "%.0f GB/s", gbs[COPY]);
    snprintf(ratio, sizeof ratio, "%.1f%% of copy", 100.0 * gbs[i] / gbs[COPY]);
    add_row(what, lv, rv, ratio);
  }

  sync_all();
  for (int i = 0; i < NOPS; i++)
    if (qc[i].q) LU(lutra_quantizer_unref(qc[i].q));
  CK(cudaFree(cc.dst));
  LU(lutra_tensor_unref(x));
  sync_all();
}

/* ---- main ----------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  if (argc > 2) {
    fprintf(stderr, "usage: %s [TABLE.md]\n", argv[0]);
    return 2;
  }
  /* initializes lutra's CUDA backend first (it takes the current device); says why not */
  int st = lutra_device_synchronize(LUTRA_CUDA);
  if (st != LUTRA_OK || !lutra_device_available(LUTRA_CUDA)) {
    fprintf(stderr, "cuda_throughput: lutra cannot run on CUDA here: %s: %s\n",
            lutra_status_name(st), lutra_last_error());
    return 1;
  }
  int major, minor, patch, dev, rt, drv;
  LU(lutra_version(&major, &minor, &patch));
  CK(cudaGetDevice(&dev));
  struct cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  CK(cudaRuntimeGetVersion(&rt));
  CK(cudaDriverGetVersion(&drv));
  snprintf(header, sizeof header,
           "lutra %d.%d.%d on %s (%d SMs, %.1f GiB), CUDA runtime %d, driver %d, cuBLASLt %zu; "
           "host-timed medians of %d batches",
           major, minor, patch, prop.name, prop.multiProcessorCount,
           (double)prop.totalGlobalMem / 1073741824.0, rt, drv, cublasLtGetVersion(), BATCHES);
  printf("%s\n", header);
  printf("timing: host wall clock around batches of >= %d calls (both streams synchronized "
         "before, the op's stream after), batches of each group's ops alternating\n",
         MIN_REPS);

  CK(cudaStreamCreateWithFlags(&raw_stream, cudaStreamNonBlocking));
  CK(cudaEventCreate(&ev0));
  CK(cudaEventCreate(&ev1));
  CB(cublasLtCreate(&raw_lt));
  CK(cudaMalloc(&raw_ws, RAW_WORKSPACE));

  lutra_recipe *cur = recipe_current(), *del = recipe_delayed(), *mx = recipe_mxfp8();
  lutra_block_desc bd;
  lutra_block_defaults(&bd);
  lutra_recipe *blk;
  LU(lutra_recipe_block(&bd, &blk));

  static const int64_t shapes[2][3] = {{8192, 8192, 8192}, {4096, 4096, 1024}}; /* M, N, K */
  /* LUTRA_BENCH_MEMORY_ONLY=1: the memory-bound ops only (a quicker run, e.g. to tune them) */
  const char *memory_only = getenv("LUTRA_BENCH_MEMORY_ONLY");
  for (int i = 0; i < 2 && !(memory_only && strcmp(memory_only, "1") == 0); i++) {
    int64_t m = shapes[i][0], n = shapes[i][1], k = shapes[i][2];
    lutra_tensor *a = new_randn(n, k, 1000 + (uint64_t)i); /* A [N, K] */
    lutra_tensor *b = new_randn(m, k, 2000 + (uint64_t)i); /* B [M, K] */
    bench_gemm(a, b, 0, cur);
    bench_gemm(a, b, 1, cur);
    bench_gemm_block(a, b, cur, blk);
    sync_all();
    LU(lutra_tensor_unref(a));
    LU(lutra_tensor_unref(b));
  }
  bench_memory(8192, cur, del, mx);
  bench_memory(16384, cur, del, mx);

  printf("\n");
  print_table(stdout);
  if (argc == 2) {
    FILE *f = fopen(argv[1], "w");
    if (!f) {
      perror(argv[1]);
      return 1;
    }
    print_table(f);
    if (fclose(f) != 0) {
      perror(argv[1]);
      return 1;
    }
    printf("\n(table written to %s)\n", argv[1]);
  }

  LU(lutra_recipe_unref(cur));
  LU(lutra_recipe_unref(del));
  LU(lutra_recipe_unref(mx));
  LU(lutra_recipe_unref(blk));
  CK(cudaFree(raw_ws));
  CB(cublasLtDestroy(raw_lt));
  CK(cudaEventDestroy(ev0));
  CK(cudaEventDestroy(ev1));
  CK(cudaStreamDestroy(raw_stream));
  return 0;
}
