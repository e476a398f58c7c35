/* Probe: does this cuBLASLt run FP8 GEMMs with rowwise scaling (torchao's ROWWISE: one f32 scale
 * per row of A and per column of B, cuBLASLt's CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F) on
 * this GPU? Runs TN GEMMs D[m, n] = a_scale[m] b_scale[n] sum_k A[m, k] B[n, k] with random E4M3
 * codes and random scales for a few shapes and output types, compares each with an FP64 host
 * reference, and times the largest beside per-tensor FP8 of the same shape.
 *
 *   nvcc -O2 -arch=sm_90 -Ibench bench/probes/probe_rowwise.cu -lcublasLt -o build/probe_rowwise
 *   build/probe_rowwise [M N K]        (default shapes 256x512x1024 and 4096^3)
 *
 * Prints one line per case: "supported" with the max relative error, or the status the
 * heuristic or the matmul gave ("not supported": lutra then dequantizes rowwise operands to
 * BF16, as it does MXFP8 on Hopper). Exit status 0 when every case ran and matched (1e-2 relative
 * for BF16 outputs, 1e-5 for F32), 2 when the mode is not supported, 1 on a mismatch. */
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

static float bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

typedef struct {
  cublasStatus_t status; /* of the heuristic, then of the matmul */
  int found;
  double max_rel;
  /* the same error under other readings of the scale vectors, to tell a layout question from
   * a wrong result: A's vector along N and B's along M (swapped), no scales at all, and the
   * vectors divided rather than multiplied */
  double rel_swapped, rel_unscaled, rel_divided;
  double ms; /* per GEMM, when timed */
} result;

/* outer: rowwise (outer-vector) scales, else one scale per tensor */
static result run(cublasLtHandle_t lt, int M, int N, int K, bool outer, cudaDataType_t dtype,
                  bool check, int reps) {
  result r = {CUBLAS_STATUS_SUCCESS, 0, 0.0, 0.0, 0.0, 0.0, 0.0};
  const int L = M > N ? M : N; /* both vectors get L entries: the swapped reading stays in bounds */
  size_t na = (size_t)M * K, nb = (size_t)N * K, nd = (size_t)M * N;
  uint8_t *ha = (uint8_t *)malloc(na), *hb = (uint8_t *)malloc(nb);
  float *hsa = (float *)malloc(sizeof(float) * L), *hsb = (float *)malloc(sizeof(float) * L);
  for (size_t i = 0; i < na; i++)
    ha[i] = random_code(0.0f, 16.0f);
  for (size_t i = 0; i < nb; i++)
    hb[i] = random_code(0.0f, 16.0f);
  for (int i = 0; i < L; i++)
    hsa[i] =
        outer ? ldexpf(1.0f + (next_u32() % 1000) / 1000.0f, (int)(next_u32() % 7) - 3) : 0.75f;
  for (int i = 0; i < L; i++)
    hsb[i] =
        outer ? ldexpf(1.0f + (next_u32() % 1000) / 1000.0f, (int)(next_u32() % 7) - 3) : 1.25f;
  uint8_t *a, *b;
  float *sa, *sb;
  void *d, *ws;
  size_t esize = dtype == CUDA_R_32F ? 4 : 2, ws_bytes = 32u << 20;
  CK(cudaMalloc(&a, na));
  CK(cudaMalloc(&b, nb));
  CK(cudaMalloc(&sa, sizeof(float) * (outer ? L : 1)));
  CK(cudaMalloc(&sb, sizeof(float) * (outer ? L : 1)));
  CK(cudaMalloc(&d, nd * esize));
  CK(cudaMalloc(&ws, ws_bytes));
  CK(cudaMemcpy(a, ha, na, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(b, hb, nb, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(sa, hsa, sizeof(float) * (outer ? L : 1), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(sb, hsb, sizeof(float) * (outer ? L : 1), cudaMemcpyHostToDevice));

  /* column-major for cuBLASLt: A stored [M][K] row-major is K x M with op T; B [N][K] is K x N
   * with op N... as TN in TransformerEngine's naming: D (M x N col-major) = A^T B */
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  int32_t mode =
      outer ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  r.status =
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode);
  if (r.status == CUBLAS_STATUS_SUCCESS)
    r.status =
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
  cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, K, M, K);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, K, N, K);
  cublasLtMatrixLayoutCreate(&ld, dtype, M, N, M);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                       sizeof ws_bytes);
  cublasLtMatmulHeuristicResult_t h;
  if (r.status == CUBLAS_STATUS_SUCCESS)
    r.status = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &h, &r.found);
  float alpha = 1.0f, beta = 0.0f;
  if (r.status == CUBLAS_STATUS_SUCCESS && r.found) {
    r.status =
        cublasLtMatmul(lt, op, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &h.algo, ws, ws_bytes, 0);
    if (cudaDeviceSynchronize() != cudaSuccess && r.status == CUBLAS_STATUS_SUCCESS)
      r.status = CUBLAS_STATUS_EXECUTION_FAILED;
  }
  if (r.status == CUBLAS_STATUS_SUCCESS && r.found && check) {
    void *hd = malloc(nd * esize);
    CK(cudaMemcpy(hd, d, nd * esize, cudaMemcpyDeviceToHost));
    for (int j = 0; j < N; j++)
      for (int i = 0; i < M; i++) {
        double acc = 0;
        for (int k = 0; k < K; k++)
          acc += (double)e4m3_value(ha[(size_t)i * K + k]) * e4m3_value(hb[(size_t)j * K + k]);
        double want = acc * hsa[outer ? i : 0] * hsb[outer ? j : 0];
        size_t at = (size_t)j * M + i;
        double got = dtype == CUDA_R_32F ? ((float *)hd)[at] : bf16_to_f32(((uint16_t *)hd)[at]);
        double rel = fabs(got - want) / fmax(fabs(want), 1.0);
        if (rel > r.max_rel) r.max_rel = rel;
        const double swapped = acc * hsa[outer ? j : 0] * hsb[outer ? i : 0];
        const double divided = acc / (hsa[outer ? i : 0] * hsb[outer ? j : 0]);
        r.rel_swapped = fmax(r.rel_swapped, fabs(got - swapped) / fmax(fabs(swapped), 1.0));
        r.rel_unscaled = fmax(r.rel_unscaled, fabs(got - acc) / fmax(fabs(acc), 1.0));
        r.rel_divided = fmax(r.rel_divided, fabs(got - divided) / fmax(fabs(divided), 1.0));
      }
    free(hd);
  }
  if (r.status == CUBLAS_STATUS_SUCCESS && r.found && reps > 0) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0, 0);
    for (int i = 0; i < reps; i++)
      cublasLtMatmul(lt, op, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &h.algo, ws, ws_bytes, 0);
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    r.ms = ms / reps;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(op);
  cudaFree(a), cudaFree(b), cudaFree(sa), cudaFree(sb), cudaFree(d), cudaFree(ws);
  free(ha), free(hb), free(hsa), free(hsb);
  return r;
}

