/* Host-side floors of issuing GPU work: what the raw CUDA / cuBLASLt calls that lutra issues
 * cost on the host. A shared library that bench/host_overhead.lua loads into its own process
 * (LuaJIT FFI) and times exactly as it times lutra, batch for batch alternating with the lutra
 * figure the floor belongs to: a floor measured by another process landed on another core and
 * moved by 10-35% between runs (git history has the runs), more than the ratios it was for.
 *
 * Build (from the repository root; bench/host_suite.sh does this):
 *   nvcc -std=c++17 -arch=sm_90 -O2 -shared -Xcompiler -fPIC -cudart shared \
 *     bench/host_floors.cu bench/host_replay.cu -o build/libhost_floors.so -lcublasLt -lcuda
 * (-cudart shared: the same libcudart.so that liblutra.so calls, not nvcc's static default;
 * bench/host_replay.cu adds the replay floors, the captured launches of one lutra call issued
 * again raw, and needs the driver API: -lcuda.)
 *
 * API (extern "C"; each returns 0, or 1 after printing the failed call to stderr):
 *   hf_init(M, K, N)        creates a stream, the operands, the GEMM plans and the graph, for
 *                           the Linear shapes of host_overhead.lua (input [M, K], weight [N, K],
 *                           output [M, N]; multiples of 16)
 *   hf_issue(floor, calls)  issues `calls` times the raw work of one floor, without waiting
 *   hf_sync()               waits for the floors' stream
 *   hf_describe()           the device and versions, one line
 *   hf_replay_*             the replay floors: one lutra call's launches captured and issued
 *                           again raw (bench/host_replay.cu, same library, its own stream)
 * The floors (enum hf_floor, names in hf_names for the Lua side):
 *   launch          empty kernel <<<1, 32>>> + cudaGetLastError (as lutra checks each launch)
 *   launch_big      a kernel with 7 KiB of parameters (a multi-tensor optimizer launch)
 *   memset          cudaMemsetAsync of 4 bytes
 *   memcpy          cudaMemcpyAsync of 256 bytes device to device
 *   lt_bf16_fprop   cublasLtMatmul BF16 -> BF16, the Linear's forward:  TN, m=M n=N k=K
 *   lt_bf16_dgrad   the same for dgrad:  NN, m=M n=K k=N
 *   lt_bf16_wgrad   the same for wgrad:  NT, m=N n=K k=M
 *   lt_fp8_fprop    E4M3 x E4M3 -> BF16, TN, fast accumulation (lutra's fprop setting)
 *   lt_fp8_dgrad    E4M3 (W^T) x E5M2 (dy) -> BF16, TN, m=M n=K k=N
 *   lt_fp8_wgrad    E4M3 (x^T) x E5M2 (dy^T) -> BF16, TN, m=N n=K k=M
 *   lt_set_attr     one cublasLtMatmulDescSetAttribute (lutra sets the two FP8 scale pointers
 *                   per GEMM; not a launch: for reading the FP8 figures)
 *   graph_launch    cudaGraphLaunch of a captured graph of 4 empty kernels
 *   graph_launch1   cudaGraphLaunch of a captured graph of 1 empty kernel (lutra's cached calls
 *                   are graphs of 1-3 nodes: their floor, the cheapest graph launch)
 * and the GEMMs with the epilogues lutra's MLP uses (the bias and aux pointers set per call, as
 * lutra sets them):
 *   lt_bf16_fprop_bias, lt_bf16_fprop_gelu_aux_bias   BIAS, GELU_AUX_BIAS (aux BF16)
 *   lt_bf16_dgrad_dgelu                               DGELU (aux BF16)
 *   lt_bf16_wgrad_bgradb                              BGRADB (the bias gradient of dy)
 *   lt_fp8_fprop_bias, lt_fp8_fprop_gelu_aux_bias     the FP8 fprop with BIAS, GELU_AUX_BIAS
 * A floor whose GEMM the heuristic refuses is left out (hf_available says which).
 * (m, n, k as in lutra_gemm: row-major D [m, n] = op(B) [m, k] @ op(A) [k, n].) Every GEMM uses
 * the heuristic's first algorithm for a 32 MiB workspace, chosen once in hf_init, and 16-byte
 * aligned scale pointers for FP8 (cuBLASLt 13.1 refuses 4-byte aligned ones with
 * CUBLAS_STATUS_NOT_SUPPORTED on the H200). */
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "host_checks.h"

