/* Host-side floors of issuing GPU work: what the raw CUDA / cuBLASLt calls that lutra issues
 * cost on the host, measured exactly as bench/host_overhead.lua measures lutra.
 *
 * Build (from the repository root; bench/host_suite.sh does this):
 *   nvcc -std=c++17 -arch=sm_90 -O2 -cudart shared bench/host_floors.cu -o build/host_floors \
 *     -lcublasLt
 * (-cudart shared: the same libcudart.so that liblutra.so calls, not nvcc's static default.)
 * Run:
 *   build/host_floors [--batch M] [--in K] [--out N] [--calls C] [--batches B]
 * M, K, N are the Linear shapes of bench/host_overhead.lua (input [M, K], weight [N, K],
 * output [M, N]; defaults 64, 64, 64). Keep them small: the GPU time of one call must stay
 * under its host time, or the queue fills and the host waits on the GPU.
 *
 * Output: one machine-readable line per floor,
 *   floor <name> <median us/call> min=<us> max=<us> calls=<C> span=<us>  # what it is
 * (span: wall time from an event before the batch to an event after it, per call: when it is
 * well above the host figure the GPU, not the host, sets the pace; a warning says so), and
 * '#' lines with the device and the method. The floors:
 *   launch          empty kernel <<<1, 32>>> + cudaGetLastError (as lutra checks each launch)
 *   launch_big      a kernel with 7 KiB of parameters (a multi-tensor optimizer launch)
 *   memset          cudaMemsetAsync of 4 bytes (current scaling zeroes its amax)
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
 * (m, n, k as in lutra_gemm: row-major D [m, n] = op(B) [m, k] @ op(A) [k, n].) Every GEMM uses
 * the heuristic's first algorithm for a 32 MiB workspace, chosen once before timing, and
 * 16-byte aligned scale pointers for FP8 (cuBLASLt 13.1 refuses 4-byte aligned ones with
 * CUBLAS_STATUS_NOT_SUPPORTED on the H200).
 *
 * Method (the same as host_overhead.lua): per floor, one warm-up batch, then B batches (default
 * 15) of C calls (default 200), the stream synchronized before each batch so the queue starts
 * empty; the host wall time of the batch's loop divided by C; the median over the batches.
 * Every CUDA and cuBLASLt status is checked; a failure names the call and exits with 1. */
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>

/* ---- status checks -------------------------------------------------------------------- */

#define CK(call)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "host_floors.cu:%d: %s failed: %s (%s)\n", __LINE__, #call,                  \
              cudaGetErrorString(e_), cudaGetErrorName(e_));                                       \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)