int main(int argc, char **argv) {
  int shapes[2][3] = {{256, 512, 1024}, {4096, 4096, 4096}};
  int nshapes = 2;
  if (argc == 4) {
    shapes[0][0] = atoi(argv[1]), shapes[0][1] = atoi(argv[2]), shapes[0][2] = atoi(argv[3]);
    nshapes = 1;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s (sm_%d%d), cuBLASLt %zu\n", prop.name, prop.major, prop.minor, cublasLtGetVersion());
  cublasLtHandle_t lt;
  cublasLtCreate(&lt);
  int status = 0;
  for (int s = 0; s < nshapes; s++) {
    int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
    bool big = (double)M * N * K > 1e9; /* no FP64 host reference there: timing only */
    for (int t = 0; t < 2; t++) {
      cudaDataType_t dt = t ? CUDA_R_32F : CUDA_R_16BF;
      result r = run(lt, M, N, K, true, dt, !big, big ? 20 : 0);
      const char *dn = t ? "f32" : "bf16";
      if (r.status != CUBLAS_STATUS_SUCCESS || !r.found) {
        printf("rowwise %dx%dx%d -> %s: not supported (%s, %d algorithms)\n", M, N, K, dn,
               cublasLtGetStatusString(r.status), r.found);
        status = status ? status : 2;
        continue;
      }
      double tol = t ? 1e-5 : 1e-2;
      if (big) {
        result p = run(lt, M, N, K, false, dt, false, 20);
        printf("rowwise %dx%dx%d -> %s: supported, %.3f ms (per-tensor FP8 %.3f ms)\n", M, N, K, dn,
               r.ms, p.ms);
      } else {
        printf("rowwise %dx%dx%d -> %s: supported, max relative error %.3g (%s); read as swapped "
               "vectors %.3g, unscaled %.3g, divided %.3g\n",
               M, N, K, dn, r.max_rel, r.max_rel <= tol ? "ok" : "MISMATCH", r.rel_swapped,
               r.rel_unscaled, r.rel_divided);
        if (r.max_rel > tol) status = 1;
      }
    }
  }
  cublasLtDestroy(lt);
  return status;
}