/* ---- kernels -------------------------------------------------------------------------- */

__global__ void empty_kernel() {}

struct BigParams {
  char bytes[7 * 1024];
};
__global__ void big_kernel(BigParams p) {
  if (threadIdx.x == 0 && p.bytes[0] == 1) p.bytes[1] = 0; /* reads its argument */
}

/* ---- cuBLASLt GEMMs in lutra's convention ---------------------------------------------- */

static const size_t WORKSPACE = (size_t)32 << 20;
static cudaStream_t g_stream;
static cublasLtHandle_t g_lt;
static void *g_ws;
static const float ONE = 1.0f, ZERO = 0.0f;

struct Gemm {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulAlgo_t algo;
  const void *a, *b;
  void *d;
  bool ready;
  /* per-call epilogue pointers (NULL: none), set before each call as lutra does */
  void *bias, *aux;
};

/* an epilogue and where its operands live */
struct Epilogue {
  cublasLtEpilogue_t kind;
  void *bias; /* bias, or the bias gradient for BGRADB */
  void *aux;  /* [m, n] BF16 */
};

/* Row-major D [m, n] = op(B) [m, k] @ op(A) [k, n], A stored [n, k] when transa else [k, n],
 * B stored [k, m] when transb else [m, k]: cuBLASLt column-major D^T = op(A)^T op(B)^T with
 * the same flags, as lutra's plans build it. scales: FP8 A and B scale pointers, or NULL. */
static int make_gemm(Gemm &g, cudaDataType_t ta, cudaDataType_t tb, int transa, int transb,
                     int64_t m, int64_t n, int64_t k, int fast_accum, const float *scales,
                     const void *a, const void *b, void *d, Epilogue epi = Epilogue{}) {
  memset(&g, 0, sizeof g);
  g.a = a;
  g.b = b;
  g.d = d;
  CB(cublasLtMatmulDescCreate(&g.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t opa = transa ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  CB(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  CB(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  if (scales) {
    int8_t fast = (int8_t)fast_accum;
    CB(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
    const float *sa = scales, *sb = scales + 4; /* 16 bytes apart */
    CB(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
    CB(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
  }
  if (epi.kind != CUBLASLT_EPILOGUE_DEFAULT) {
    CB(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi.kind,
                                      sizeof epi.kind));
    cudaDataType_t bf = CUDA_R_16BF;
    if (epi.bias) {
      CB(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bf, sizeof bf));
      g.bias = epi.bias;
    }
    if (epi.aux) {
      int64_t ld = n;
      CB(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                        sizeof ld));
      if (scales)
        CB(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &bf,
                                          sizeof bf));
      g.aux = epi.aux;
    }
  }
  int64_t ra = transa ? n : k, ca = transa ? k : n; /* stored row-major shapes */
  int64_t rb = transb ? k : m, cb = transb ? m : k;
  CB(cublasLtMatrixLayoutCreate(&g.la, ta, (uint64_t)ca, (uint64_t)ra, ca));
  CB(cublasLtMatrixLayoutCreate(&g.lb, tb, (uint64_t)cb, (uint64_t)rb, cb));
  CB(cublasLtMatrixLayoutCreate(&g.ld, CUDA_R_16BF, (uint64_t)n, (uint64_t)m, n));
  cublasLtMatmulPreference_t pref;
  CB(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = WORKSPACE;
  CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                          sizeof ws));
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  cublasStatus_t h =
      cublasLtMatmulAlgoGetHeuristic(g_lt, g.op, g.la, g.lb, g.ld, g.ld, pref, 1, &res, &found);
  CB(cublasLtMatmulPreferenceDestroy(pref));
  if (h != CUBLAS_STATUS_SUCCESS || found < 1) {
    if (epi.kind != CUBLASLT_EPILOGUE_DEFAULT) return 0; /* left out: not ready */
    fprintf(stderr, "host_floors: the cuBLASLt heuristic found no algorithm\n");
    return 1;
  }
  g.algo = res.algo;
  g.ready = true;
  /* the algorithm's identity, as lutra prints its plans' with LUTRA_LOG_PLANS=1 */
  static const cublasLtMatmulAlgoConfigAttributes_t attr[4] = {
      CUBLASLT_ALGO_CONFIG_ID, CUBLASLT_ALGO_CONFIG_TILE_ID, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
      CUBLASLT_ALGO_CONFIG_STAGES_ID};
  int32_t f[4];
  for (int i = 0; i < 4; i++) {
    size_t got = 0;
    uint32_t v = 0;
    f[i] = cublasLtMatmulAlgoConfigGetAttribute(&g.algo, attr[i], &v, sizeof v, &got) ==
                   CUBLAS_STATUS_SUCCESS
               ? (int32_t)v
               : -1;
  }
  fprintf(stderr,
          "host_floors: GEMM m=%lld n=%lld k=%lld %c%c epilogue %d: algo %d tile %d "
          "splitk %d stages %d\n",
          (long long)m, (long long)n, (long long)k, transa ? 'T' : 'N', transb ? 'T' : 'N',
          (int)epi.kind, f[0], f[1], f[2], f[3]);
  return 0;
}

static int run_gemm(const Gemm &g) {
  if (g.bias)
    CB(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias,
                                      sizeof g.bias));
  if (g.aux)
    CB(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux,
                                      sizeof g.aux));
  CB(cublasLtMatmul(g_lt, g.op, &ONE, g.a, g.la, g.b, g.lb, &ZERO, g.d, g.ld, g.d, g.ld, &g.algo,
                    g_ws, WORKSPACE, g_stream));
  return 0;
}

