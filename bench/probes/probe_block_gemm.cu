/* Probe: does this cuBLASLt run Float8 block-scaled GEMMs (1x128 "VEC128_32F" and 128x128
 * "BLK128x128_32F" scales) on this GPU, and in which scale layout? Runs TN GEMMs with random
 * E4M3 codes and random power-of-two scales, compares with an FP64 host reference, and times
 * the 1D x 2D case (TransformerEngine's weight x activation) beside per-tensor FP8 at 8192^3.
 *
 *   nvcc -O2 -arch=sm_90 -Ibench bench/probes/probe_block_gemm.cu -lcublasLt \
 *     -o build/probe_block_gemm
 *   build/probe_block_gemm
 *
 * Layouts tried for an operand stored row-major [R rows][C cols] (K = C, quantized along rows):
 *   "gemm-ready" (TransformerEngine's GEMM_READY): 1D [ceil(C/128)][roundup(R,4)] (row fastest),
 *                2D [ceil(R/128)][roundup(ceil(C/128),4)];
 *   "k-fast": 1D [R][ceil(C/128)], 2D [ceil(R/128)][ceil(C/128)]. */
#include <cublasLt.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8_host.h"
#include "support/checks.h"

static int64_t roundup(int64_t v, int64_t m) {
  return (v + m - 1) / m * m;
}

typedef struct operand {
  int64_t rows, cols; /* row-major [rows][cols], cols = K */
  int dim;            /* 1: 1x128 blocks, 2: 128x128 */
  uint8_t *codes;
  float *scale; /* logical: [rows][kb] (1D) or [rb][kb] (2D) */
} operand;

static void make_operand(operand *o, int64_t rows, int64_t cols, int dim) {
  o->rows = rows;
  o->cols = cols;
  o->dim = dim;
  o->codes = (uint8_t *)malloc((size_t)(rows * cols));
  for (int64_t i = 0; i < rows * cols; i++)
    o->codes[i] = random_code(0.0625f, 16.0f);
  int64_t kb = (cols + 127) / 128, sr = dim == 1 ? rows : (rows + 127) / 128;
  o->scale = (float *)malloc((size_t)(sr * kb) * sizeof(float));
  for (int64_t i = 0; i < sr * kb; i++)
    o->scale[i] = ldexpf(1.0f, (int)(next_u32() % 9) - 4);
}

static float scale_at(const operand *o, int64_t r, int64_t k) {
  int64_t kb = (o->cols + 127) / 128;
  return o->dim == 1 ? o->scale[r * kb + k / 128] : o->scale[(r / 128) * kb + k / 128];
}

/* the scale tensor in one of the two layouts; *count gets its element count */
static float *layout_scales(const operand *o, int gemm_ready, int64_t *count) {
  int64_t kb = (o->cols + 127) / 128, rb = (o->rows + 127) / 128;
  int64_t n;
  if (o->dim == 1)
    n = gemm_ready ? kb * roundup(o->rows, 4) : o->rows * kb;
  else
    n = gemm_ready ? rb * roundup(kb, 4) : rb * kb;
  float *s = (float *)calloc((size_t)n, sizeof(float));
  for (int64_t r = 0; r < (o->dim == 1 ? o->rows : rb); r++)
    for (int64_t j = 0; j < kb; j++) {
      float v = o->scale[r * kb + j];
      if (o->dim == 1)
        s[gemm_ready ? j * roundup(o->rows, 4) + r : r * kb + j] = v;
      else
        s[gemm_ready ? r * roundup(kb, 4) + j : r * kb + j] = v;
    }
  *count = n;
  return s;
}

/* cuBLAS column-major: D (m x n) = A^T (m x k) B (k x n), A stored [m][k] row-major, B [n][k];
 * mode_a/mode_b: scale modes; returns the cuBLAS status of the heuristic or the matmul */
typedef struct variant {
  cudaDataType_t d_type; /* CUDA_R_32F or CUDA_R_16BF */
  int set_fast_accum;    /* set CUBLASLT_MATMUL_DESC_FAST_ACCUM to 0 */
  int late_pointers;     /* set the scale pointers after the heuristic, as a plan cache does */
} variant;
static const variant BASE = {CUDA_R_32F, 0, 0};

