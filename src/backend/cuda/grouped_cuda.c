/* GroupedLinear's grouped operations on CUDA (the table's grouped_quantize and grouped_gemm): the
 * kernels of kernels/grouped_quantize.cu (per-tensor scaling), grouped_quantize_blocks.cu
 * (MXFP8, 1x128 and 128x128 blocks), grouped_dequant.cu and grouped_gemm_sm90.cu on the calling
 * thread's stream, the GEMM's workspace (and a dequantizing pass's bf16 operands) from the
 * stream's one GEMM workspace. The splits stay in device memory: nothing here reads them. */
#include "backend/grouped_layout.h"
#include "cuda_backend.h"
#include "grouped_kernels.h"

#include <pthread.h>
#include <string.h>

/* A grouped quantization as its cached graph's key (call_graphs.c): the arguments (the splits
 * are read on the device, inside the graph) and the stream */
typedef struct grouped_quant_call {
  lutra_grouped_quant_args args;
  int64_t rows_cap; /* the packed layout's rows, from the arguments */
  cudaStream_t stream;
} grouped_quant_call;
_Static_assert(sizeof(grouped_quant_call) == sizeof(lutra_grouped_quant_args) + 2 * 8,
               "a grouped quantization key has padding bytes: keys are memcmp'd");

static int issue_grouped_quantize(void *ctx) {
  static const char fn[] = "lutra_cuda_grouped_quantize";
  const grouped_quant_call *c = ctx;
  const lutra_grouped_quant_args *a = &c->args;
  if (a->kind == LUTRA_QUANT_DELAYED || a->kind == LUTRA_QUANT_CURRENT)
    return lutra_cuda_status(lk_grouped_quantize(a, c->rows_cap, c->stream), fn,
                             "kernel grouped_quantize");
  return lutra_cuda_status(lk_grouped_quantize_blocks(a, c->rows_cap, c->stream), fn,
                           "kernel grouped_quantize_blocks");
}

int lutra_cuda_grouped_quantize(const lutra_grouped_quant_args *a) {
  static const char fn[] = "lutra_cuda_grouped_quantize";
  CHECK_ARG(a && a->num > 0 && a->cols > 0 && a->out.align > 0 && a->scratch,
            "bad grouped quantization arguments");
  CHECK_ARG(a->out.dtype == LUTRA_E4M3 || a->out.dtype == LUTRA_E5M2, "output dtype %d is no FP8",
            (int)a->out.dtype);
  if (a->kind != LUTRA_QUANT_DELAYED && a->kind != LUTRA_QUANT_CURRENT &&
      a->kind != LUTRA_QUANT_MXFP8 && a->kind != LUTRA_QUANT_BLOCK_1D &&
      a->kind != LUTRA_QUANT_BLOCK_2D)
    return lutra_error(LUTRA_EUNSUPPORTED, fn, "no grouped quantization for quantizer kind %d",
                       (int)a->kind);
  CHECK_ARG(a->kind != LUTRA_QUANT_MXFP8 || (a->cols % 32 == 0 && a->out.align % 32 == 0),
            "MXFP8 needs columns and row padding in multiples of 32 (got %lld, %d)",
            (long long)a->cols, (int)a->out.align);
  grouped_quant_call c = {
      .args = *a,
      .rows_cap = a->xs ? (int64_t)a->num * lutra_grouped_roundup(a->rows_each, a->out.align)
                        : lutra_grouped_rows_cap(a->total_rows, a->num, a->out.align),
      .stream = lutra_cuda_stream()};
  return lutra_call_graphs_run(
      lutra_cuda_launch_graphs(LUTRA_LAUNCH_GROUPED_QUANTIZE, lutra_call_graphs_free),
      LUTRA_CALLS_KERNEL, &c, sizeof c, c.stream, issue_grouped_quantize, &c, fn);
}

/* the CUTLASS kernels' workspace for num experts, asked once per expert count and thread (a
 * dequantizing FP8 pass adds its bf16 operands after it: lk_grouped_dequant_bytes) */
static size_t workspace_for(int num) {
  static _Thread_local int last_num = -1;
  static _Thread_local size_t last_bytes;
  if (num != last_num) {
    last_bytes = lk_grouped_gemm_workspace(num);
    last_num = num;
  }
  return last_bytes;
}

/* A grouped GEMM call as its cached graph's key (call_graphs.c): everything its launches bake
 * in. The problem sizes are not in it: the setup kernel reads them from the device splits. */
typedef struct grouped_call {
  lutra_grouped_gemm_args args;
  void *workspace;
  size_t workspace_bytes;
  cudaStream_t stream;
} grouped_call;
_Static_assert(sizeof(lutra_grouped_fp8) == 4 * sizeof(void *) + 4 * sizeof(int32_t) &&
                   sizeof(lutra_grouped_gemm_args) == 13 * sizeof(void *) + 3 * sizeof(int64_t) +
                                                          8 * sizeof(int32_t) +
                                                          3 * sizeof(lutra_grouped_fp8) &&
                   sizeof(grouped_call) == sizeof(lutra_grouped_gemm_args) + 3 * sizeof(void *),
               "a grouped GEMM key has padding bytes: keys are memcmp'd");

static const char gemm_fn[] = "lutra_cuda_grouped_gemm";

/* the call's launches: the setup kernel and the CUTLASS kernel (a dequantizing FP8 pass's casts
 * before them), and a high-precision wgrad's bias gradient */