/* ---- the floors ----------------------------------------------------------------------- */

enum hf_floor {
  LAUNCH,
  LAUNCH_BIG,
  MEMSET,
  MEMCPY,
  LT_BF16_FPROP,
  LT_BF16_DGRAD,
  LT_BF16_WGRAD,
  LT_FP8_FPROP,
  LT_FP8_DGRAD,
  LT_FP8_WGRAD,
  LT_SET_ATTR,
  GRAPH_LAUNCH,
  LT_BF16_FPROP_BIAS,
  LT_BF16_FPROP_GELU_AUX_BIAS,
  LT_BF16_DGRAD_DGELU,
  LT_BF16_WGRAD_BGRADB,
  LT_FP8_FPROP_BIAS,
  LT_FP8_FPROP_GELU_AUX_BIAS,
  GRAPH_LAUNCH1,
  N_FLOORS
};
EXPORT const char *const hf_names[N_FLOORS + 1] = {"launch",
                                                   "launch_big",
                                                   "memset",
                                                   "memcpy",
                                                   "lt_bf16_fprop",
                                                   "lt_bf16_dgrad",
                                                   "lt_bf16_wgrad",
                                                   "lt_fp8_fprop",
                                                   "lt_fp8_dgrad",
                                                   "lt_fp8_wgrad",
                                                   "lt_set_attr",
                                                   "graph_launch",
                                                   "lt_bf16_fprop_bias",
                                                   "lt_bf16_fprop_gelu_aux_bias",
                                                   "lt_bf16_dgrad_dgelu",
                                                   "lt_bf16_wgrad_bgradb",
                                                   "lt_fp8_fprop_bias",
                                                   "lt_fp8_fprop_gelu_aux_bias",
                                                   "graph_launch1",
                                                   NULL};

static Gemm g_gemm[N_FLOORS]; /* indexed by the lt_* floors */
static void *g_scratch;
static const float *g_scale;
static cudaGraphExec_t g_graph, g_graph1;
static BigParams g_big;
static char g_describe[512];