#define CB(call)                                                                                   \
  do {                                                                                             \
    cublasStatus_t s_ = (call);                                                                    \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                             \
      fprintf(stderr, "host_floors.cu:%d: %s failed: cuBLASLt status %d %s (%s)\n", __LINE__,      \
              #call, (int)s_, cublasLtGetStatusName(s_), cublasLtGetStatusString(s_));             \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static void die(const char *msg) {
  fprintf(stderr, "host_floors: %s\n", msg);
  exit(1);
}

/* ---- kernels -------------------------------------------------------------------------- */

__global__ void empty_kernel() {}

struct BigParams {
  char bytes[7 * 1024];
};
__global__ void big_kernel(BigParams p) {
  if (threadIdx.x == 0 && p.bytes[0] == 1) p.bytes[1] = 0; /* reads its argument */
}

/* ---- timing --------------------------------------------------------------------------- */

static int g_batches = 15, g_calls = 200;
static cudaStream_t g_stream;
static cudaEvent_t g_ev0, g_ev1;

static double now_us() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

/* Times fn (one call) as described at the top and prints the floor line. */
template <typename F> static double bench(const char *name, const char *what, int calls, F &&fn) {
  CK(cudaStreamSynchronize(g_stream));
  for (int i = 0; i < calls; i++)
    fn(); /* warm-up batch */
  CK(cudaStreamSynchronize(g_stream));
  std::vector<double> us(g_batches), span(g_batches);
  for (int b = 0; b < g_batches; b++) {
    CK(cudaStreamSynchronize(g_stream));
    CK(cudaEventRecord(g_ev0, g_stream));
    double t0 = now_us();
    for (int i = 0; i < calls; i++)
      fn();
    double t1 = now_us();
    CK(cudaEventRecord(g_ev1, g_stream));
    CK(cudaEventSynchronize(g_ev1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, g_ev0, g_ev1));
    us[b] = (t1 - t0) / calls;
    span[b] = (double)ms * 1e3 / calls;
  }
  std::vector<double> sorted = us;
  std::sort(sorted.begin(), sorted.end());
  std::sort(span.begin(), span.end());
  double med = sorted[g_batches / 2], med_span = span[g_batches / 2];
  printf("floor %s %.4f min=%.4f max=%.4f calls=%d span=%.4f  # %s\n", name, med, sorted[0],
         sorted[g_batches - 1], calls, med_span, what);
  if (med_span > 1.5 * med)
    printf("# warning: %s: the GPU takes %.2f us per call, the host %.2f us: GPU-bound, use "
           "smaller shapes\n",
           name, med_span, med);
  fflush(stdout);
  return med;
}

/* ---- cuBLASLt GEMMs in lutra's convention ---------------------------------------------- */

static const size_t WORKSPACE = (size_t)32 << 20;
static cublasLtHandle_t g_lt;
static void *g_ws;
static const float ONE = 1.0f, ZERO = 0.0f;

struct Gemm {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulAlgo_t algo;
  const void *a, *b;
  void *d;
};

/* Row-major D [m, n] = op(B) [m, k] @ op(A) [k, n], A stored [n, k] when transa else [k, n],
 * B stored [k, m] when transb else [m, k]: cuBLASLt column-major D^T = op(A)^T op(B)^T with
 * the same flags, as lutra's plans build it. scales: FP8 A and B scale pointers, or NULL. */
static Gemm make_gemm(cudaDataType_t ta, cudaDataType_t tb, int transa, int transb, int64_t m,
                      int64_t n, int64_t k, int fast_accum, const float *scales, const void *a,
                      const void *b, void *d) {
  Gemm g;
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
    if ((uintptr_t)scales & 15) die("FP8 scale pointers must be 16-byte aligned");
    int8_t fast = (int8_t)fast_accum;
    CB(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
    const float *sa = scales, *sb = scales + 4; /* 16 bytes apart */
    CB(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
    CB(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
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
  CB(cublasLtMatmulAlgoGetHeuristic(g_lt, g.op, g.la, g.lb, g.ld, g.ld, pref, 1, &res, &found));
  CB(cublasLtMatmulPreferenceDestroy(pref));
  if (found < 1) die("the cuBLASLt heuristic found no algorithm");
  g.algo = res.algo;
  return g;
}

static void run_gemm(const Gemm &g) {
  CB(cublasLtMatmul(g_lt, g.op, &ONE, g.a, g.la, g.b, g.lb, &ZERO, g.d, g.ld, g.d, g.ld, &g.algo,
                    g_ws, WORKSPACE, g_stream));
}

static void free_gemm(Gemm &g) {
  CB(cublasLtMatmulDescDestroy(g.op));
  CB(cublasLtMatrixLayoutDestroy(g.la));
  CB(cublasLtMatrixLayoutDestroy(g.lb));
  CB(cublasLtMatrixLayoutDestroy(g.ld));
}

/* ---- main ----------------------------------------------------------------------------- */

static int int_arg(int argc, char **argv, int *i) {
  if (*i + 1 >= argc) die("an option is missing its value");
  char *end;
  long v = strtol(argv[++*i], &end, 10);
  if (*end || v < 1 || v > (1 << 20)) die("option values must be integers in 1..1048576");
  return (int)v;
}

int main(int argc, char **argv) {
  int64_t M = 64, K = 64, N = 64;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--batch"))
      M = int_arg(argc, argv, &i);
    else if (!strcmp(argv[i], "--in"))
      K = int_arg(argc, argv, &i);
    else if (!strcmp(argv[i], "--out"))
      N = int_arg(argc, argv, &i);
    else if (!strcmp(argv[i], "--calls"))
      g_calls = int_arg(argc, argv, &i);
    else if (!strcmp(argv[i], "--batches"))
      g_batches = int_arg(argc, argv, &i);
    else {
      fprintf(stderr, "usage: %s [--batch M] [--in K] [--out N] [--calls C] [--batches B]\n",
              argv[0]);
      return 2;
    }
  }
  if (M % 16 || K % 16 || N % 16) die("FP8 GEMMs need --batch, --in and --out multiples of 16");

  int dev, rt, drv;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  CK(cudaRuntimeGetVersion(&rt));
  CK(cudaDriverGetVersion(&drv));
  printf("# host_floors: %s, CUDA runtime %d, driver %d, cuBLASLt %zu\n", prop.name, rt, drv,
         cublasLtGetVersion());
  printf("# shapes: batch=%lld in=%lld out=%lld; median of %d batches of the calls after a "
         "warm-up batch, stream synchronized between batches; host us per call\n",
         (long long)M, (long long)K, (long long)N, g_batches);
  fflush(stdout);

  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  CK(cudaEventCreate(&g_ev0));
  CK(cudaEventCreate(&g_ev1));
  CB(cublasLtCreate(&g_lt));
  CK(cudaMalloc(&g_ws, WORKSPACE));

  /* operands: every matrix fits in max(M, K, N)^2 elements of up to 4 bytes */
  int64_t dim = std::max(M, std::max(K, N));
  size_t bytes = (size_t)(dim * dim * 4);
  void *x, *w, *dy, *y, *scratch;
  CK(cudaMalloc(&x, bytes));
  CK(cudaMalloc(&w, bytes));
  CK(cudaMalloc(&dy, bytes));
  CK(cudaMalloc(&y, bytes));
  CK(cudaMalloc(&scratch, 4096));
  CK(cudaMemset(x, 0, bytes)); /* zeros: valid BF16 and FP8 values */
  CK(cudaMemset(w, 0, bytes));
  CK(cudaMemset(dy, 0, bytes));
  float *scales;
  CK(cudaMalloc((void **)&scales, 256)); /* 256-byte aligned: [0] and [4] are 16-byte aligned */
  const float ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  CK(cudaMemcpy(scales, ones, sizeof ones, cudaMemcpyHostToDevice));

  const int C = g_calls;
  bench("launch", "empty kernel <<<1, 32>>> + cudaGetLastError", C, [&] {
    empty_kernel<<<1, 32, 0, g_stream>>>();
    CK(cudaGetLastError());
  });
  BigParams big;
  memset(&big, 0, sizeof big);
  bench("launch_big", "kernel with 7 KiB of parameters + cudaGetLastError", C, [&] {
    big_kernel<<<1, 32, 0, g_stream>>>(big);
    CK(cudaGetLastError());
  });
  bench("memset", "cudaMemsetAsync, 4 bytes", C,
        [&] { CK(cudaMemsetAsync(scratch, 0, 4, g_stream)); });
  bench("memcpy", "cudaMemcpyAsync device to device, 256 bytes", C, [&] {
    CK(cudaMemcpyAsync((char *)scratch + 2048, scratch, 256, cudaMemcpyDeviceToDevice, g_stream));
  });

  const cudaDataType_t BF = CUDA_R_16BF, E4 = CUDA_R_8F_E4M3, E5 = CUDA_R_8F_E5M2;
  char what[160];
  /* the Linear's three GEMMs: fprop TN (A = W [N, K]), dgrad NN (A = W, B = dy [M, N]),
   * wgrad NT (A = x [M, K], B = dy) */
  Gemm g = make_gemm(BF, BF, 1, 0, M, N, K, 0, NULL, w, x, y);
  snprintf(what, sizeof what, "cublasLtMatmul BF16, TN, m=%lld n=%lld k=%lld, cached algo",
           (long long)M, (long long)N, (long long)K);
  bench("lt_bf16_fprop", what, C, [&] { run_gemm(g); });
  free_gemm(g);
  g = make_gemm(BF, BF, 0, 0, M, K, N, 0, NULL, w, dy, y);
  snprintf(what, sizeof what, "cublasLtMatmul BF16, NN, m=%lld n=%lld k=%lld, cached algo",
           (long long)M, (long long)K, (long long)N);
  bench("lt_bf16_dgrad", what, C, [&] { run_gemm(g); });
  free_gemm(g);
  g = make_gemm(BF, BF, 0, 1, N, K, M, 0, NULL, x, dy, y);
  snprintf(what, sizeof what, "cublasLtMatmul BF16, NT, m=%lld n=%lld k=%lld, cached algo",
           (long long)N, (long long)K, (long long)M);
  bench("lt_bf16_wgrad", what, C, [&] { run_gemm(g); });
  free_gemm(g);

  /* FP8 runs TN only: lutra uses the columnwise (transposed) copies for dgrad and wgrad */
  g = make_gemm(E4, E4, 1, 0, M, N, K, 1, scales, w, x, y);
  snprintf(what, sizeof what,
           "cublasLtMatmul E4M3 x E4M3 -> BF16, TN, fast accum, m=%lld n=%lld k=%lld, cached algo",
           (long long)M, (long long)N, (long long)K);
  bench("lt_fp8_fprop", what, C, [&] { run_gemm(g); });
  const float *sa = scales;
  bench("lt_set_attr", "cublasLtMatmulDescSetAttribute (an FP8 scale pointer)", C, [&] {
    CB(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
  });
  free_gemm(g);
  g = make_gemm(E4, E5, 1, 0, M, K, N, 0, scales, w, dy, y);
  snprintf(what, sizeof what, "cublasLtMatmul E4M3 x E5M2 -> BF16, TN, m=%lld n=%lld k=%lld",
           (long long)M, (long long)K, (long long)N);
  bench("lt_fp8_dgrad", what, C, [&] { run_gemm(g); });
  free_gemm(g);
  g = make_gemm(E4, E5, 1, 0, N, K, M, 0, scales, x, dy, y);
  snprintf(what, sizeof what, "cublasLtMatmul E4M3 x E5M2 -> BF16, TN, m=%lld n=%lld k=%lld",
           (long long)N, (long long)K, (long long)M);
  bench("lt_fp8_wgrad", what, C, [&] { run_gemm(g); });
  free_gemm(g);

  /* a small captured graph */
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 4; i++) {
    empty_kernel<<<1, 32, 0, g_stream>>>();
    CK(cudaGetLastError());
  }
  CK(cudaStreamEndCapture(g_stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  bench("graph_launch", "cudaGraphLaunch of a graph of 4 empty kernels", C,
        [&] { CK(cudaGraphLaunch(exec, g_stream)); });

  CK(cudaStreamSynchronize(g_stream));
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  void *bufs[] = {x, w, dy, y, scratch, scales, g_ws};
  for (void *p : bufs)
    CK(cudaFree(p));
  CB(cublasLtDestroy(g_lt));
  CK(cudaEventDestroy(g_ev0));
  CK(cudaEventDestroy(g_ev1));
  CK(cudaStreamDestroy(g_stream));
  return 0;
}