static cublasStatus_t run_gemm_v(cublasLtHandle_t lt, int64_t m, int64_t n, int64_t k,
                                 const void *a, const void *b, const float *sa, const float *sb,
                                 int32_t mode_a, int32_t mode_b, void *d, void *ws, size_t ws_bytes,
                                 int reps, float *ms, variant v) {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasStatus_t st = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (st) return st;
  cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
  st =
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof mode_a);
  if (!st)
    st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b,
                                        sizeof mode_b);
  if (st) {
    cublasLtMatmulDescDestroy(op);
    return st;
  }
  cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, m, k);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, n, k);
  cublasLtMatrixLayoutCreate(&ld, v.d_type, m, n, m);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                       sizeof ws_bytes);
  cublasLtMatmulHeuristicResult_t h;
  int found = 0;
  st = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &h, &found);
  if (!st && !found) st = CUBLAS_STATUS_NOT_SUPPORTED;
  float alpha = 1.0f, beta = 0.0f;
  if (!st && v.late_pointers) {
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
  }
  if (!st) {
    st =
        cublasLtMatmul(lt, op, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &h.algo, ws, ws_bytes, 0);
    CK(cudaDeviceSynchronize());
  }
  if (!st && reps > 0) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, 0));
    for (int i = 0; i < reps; i++)
      cublasLtMatmul(lt, op, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &h.algo, ws, ws_bytes, 0);
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(ms, e0, e1));
    *ms /= (float)reps;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(op);
  return st;
}

static cublasStatus_t run_gemm(cublasLtHandle_t lt, int64_t m, int64_t n, int64_t k, const void *a,
                               const void *b, const float *sa, const float *sb, int32_t mode_a,
                               int32_t mode_b, float *d, void *ws, size_t ws_bytes, int reps,
                               float *ms) {
  return run_gemm_v(lt, m, n, k, a, b, sa, sb, mode_a, mode_b, d, ws, ws_bytes, reps, ms, BASE);
}

static void *dev_copy(const void *h, size_t bytes) {
  void *d;
  CK(cudaMalloc(&d, bytes < 256 ? 256 : bytes));
  CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
  return d;
}

/* checks one scale-mode combination in both layouts; prints which layout matches */
static void check_combo(cublasLtHandle_t lt, int dim_a, int dim_b, void *ws, size_t ws_bytes) {
  const int64_t m = 256 + 4 * 0, n = 384, k = 640; /* k: 5 blocks */
  operand A, B;
  make_operand(&A, m, k, dim_a);
  make_operand(&B, n, k, dim_b);
  double *ref = (double *)malloc((size_t)(m * n) * sizeof(double));
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0;
      for (int64_t kk = 0; kk < k; kk++)
        s += (double)e4m3_value(A.codes[i * k + kk]) * scale_at(&A, i, kk) *
             (double)e4m3_value(B.codes[j * k + kk]) * scale_at(&B, j, kk);
      ref[j * m + i] = s; /* column-major D */
    }
  void *da = dev_copy(A.codes, (size_t)(m * k)), *db = dev_copy(B.codes, (size_t)(n * k));
  float *dd;
  CK(cudaMalloc(&dd, (size_t)(m * n) * sizeof(float)));
  float *hd = (float *)malloc((size_t)(m * n) * sizeof(float));
  int32_t ma = dim_a == 1 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                          : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  int32_t mb = dim_b == 1 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                          : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  for (int gr = 1; gr >= 0; gr--) {
    int64_t ca, cb;
    float *sa = layout_scales(&A, gr, &ca), *sb = layout_scales(&B, gr, &cb);
    float *dsa = (float *)dev_copy(sa, (size_t)ca * 4),
          *dsb = (float *)dev_copy(sb, (size_t)cb * 4);
    CK(cudaMemset(dd, 0xFF, (size_t)(m * n) * sizeof(float)));
    float ms = 0;
    cublasStatus_t st = run_gemm(lt, m, n, k, da, db, dsa, dsb, ma, mb, dd, ws, ws_bytes, 0, &ms);
    if (st) {
      printf("combo A %dD x B %dD, layout %s: cuBLASLt status %d (%s)\n", dim_a, dim_b,
             gr ? "gemm-ready" : "k-fast", (int)st, cublasLtGetStatusString(st));
    } else {
      CK(cudaMemcpy(hd, dd, (size_t)(m * n) * sizeof(float), cudaMemcpyDeviceToHost));
      double num = 0, den = 0;
      for (int64_t i = 0; i < m * n; i++) {
        double e = hd[i] - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
      }
      double nmse = num / den;
      printf("combo A %dD x B %dD, layout %s: runs, NMSE vs FP64 %.3g -> %s\n", dim_a, dim_b,
             gr ? "gemm-ready" : "k-fast", nmse, nmse < 1e-6 ? "MATCH" : "wrong");
    }
    CK(cudaFree(dsa));
    CK(cudaFree(dsb));
    free(sa);
    free(sb);
  }
  CK(cudaFree(da));
  CK(cudaFree(db));
  CK(cudaFree(dd));
  free(hd);
  free(ref);
  free(A.codes);
  free(A.scale);
  free(B.codes);
  free(B.scale);
}