EXPORT int hf_init(int64_t M, int64_t K, int64_t N) {
  if (g_stream) return 0;
  if (M % 16 || K % 16 || N % 16 || M < 16 || K < 16 || N < 16) {
    fprintf(stderr, "host_floors: FP8 GEMMs need M, K and N positive multiples of 16\n");
    return 1;
  }
  int dev, rt, drv;
  cudaDeviceProp prop;
  CK(cudaGetDevice(&dev));
  CK(cudaGetDeviceProperties(&prop, dev));
  CK(cudaRuntimeGetVersion(&rt));
  CK(cudaDriverGetVersion(&drv));
  snprintf(g_describe, sizeof g_describe, "%s, CUDA runtime %d, driver %d, cuBLASLt %zu", prop.name,
           rt, drv, cublasLtGetVersion());

  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  CB(cublasLtCreate(&g_lt));
  CK(cudaMalloc(&g_ws, WORKSPACE));
  /* operands: every matrix fits in max(M, K, N)^2 elements of up to 4 bytes; zeros are valid
   * BF16 and FP8 values */
  int64_t dim = std::max(M, std::max(K, N));
  size_t bytes = (size_t)(dim * dim * 4);
  void *x, *w, *dy, *y, *aux, *bias;
  CK(cudaMalloc(&aux, bytes));
  CK(cudaMalloc(&bias, 4 * (size_t)dim));
  CK(cudaMemset(bias, 0, 4 * (size_t)dim));
  CK(cudaMemset(aux, 0, bytes));
  CK(cudaMalloc(&x, bytes));
  CK(cudaMalloc(&w, bytes));
  CK(cudaMalloc(&dy, bytes));
  CK(cudaMalloc(&y, bytes));
  CK(cudaMalloc(&g_scratch, 4096));
  CK(cudaMemset(x, 0, bytes));
  CK(cudaMemset(w, 0, bytes));
  CK(cudaMemset(dy, 0, bytes));
  float *scales;
  CK(cudaMalloc((void **)&scales, 256)); /* 256-byte aligned: [0] and [4] are 16-byte aligned */
  const float ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  CK(cudaMemcpy(scales, ones, sizeof ones, cudaMemcpyHostToDevice));
  g_scale = scales;

  const cudaDataType_t BF = CUDA_R_16BF, E4 = CUDA_R_8F_E4M3, E5 = CUDA_R_8F_E5M2;
  /* the Linear's three GEMMs: fprop TN (A = W [N, K]), dgrad NN (A = W, B = dy [M, N]),
   * wgrad NT (A = x [M, K], B = dy); FP8 runs TN only, on the columnwise (transposed) copies */
  TRY(make_gemm(g_gemm[LT_BF16_FPROP], BF, BF, 1, 0, M, N, K, 0, NULL, w, x, y));
  TRY(make_gemm(g_gemm[LT_BF16_DGRAD], BF, BF, 0, 0, M, K, N, 0, NULL, w, dy, y));
  TRY(make_gemm(g_gemm[LT_BF16_WGRAD], BF, BF, 0, 1, N, K, M, 0, NULL, x, dy, y));
  TRY(make_gemm(g_gemm[LT_FP8_FPROP], E4, E4, 1, 0, M, N, K, 1, scales, w, x, y));
  TRY(make_gemm(g_gemm[LT_FP8_DGRAD], E4, E5, 1, 0, M, K, N, 0, scales, w, dy, y));
  TRY(make_gemm(g_gemm[LT_FP8_WGRAD], E4, E5, 1, 0, N, K, M, 0, scales, x, dy, y));
  const Epilogue bias_e = {CUBLASLT_EPILOGUE_BIAS, bias, NULL};
  const Epilogue gelu_aux_bias = {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, aux};
  TRY(make_gemm(g_gemm[LT_BF16_FPROP_BIAS], BF, BF, 1, 0, M, N, K, 0, NULL, w, x, y, bias_e));
  TRY(make_gemm(g_gemm[LT_BF16_FPROP_GELU_AUX_BIAS], BF, BF, 1, 0, M, N, K, 0, NULL, w, x, y,
                gelu_aux_bias));
  TRY(make_gemm(g_gemm[LT_BF16_DGRAD_DGELU], BF, BF, 0, 0, M, K, N, 0, NULL, w, dy, y,
                Epilogue{CUBLASLT_EPILOGUE_DGELU, NULL, aux}));
  TRY(make_gemm(g_gemm[LT_BF16_WGRAD_BGRADB], BF, BF, 0, 1, N, K, M, 0, NULL, x, dy, y,
                Epilogue{CUBLASLT_EPILOGUE_BGRADB, bias, NULL}));
  TRY(make_gemm(g_gemm[LT_FP8_FPROP_BIAS], E4, E4, 1, 0, M, N, K, 1, scales, w, x, y, bias_e));
  TRY(make_gemm(g_gemm[LT_FP8_FPROP_GELU_AUX_BIAS], E4, E4, 1, 0, M, N, K, 1, scales, w, x, y,
                gelu_aux_bias));

  cudaGraph_t graph;
  CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 4; i++)
    empty_kernel<<<1, 32, 0, g_stream>>>();
  CK(cudaStreamEndCapture(g_stream, &graph));
  CK(cudaGraphInstantiate(&g_graph, graph, 0));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
  empty_kernel<<<1, 32, 0, g_stream>>>();
  CK(cudaStreamEndCapture(g_stream, &graph));
  CK(cudaGraphInstantiate(&g_graph1, graph, 0));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamSynchronize(g_stream));
  return 0;
}