static int issue_grouped(void *ctx) {
  const grouped_call *c = ctx;
  const lutra_grouped_gemm_args *g = &c->args;
  cudaError_t e = lk_grouped_gemm(g, c->workspace, c->workspace_bytes, c->stream);
  if (e == cudaErrorNotSupported) {
    (void)cudaGetLastError();
    return lutra_error(LUTRA_EUNSUPPORTED, gemm_fn,
                       "no grouped GEMM kernel for this combination (in and out multiples of 16, "
                       "an sm_90 device; see kernels/grouped_gemm_sm90.cu)");
  }
  if (e == cudaSuccess && g->pass == LUTRA_GROUPED_WGRAD && !g->fp8 && g->db)
    e = lk_grouped_dbias(g->dy, g->dtype, g->total_rows, g->out, g->num, g->splits, g->db,
                         g->bias_dtype, g->accumulate, c->stream);
  return lutra_cuda_status(e, gemm_fn, "grouped GEMM");
}

int lutra_cuda_grouped_gemm(const lutra_grouped_gemm_args *g) {
  const char *fn = gemm_fn;
  CHECK_ARG(g && g->num > 0 && g->scratch, "bad grouped GEMM arguments");
  /* No f32 (or TF32) grouped instantiation: each costs minutes of compile time, and an f32
   * GroupedLinear with host splits runs one cuBLASLt f32 GEMM per expert instead
   * (nn/grouped/grouped_host.c), which the module chooses itself. */
  if (g->dtype != LUTRA_BF16 && g->fp8)
    return lutra_error(LUTRA_EUNSUPPORTED, fn,
                       "an FP8 GroupedLinear on cuda must be bf16 (the FP8 grouped GEMM writes "
                       "bf16; this module is %s)",
                       lutra_dtype_name(g->dtype));
  if (g->dtype != LUTRA_BF16)
    return lutra_error(LUTRA_EUNSUPPORTED, fn,
                       "a %s GroupedLinear on cuda needs host m_splits (a Lua table or a CPU "
                       "tensor: one cuBLASLt GEMM per expert); device m_splits need a bf16 "
                       "module (the grouped GEMM has no %s kernels)",
                       lutra_dtype_name(g->dtype), lutra_dtype_name(g->dtype));
  size_t need = workspace_for(g->num);
  if (lk_grouped_gemm_dequantizes(g)) {
    size_t ab, bb;
    lk_grouped_dequant_bytes(g, &ab, &bb);
    need = (need + 255) / 256 * 256 + ab + bb;
  }
  grouped_call c = {.args = *g, .stream = lutra_cuda_stream()};
  /* the workspace before any capture: a capture must not record its allocation */
  TRY(lutra_cuda_workspace(need, &c.workspace, &c.workspace_bytes));
  if (!g->call_graphs) return issue_grouped(&c);
  return lutra_call_graphs_run((lutra_call_graphs **)g->call_graphs, LUTRA_CALLS_GEMM, &c, sizeof c,
                               c.stream, issue_grouped, &c, fn);
}

/* ---- host splits: staged through a pinned ring ------------------------------------------------
 * from_host waits for the stream (a pageable copy must finish before its source may change),
 * which stalls the host behind every queued kernel once per forward with host splits. Here the
 * bytes are copied into a slot of pinned memory and the device copy is queued from there: the
 * host waits only if the copy queued RING_SLOTS uploads ago has not run yet. One ring for the
 * process (a mutex: uploads come once per forward), made on first use and kept. */
enum { RING_SLOTS = 64, RING_SLOT_BYTES = 4096 };
static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  char *host;
  cudaEvent_t done[RING_SLOTS];
  bool recorded[RING_SLOTS];
  int next;
  bool ready;
} ring;

static cudaError_t ring_make(void) {
  cudaError_t e = cudaMallocHost((void **)&ring.host, (size_t)RING_SLOTS * RING_SLOT_BYTES);
  for (int i = 0; e == cudaSuccess && i < RING_SLOTS; i++)
    e = cudaEventCreateWithFlags(&ring.done[i], cudaEventDisableTiming);
  ring.ready = e == cudaSuccess;
  return e;
}

int lutra_cuda_from_host_async(void *dst, const void *src, size_t bytes) {
  static const char fn[] = "lutra_cuda_from_host_async";
  CHECK_STATE(!LUTRA_CAPTURING(), "a host-to-device copy while capturing a CUDA graph would "
                                  "replay the bytes of the capture");
  cudaStream_t s = lutra_cuda_stream();
  if (bytes > RING_SLOT_BYTES) { /* larger than a slot: the waiting copy */
    TRY(lutra_cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s), fn,
                          "cudaMemcpyAsync"));
    return lutra_cuda_status(cudaStreamSynchronize(s), fn, "cudaStreamSynchronize");
  }
  pthread_mutex_lock(&ring_lock);
  cudaError_t e = ring.ready ? cudaSuccess : ring_make();
  const int i = ring.next;
  if (e == cudaSuccess && ring.recorded[i]) e = cudaEventSynchronize(ring.done[i]);
  if (e == cudaSuccess) {
    char *slot = ring.host + (size_t)i * RING_SLOT_BYTES;
    memcpy(slot, src, bytes);
    e = cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice, s);
  }
  if (e == cudaSuccess) e = cudaEventRecord(ring.done[i], s);
  if (e == cudaSuccess) {
    ring.recorded[i] = true;
    ring.next = (i + 1) % RING_SLOTS;
  }
  pthread_mutex_unlock(&ring_lock);
  return lutra_cuda_status(e, fn, "staging host splits");
}