static void time_big(cublasLtHandle_t lt, void *ws, size_t ws_bytes) {
  const int64_t s = 8192;
  void *a, *b;
  float *d, *sa, *sb, *one;
  CK(cudaMalloc(&a, (size_t)(s * s)));
  CK(cudaMalloc(&b, (size_t)(s * s)));
  CK(cudaMemset(a, 0x38, (size_t)(s * s))); /* E4M3 1.0 */
  CK(cudaMemset(b, 0x38, (size_t)(s * s)));
  CK(cudaMalloc(&d, (size_t)(s * s) * sizeof(float)));
  int64_t na = (s / 128) * roundup(s / 128, 4), nb = (s / 128) * roundup(s, 4);
  float *h = (float *)malloc((size_t)nb * sizeof(float));
  for (int64_t i = 0; i < nb; i++)
    h[i] = 1.0f;
  sa = (float *)dev_copy(h, (size_t)na * 4);
  sb = (float *)dev_copy(h, (size_t)nb * 4);
  one = (float *)dev_copy(h, 16);
  float ms_block = 0, ms_tensor = 0;
  cublasStatus_t st1 =
      run_gemm(lt, s, s, s, a, b, sa, sb, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
               CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, d, ws, ws_bytes, 20, &ms_block);
  cublasStatus_t st2 =
      run_gemm(lt, s, s, s, a, b, one, one, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F,
               CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, d, ws, ws_bytes, 20, &ms_tensor);
  double flop = 2.0 * s * s * s;
  printf("8192^3 f32 out: block 2Dx1D status %d %.1f TFLOP/s; per-tensor FP8 status %d %.1f "
         "TFLOP/s\n",
         (int)st1, st1 ? 0.0 : flop / (ms_block * 1e-3) / 1e12, (int)st2,
         st2 ? 0.0 : flop / (ms_tensor * 1e-3) / 1e12);
  free(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(d);
  cudaFree(sa);
  cudaFree(sb);
  cudaFree(one);
}

int main(void) {
  cublasLtHandle_t lt;
  if (cublasLtCreate(&lt)) {
    printf("cublasLtCreate failed\n");
    return 1;
  }
  printf("cuBLASLt version %zu\n", cublasLtGetVersion());
  size_t ws_bytes = 32u << 20;
  void *ws;
  CK(cudaMalloc(&ws, ws_bytes));
  check_combo(lt, 1, 1, ws, ws_bytes);
  check_combo(lt, 2, 1, ws, ws_bytes);
  check_combo(lt, 1, 2, ws, ws_bytes);
  check_combo(lt, 2, 2, ws, ws_bytes);
  time_big(lt, ws, ws_bytes);
  cudaFree(ws);
  cublasLtDestroy(lt);
  return 0;
}