EXPORT const char *hf_describe(void) {
  return g_describe;
}

/* 1 when the floor can be issued (an epilogue GEMM the heuristic refused cannot) */
EXPORT int hf_available(int floor) {
  if (floor < 0 || floor >= N_FLOORS) return 0;
  if (floor == LT_SET_ATTR) return g_gemm[LT_FP8_FPROP].ready;
  if (floor >= LT_BF16_FPROP && floor <= LT_FP8_WGRAD) return g_gemm[floor].ready;
  if (floor >= LT_BF16_FPROP_BIAS && floor <= LT_FP8_FPROP_GELU_AUX_BIAS)
    return g_gemm[floor].ready;
  return 1;
}

EXPORT int hf_sync(void) {
  CK(cudaStreamSynchronize(g_stream));
  return 0;
}

EXPORT int hf_issue(int floor, int calls) {
  if (!g_stream || !hf_available(floor)) {
    fprintf(stderr, "host_floors: hf_issue(%d) before hf_init, not a floor, or not available\n",
            floor);
    return 1;
  }
  for (int i = 0; i < calls; i++) {
    switch (floor) {
    case LAUNCH:
      empty_kernel<<<1, 32, 0, g_stream>>>();
      CK(cudaGetLastError());
      break;
    case LAUNCH_BIG:
      big_kernel<<<1, 32, 0, g_stream>>>(g_big);
      CK(cudaGetLastError());
      break;
    case MEMSET:
      CK(cudaMemsetAsync(g_scratch, 0, 4, g_stream));
      break;
    case MEMCPY:
      CK(cudaMemcpyAsync((char *)g_scratch + 2048, g_scratch, 256, cudaMemcpyDeviceToDevice,
                         g_stream));
      break;
    case LT_SET_ATTR:
      CB(cublasLtMatmulDescSetAttribute(
          g_gemm[LT_FP8_FPROP].op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g_scale, sizeof g_scale));
      break;
    case GRAPH_LAUNCH:
      CK(cudaGraphLaunch(g_graph, g_stream));
      break;
    case GRAPH_LAUNCH1:
      CK(cudaGraphLaunch(g_graph1, g_stream));
      break;
    default:
      TRY(run_gemm(g_gemm[floor]));
    }
  }
  return 0;
}
