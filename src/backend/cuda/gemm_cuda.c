/* cuBLASLt GEMMs. A plan holds the matmul descriptor, the three matrix layouts and the
 * algorithm the heuristic chose, made once per key (shape, dtypes, layout, epilogue,
 * fast-accumulate); a call only sets the per-call pointers (FP8 scales, bias) and runs.
 *
 * A row-major matrix is its transpose in column-major, so row-major D = op(B) op(A) is
 * column-major D^T = op(A)^T op(B)^T, and cuBLAS computes exactly that when handed A and B
 * as they are stored with the same transpose flags: TransformerEngine's convention, so "TN"
 * here is cuBLAS's TN, Hopper's only FP8 layout.
 *
 * Per-tensor FP8 runs natively (A/B scale pointers = the operands' scale_inv, 16-byte
 * aligned: cuBLASLt 13.1 refuses 4-byte-aligned ones on the H200). Float8 block scaling runs
 * natively too (cuBLASLt 12.9+ on Hopper: scale modes VEC128_32F / BLK128x128_32F, the scale
 * arrays in the layouts lutra stores them in; 1D x 1D, 1D x 2D, 2D x 1D; no fast accumulation).
 * MXFP8 has no Hopper kernel, and 2D x 2D blocks none in cuBLASLt: those operands, rowwise-scaled
 * ones (lutra/formats.h: cuBLASLt's outer-vector scale mode is not used, see NUMERICS.md) and
 * block shapes the heuristic refuses, are dequantized to BF16 in the workspace and run as a BF16
 * GEMM (the plan records which). bench/probes/probe_block_gemm.cu checked the layouts on the H200.
 *
 * Epilogues (lutra_gemm_epilogue, lutra.h) map to cuBLASLt's in the same column-major view:
 * lutra's D [m, n] is cuBLASLt's D [n, m], so the GELU aux matrix is [n, m] with leading
 * dimension n, and a bias or bias gradient "per row of D" is lutra's per column: DGELU_BGRAD
 * writes dbias [n]. cuBLASLt's BGRADB reduces its operand B (lutra's B, passed as stored) over
 * the GEMM's k, giving one value per column of its D = per row of lutra's D: dbias [m], the
 * k-sums of op(B). cuBLASLt's GELU is the tanh approximation, lutra's formula (its tanh may be
 * a hardware approximation: the GPU specs bound the difference). Where the heuristic has no
 * algorithm for the epilogue, or its documented limits rule it out (aux leading dimension not
 * a multiple of 8; a bias gradient of another dtype than D), the plan runs the plain GEMM and
 * lutra's kernels: GELU, GELU_AUX and DGELU(_BGRAD) on the f32 result (D, or D staged in f32
 * when it is not f32, so that D is rounded once, as on the CPU), BGRADB's sums from B. */
#include "cuda_backend.h"

#include "kernels.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cuda_plan {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulAlgo_t algo;
  bool fp8_scales;    /* native FP8: set the scale pointers per call */
  bool block_scales;  /* ... which are Float8 block scales (VEC128 / BLK128x128) */
  bool dequantize;    /* MXFP8, 2D x 2D blocks, rowwise, refused block shapes: dequantize to
                         BF16 */
  bool bias_epilogue; /* else the bias is added by a kernel after the GEMM */
  bool stage_d;       /* no kernel writes D's dtype from these operands: run into an f32
                         scratch and convert (one rounding, as the CPU backend does) */
  bool lt_epilogue;   /* the key's epilogue runs in cuBLASLt; else kernels after the GEMM */
  size_t a_bytes, b_bytes, d_bytes;
  lutra_call_graphs *graphs; /* eager calls replayed as graphs (call_graphs.c) */
} cuda_plan;

static cudaDataType_t cuda_type(int dtype) {
  switch (dtype) {
  case LUTRA_F32:
    return CUDA_R_32F;
  case LUTRA_BF16:
    return CUDA_R_16BF;
  case LUTRA_F16:
    return CUDA_R_16F;
  case LUTRA_E4M3:
    return CUDA_R_8F_E4M3;
  default:
    return CUDA_R_8F_E5M2;
  }
}

static size_t round256(size_t n) {
  return (n + 255) & ~(size_t)255;
}

static void destroy(cuda_plan *c) {
  if (!c) return;
  lutra_call_graphs_free(c->graphs);
  if (c->op) cublasLtMatmulDescDestroy(c->op);
  if (c->la) cublasLtMatrixLayoutDestroy(c->la);
  if (c->lb) cublasLtMatrixLayoutDestroy(c->lb);
  if (c->ld) cublasLtMatrixLayoutDestroy(c->ld);
  free(c);
}

void lutra_cuda_gemm_plan_free(lutra_gemm_plan *p) {
  destroy(p->backend_plan);
  p->backend_plan = NULL;
}

#define LT(call, what)                                                                             \
  do {                                                                                             \
    int st_ = lutra_cublas_status((call), fn, what);                                               \
    if (st_ != LUTRA_OK) {                                                                         \
      destroy(c);                                                                                  \
      return st_;                                                                                  \
    }                                                                                              \
  } while (0)

static bool log_plans(void);

static bool set_attr(cuda_plan *c, cublasLtMatmulDescAttributes_t attr, const void *v,
                     size_t size) {
  cublasStatus_t s = cublasLtMatmulDescSetAttribute(c->op, attr, v, size);
  if (s != CUBLAS_STATUS_SUCCESS && log_plans())
    fprintf(stderr, "lutra: GEMM plan: descriptor attribute %d refused: %s\n", (int)attr,
            cublasLtGetStatusString(s));
  return s == CUBLAS_STATUS_SUCCESS;
}

/* LUTRA_LOG_PLANS=1: stderr lines saying which configurations a new plan tried and which path
 * it took (plans are made once per shape, so this costs nothing in a steady loop). */
static bool plans_logged;
/* read at load, not at first use: two threads' first plans would race on a lazy flag */
__attribute__((constructor)) static void read_log_plans(void) {
  const char *v = getenv("LUTRA_LOG_PLANS");
  plans_logged = v && *v && strcmp(v, "0") != 0;
}
static bool log_plans(void) {
  return plans_logged;
}

/* The heuristic's best algorithm for the current descriptor, or false when it has none. Its
 * choice is a function of the key, the device and the fixed workspace bound; deterministic
 * (the switch, lutra/determinism.h) keeps to algorithms without a split-K reduction, whose
 * partial sums would otherwise be added in a second step or in place. */
static bool pick_algo(cuda_plan *c, bool deterministic) {
  cublasLtMatmulPreference_t pref;
  if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return false;
  uint64_t ws = LUTRA_CUDA_WORKSPACE - 256;
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  const uint32_t one_sequence = CUBLASLT_REDUCTION_SCHEME_NONE;
  if (s == CUBLAS_STATUS_SUCCESS && deterministic)
    s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                             &one_sequence, sizeof one_sequence);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulAlgoGetHeuristic(lutra_cuda_lt(), c->op, c->la, c->lb, c->ld, c->ld, pref, 1,
                                       &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (log_plans() && (s != CUBLAS_STATUS_SUCCESS || found == 0))
    fprintf(stderr, "lutra: GEMM heuristic: status %d (%s), %d algorithms\n", (int)s,
            cublasLtGetStatusString(s), found);
  if (s != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  c->algo = result.algo;
  return true;
}

static bool uses_aux(int kind) {
  return kind == LUTRA_EPILOGUE_GELU_AUX || kind == LUTRA_EPILOGUE_DGELU ||
         kind == LUTRA_EPILOGUE_DGELU_BGRAD;
}

static bool writes_dbias(int kind) {
  return kind == LUTRA_EPILOGUE_DGELU_BGRAD || kind == LUTRA_EPILOGUE_BGRADB;
}

/* GELU, GELU_AUX, DGELU(_BGRAD): done by kernels, they need the GEMM's f32 result */
static bool gelu_family(int kind) {
  return kind == LUTRA_EPILOGUE_GELU || kind == LUTRA_EPILOGUE_GELU_AUX ||
         kind == LUTRA_EPILOGUE_DGELU || kind == LUTRA_EPILOGUE_DGELU_BGRAD;
}

/* cuBLASLt's epilogue for a lutra epilogue kind (NONE: the plain or bias epilogue) */
static cublasLtEpilogue_t lt_epilogue_of(int kind, bool bias) {
  switch (kind) {
  case LUTRA_EPILOGUE_GELU:
    return bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  case LUTRA_EPILOGUE_GELU_AUX:
    return bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  case LUTRA_EPILOGUE_DGELU:
    return CUBLASLT_EPILOGUE_DGELU;
  case LUTRA_EPILOGUE_DGELU_BGRAD:
    return CUBLASLT_EPILOGUE_DGELU_BGRAD;
  case LUTRA_EPILOGUE_BGRADB:
    return CUBLASLT_EPILOGUE_BGRADB;
  default:
    return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  }
}

/* cuBLASLt's documented limits on its epilogues, which the heuristic need not check: the aux
 * leading dimension (n) must be a multiple of 8; a bias gradient has D's dtype. */
static bool lt_epilogue_allowed(const lutra_gemm_key *k) {
  if (uses_aux(k->epilogue) && k->n % 8 != 0) return false;
  if (writes_dbias(k->epilogue) && k->dbias_dtype != k->d_dtype) return false;
  return true;
}

/* 256 device bytes whose address stands in for scale pointers while a plan is made (never
 * read: every call sets the real ones); NULL if it cannot be allocated. */
static const void *scale_placeholder(void) {
  static void *p;
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&lock);
  if (!p && cudaMalloc(&p, 256) != cudaSuccess) p = NULL;
  pthread_mutex_unlock(&lock);
  return p;
}

/* Float8 block scales are stored in the layouts cuBLASLt reads (see lutra_tensor in lutra.h) */
static int32_t scale_mode_of(int scaling) {
  return scaling == LUTRA_SCALING_BLOCK_1D ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                           : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}

static bool is_block(int scaling) {
  return scaling == LUTRA_SCALING_BLOCK_1D || scaling == LUTRA_SCALING_BLOCK_2D;
}

/* (Re)builds the descriptor and D's layout for one configuration and asks the heuristic.
 * lt_epilogue: the key's epilogue in cuBLASLt (with the bias when bias_epilogue). */
static bool try_config(cuda_plan *c, const lutra_gemm_key *k, int d_dtype, bool bias_epilogue,
                       bool lt_epilogue) {
  if (c->op) cublasLtMatmulDescDestroy(c->op);
  if (c->ld) cublasLtMatrixLayoutDestroy(c->ld);
  c->op = NULL;
  c->ld = NULL;
  if (cublasLtMatrixLayoutCreate(&c->ld, cuda_type(d_dtype), (uint64_t)k->n, (uint64_t)k->m,
                                 k->n) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulDescCreate(&c->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS)
    return false;
  cublasOperation_t opa = k->transa ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opb = k->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  /* a refused attribute means this configuration cannot run: report it as "no algorithm" */
  if (!set_attr(c, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa) ||
      !set_attr(c, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb))
    return false;
  /* block-scaled kernels apply the scales per 128-deep slice in f32: no fast accumulation */
  int8_t fast = (int8_t)(k->fast_accum != 0 && !c->block_scales);
  if (c->fp8_scales && !set_attr(c, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast))
    return false;
  if (c->block_scales) {
    /* the heuristic refuses block scale modes without scale pointers ("requires a custom
     * pointer"): placeholders until each call sets the operands' own */
    const void *placeholder = scale_placeholder();
    int32_t ma = scale_mode_of(k->a_scaling), mb = scale_mode_of(k->b_scaling);
    if (!placeholder || !set_attr(c, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma) ||
        !set_attr(c, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb) ||
        !set_attr(c, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &placeholder, sizeof placeholder) ||
        !set_attr(c, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &placeholder, sizeof placeholder))
      return false;
  }
  const int kind = lt_epilogue ? k->epilogue : LUTRA_EPILOGUE_NONE;
  cublasLtEpilogue_t epi = lt_epilogue_of(kind, bias_epilogue);
  if (epi != CUBLASLT_EPILOGUE_DEFAULT &&
      !set_attr(c, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi))
    return false;
  /* the bias, or the bias gradient cuBLASLt writes through the bias pointer */
  if (bias_epilogue || writes_dbias(kind)) {
    cudaDataType_t bt = cuda_type(bias_epilogue ? k->bias_dtype : k->dbias_dtype);
    if (!set_attr(c, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt)) return false;
  }
  /* the aux matrix: D's shape, column-major [n, m], leading dimension n; its dtype is D's
   * (cuBLASLt's default), set explicitly for FP8 kernels as TransformerEngine does */
  if (uses_aux(kind)) {
    int64_t ld = k->n;
    cudaDataType_t at = cuda_type(k->aux_dtype);
    if (!set_attr(c, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld) ||
        (c->fp8_scales &&
         !set_attr(c, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &at, sizeof at)))
      return false;
  }
  c->bias_epilogue = bias_epilogue;
  c->lt_epilogue = lt_epilogue;
  return pick_algo(c, k->deterministic != 0);
}

/* the algorithm's identity, for comparing plans with raw cuBLASLt calls (bench/host_floors.cu
 * prints the same fields): id, tile, split-K count, stages */
static void algo_fields(const cublasLtMatmulAlgo_t *algo, int32_t f[4]) {
  static const cublasLtMatmulAlgoConfigAttributes_t attr[4] = {
      CUBLASLT_ALGO_CONFIG_ID, CUBLASLT_ALGO_CONFIG_TILE_ID, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
      CUBLASLT_ALGO_CONFIG_STAGES_ID};
  for (int i = 0; i < 4; i++) {
    size_t n = 0;
    uint32_t v = 0;
    f[i] = cublasLtMatmulAlgoConfigGetAttribute(algo, attr[i], &v, sizeof v, &n) ==
                   CUBLAS_STATUS_SUCCESS
               ? (int32_t)v
               : -1;
  }
}

/* LUTRA_LOG_PLANS=1: one stderr line per new plan saying which path it takes (plans are made
 * once per shape, so this costs nothing in a steady loop). */
static void log_plan(const lutra_gemm_key *k, const cuda_plan *c) {
  if (!log_plans()) return;
  int32_t f[4];
  algo_fields(&c->algo, f);
  const char *path = c->dequantize     ? "operands dequantized to bf16 (fallback)"
                     : c->block_scales ? "native FP8, block scales"
                     : c->fp8_scales   ? "native FP8, per-tensor scales"
                                       : "native";
  fprintf(stderr,
          "lutra: GEMM plan %s x %s -> %s, m=%lld n=%lld k=%lld, %c%c, epilogue %d: %s; bias %s, "
          "epilogue %s, D %s; algo %d tile %d splitk %d stages %d\n",
          lutra_dtype_name(k->a_dtype), lutra_dtype_name(k->b_dtype), lutra_dtype_name(k->d_dtype),
          (long long)k->m, (long long)k->n, (long long)k->k, k->transa ? 'T' : 'N',
          k->transb ? 'T' : 'N', k->epilogue, path,
          k->bias_dtype < 0  ? "none"
          : c->bias_epilogue ? "in cuBLASLt"
                             : "by a kernel",
          k->epilogue == LUTRA_EPILOGUE_NONE ? "none"
          : c->lt_epilogue                   ? "in cuBLASLt"
                                             : "by kernels",
          c->stage_d ? "staged in f32" : "written directly", f[0], f[1], f[2], f[3]);
}

/* The operand layouts: FP8 as stored, or BF16 for the dequantizing fallback. */
static bool make_layouts(cuda_plan *c, const lutra_gemm_key *k) {
  if (c->la) cublasLtMatrixLayoutDestroy(c->la);
  if (c->lb) cublasLtMatrixLayoutDestroy(c->lb);
  c->la = c->lb = NULL;
  cudaDataType_t ta = c->dequantize ? CUDA_R_16BF : cuda_type(k->a_dtype);
  cudaDataType_t tb = c->dequantize ? CUDA_R_16BF : cuda_type(k->b_dtype);
  /* stored (row-major) shapes of A and B */
  int64_t ra = k->transa ? k->n : k->k, ca = k->transa ? k->k : k->n;
  int64_t rb = k->transb ? k->k : k->m, cb = k->transb ? k->m : k->k;
  return cublasLtMatrixLayoutCreate(&c->la, ta, (uint64_t)ca, (uint64_t)ra, ca) ==
             CUBLAS_STATUS_SUCCESS &&
         cublasLtMatrixLayoutCreate(&c->lb, tb, (uint64_t)cb, (uint64_t)rb, cb) ==
             CUBLAS_STATUS_SUCCESS;
}

static bool find_config(cuda_plan *c, const lutra_gemm_key *k);

int lutra_cuda_gemm_plan(lutra_gemm_plan *p) {
  static const char fn[] = "lutra_cuda_gemm_plan";
  const lutra_gemm_key *k = &p->key;
  cuda_plan *c = calloc(1, sizeof *c);
  if (!c) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a GEMM plan");
  /* NVFP4 (lutra/nvfp4.h) is neither per-tensor nor block-scaled FP8: Hopper has no FP4 GEMM,
   * so it takes the dequantizing path below */
  bool fp8 = lutra_dtype_is_quantized(k->a_dtype);
  bool per_tensor = k->a_scaling == LUTRA_SCALING_TENSOR && k->b_scaling == LUTRA_SCALING_TENSOR;
  /* Hopper has block-scaled FP8 kernels for 1D x 1D, 1D x 2D and 2D x 1D (not 2D x 2D) */
  bool block = is_block(k->a_scaling) && is_block(k->b_scaling) &&
               !(k->a_scaling == LUTRA_SCALING_BLOCK_2D && k->b_scaling == LUTRA_SCALING_BLOCK_2D);
  int64_t ra = k->transa ? k->n : k->k, ca = k->transa ? k->k : k->n;
  int64_t rb = k->transb ? k->k : k->m, cb = k->transb ? k->m : k->k;
  c->a_bytes = round256((size_t)(ra * ca) * 2);
  c->b_bytes = round256((size_t)(rb * cb) * 2);
  c->d_bytes = round256((size_t)(k->m * k->n) * 4);
  bool found = false;
  if (!fp8 || per_tensor || block) {
    c->fp8_scales = fp8;
    c->block_scales = fp8 && block;
    LT(make_layouts(c, k) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED, "A/B layouts");
    found = find_config(c, k);
  }
  /* MXFP8 (no Hopper kernel), 2D x 2D blocks, rowwise scaling (one scale per row of each
   * operand), or block shapes this cuBLASLt refuses: dequantize to BF16 in the workspace. Exact
   * for power-of-two scales (MXFP8, pow-2 block or rowwise scales: an FP8 code times 2^e fits
   * BF16's 8-bit significand); other scales round once to BF16. */
  if (!found && fp8 && !per_tensor) {
    c->dequantize = true;
    c->fp8_scales = c->block_scales = false;
    c->stage_d = false;
    LT(make_layouts(c, k) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED, "A/B layouts");
    found = find_config(c, k);
  }
  if (!found) {
    destroy(c);
    return lutra_error(
        LUTRA_EUNSUPPORTED, fn,
        "cuBLASLt has no algorithm for %s x %s -> %s, m=%lld n=%lld k=%lld, layout %c%c%s",
        lutra_dtype_name(k->a_dtype), lutra_dtype_name(k->b_dtype), lutra_dtype_name(k->d_dtype),
        (long long)k->m, (long long)k->n, (long long)k->k, k->transa ? 'T' : 'N',
        k->transb ? 'T' : 'N',
        k->deterministic ? " without a split-K reduction (the determinism switch is on)" : "");
  }
  p->backend_plan = c;
  p->epilogue_after = k->epilogue != LUTRA_EPILOGUE_NONE && !c->lt_epilogue;
  p->workspace_bytes = LUTRA_CUDA_WORKSPACE + (c->dequantize ? c->a_bytes + c->b_bytes : 0) +
                       (c->stage_d ? c->d_bytes : 0);
  log_plan(k, c);
  return LUTRA_OK;
}

/* The configurations of one operand setup, best first. */
static bool find_config(cuda_plan *c, const lutra_gemm_key *k) {
  /* an epilogue in cuBLASLt (with the bias) where it takes it, into D's own dtype */
  bool bias = k->bias_dtype >= 0;
  bool found = k->epilogue != LUTRA_EPILOGUE_NONE && lt_epilogue_allowed(k) &&
               try_config(c, k, k->d_dtype, bias, true);
  /* else the plain GEMM: the bias in the epilogue where cuBLASLt takes it, else a kernel; D's
   * own dtype where a kernel writes it, else an f32 scratch, which the GELU-family epilogue
   * kernels always need */
  bool f32_result = gelu_family(k->epilogue);
  if (!found && (!f32_result || k->d_dtype == LUTRA_F32))
    found = (bias && try_config(c, k, k->d_dtype, true, false)) ||
            try_config(c, k, k->d_dtype, false, false);
  if (!found && k->d_dtype != LUTRA_F32) {
    c->stage_d = true;
    found = (bias && try_config(c, k, LUTRA_F32, true, false)) ||
            try_config(c, k, LUTRA_F32, false, false);
  }
  return found;
}

static int dequantize_to_bf16(const lutra_gemm_operand *o, void *out) {
  lutra_dequant_args d = {
      .data = o->data,
      .scale_inv = o->scale_inv,
      .dtype = o->dtype,
      .scaling = o->scaling,
      .rows = o->rows,
      .cols = o->cols,
      .out = out,
      .out_dtype = LUTRA_BF16,
  };
  return lutra_cuda_status(lk_dequantize(&d, lutra_cuda_stream()), "lutra_cuda_gemm",
                           "dequantize for the BF16 fallback");
}

/* The per-call pointers of an epilogue cuBLASLt runs: the aux matrix, and the bias gradient,
 * which cuBLASLt writes through the bias pointer. */
static int set_epilogue_pointers(cuda_plan *c, const lutra_gemm_args *g, const char *fn) {
  if (uses_aux(g->epilogue))
    TRY(lutra_cublas_status(
        cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux,
                                       sizeof g->aux),
        fn, "setting the epilogue aux pointer"));
  if (writes_dbias(g->epilogue))
    TRY(lutra_cublas_status(cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                           &g->dbias, sizeof g->dbias),
                            fn, "setting the bias gradient pointer"));
  return LUTRA_OK;
}

/* The epilogue of a plan whose epilogue cuBLASLt does not run, after the plain GEMM (and the
 * bias): the GELU family in place on the f32 result x (D, or its f32 staging), before the
 * staged D is rounded; BGRADB's k-sums of op(B) from B as stored ([m, k], or [k, m]). */
static int epilogue_kernels(const lutra_gemm_args *g, void *x, int x_dtype, cudaStream_t s,
                            const char *fn) {
  const int64_t mn = g->m * g->n;
  cudaError_t e = cudaSuccess;
  if (g->epilogue == LUTRA_EPILOGUE_BGRADB) {
    const lutra_bias_grad_args b = {.dy = g->b.data,
                                    .dtype = g->b.dtype,
                                    .rows = g->k,
                                    .cols = g->m,
                                    .db = g->dbias,
                                    .db_dtype = g->dbias_dtype};
    e = g->b.trans ? lk_bias_grad(&b, lutra_cuda_reduce_scratch(), s)
                   : lk_row_sum(g->b.data, g->b.dtype, g->m, g->k, g->dbias, g->dbias_dtype, s);
    return lutra_cuda_status(e, fn, "BGRADB bias gradient kernel");
  }
  if (x_dtype != LUTRA_F32)
    return lutra_error(LUTRA_EBACKEND, fn, "the GELU epilogue kernels need an f32 GEMM result");
  switch (g->epilogue) {
  case LUTRA_EPILOGUE_GELU:
    e = lk_activation_forward(
        &(lutra_act_args){
            .x = x, .out = x, .dtype = LUTRA_F32, .act = LUTRA_ACT_GELU_TANH, .n = mn},
        s);
    break;
  case LUTRA_EPILOGUE_GELU_AUX:
    e = lk_gelu_aux(x, g->aux, g->aux_dtype, mn, s);
    break;
  case LUTRA_EPILOGUE_DGELU:
  case LUTRA_EPILOGUE_DGELU_BGRAD:
    e = lk_dgelu(x, g->aux, g->aux_dtype, mn, s);
    if (e == cudaSuccess && g->epilogue == LUTRA_EPILOGUE_DGELU_BGRAD)
      e = lk_bias_grad(&(lutra_bias_grad_args){.dy = x,
                                               .dtype = LUTRA_F32,
                                               .rows = g->m,
                                               .cols = g->n,
                                               .db = g->dbias,
                                               .db_dtype = g->dbias_dtype},
                       lutra_cuda_reduce_scratch(), s);
    break;
  default:
    break;
  }
  return lutra_cuda_status(e, fn, "GEMM epilogue kernels");
}

/* One cublasLtMatmul with its per-call pointers: what call_graphs.c runs directly or captures */
typedef struct matmul_call {
  cuda_plan *c;
  const lutra_gemm_args *g;
  const void *a, *b;
  const void *addend; /* cuBLASLt's C, or NULL: C is D */
  void *d;
  char *ws;
  cudaStream_t s;
} matmul_call;

static int issue_matmul(void *ctx) {
  static const char fn[] = "lutra_cuda_gemm";
  const matmul_call *m = ctx;
  cuda_plan *c = m->c;
  const lutra_gemm_args *g = m->g;
  if (c->fp8_scales) {
    /* per-tensor: one f32 each; block: the tensors' scale arrays, in cuBLASLt's layouts */
    TRY(lutra_cublas_status(cublasLtMatmulDescSetAttribute(c->op,
                                                           CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                           &g->a.scale_inv, sizeof g->a.scale_inv),
                            fn, "setting the A scale pointer"));
    TRY(lutra_cublas_status(cublasLtMatmulDescSetAttribute(c->op,
                                                           CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                           &g->b.scale_inv, sizeof g->b.scale_inv),
                            fn, "setting the B scale pointer"));
  }
  if (g->bias && c->bias_epilogue)
    TRY(lutra_cublas_status(cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                           &g->bias, sizeof g->bias),
                            fn, "setting the bias pointer"));
  if (c->lt_epilogue) TRY(set_epilogue_pointers(c, g, fn));
  const float alpha = 1.0f, beta = g->accumulate || g->c ? 1.0f : 0.0f;
  return lutra_cublas_status(cublasLtMatmul(lutra_cuda_lt(), c->op, &alpha, m->a, c->la, m->b,
                                            c->lb, &beta, m->addend ? m->addend : m->d, c->ld, m->d,
                                            c->ld, &c->algo, m->ws, LUTRA_CUDA_WORKSPACE - 256,
                                            m->s),
                             fn, "cublasLtMatmul");
}

int lutra_cuda_gemm(const lutra_gemm_args *g) {
  static const char fn[] = "lutra_cuda_gemm";
  cuda_plan *c = g->plan->backend_plan;
  const void *a = g->a.data, *b = g->b.data;
  char *ws = g->workspace;
  if (g->workspace_bytes < g->plan->workspace_bytes)
    return lutra_error(LUTRA_EINVAL, fn, "workspace of %zu bytes is smaller than the plan's %zu",
                       g->workspace_bytes, g->plan->workspace_bytes);
  if (c->dequantize) {
    void *wa = ws + LUTRA_CUDA_WORKSPACE, *wb = ws + LUTRA_CUDA_WORKSPACE + c->a_bytes;
    TRY(dequantize_to_bf16(&g->a, wa));
    TRY(dequantize_to_bf16(&g->b, wb));
    a = wa;
    b = wb;
  } else if (c->fp8_scales && (((uintptr_t)g->a.scale_inv | (uintptr_t)g->b.scale_inv) & 15)) {
    return lutra_error(LUTRA_EINVAL, fn, "FP8 scale pointers must be 16-byte aligned");
  }
  cudaStream_t s = lutra_cuda_stream();
  void *d = g->d;
  const void *addend = g->c;
  int d_dtype = g->d_dtype;
  if (c->stage_d) {
    d = ws + LUTRA_CUDA_WORKSPACE + (c->dequantize ? c->a_bytes + c->b_bytes : 0);
    d_dtype = LUTRA_F32;
    if (g->accumulate || addend) /* the staged D starts as the addend: in place from there */
      TRY(lutra_cuda_status(
          lk_convert(addend ? addend : g->d, g->d_dtype, d, LUTRA_F32, g->m * g->n, s), fn,
          "staging D"));
    addend = NULL;
  }
  matmul_call m = {.c = c, .g = g, .a = a, .b = b, .addend = addend, .d = d, .ws = ws, .s = s};
  if (c->dequantize || c->stage_d) {
    TRY(issue_matmul(&m)); /* more than one GEMM call's work: not cached */
  } else {
    const lutra_gemm_call key = {
        .a = a,
        .b = b,
        .d = d,
        .bias = c->bias_epilogue ? g->bias : NULL,
        .aux = c->lt_epilogue ? g->aux : NULL,
        .dbias = c->lt_epilogue ? g->dbias : NULL,
        .a_scale = c->fp8_scales ? g->a.scale_inv : NULL,
        .b_scale = c->fp8_scales ? g->b.scale_inv : NULL,
        .workspace = ws,
        .stream = s,
        .addend = addend,
        .beta = g->accumulate || g->c ? 1.0f : 0.0f,
    };
    TRY(lutra_call_graphs_run(&c->graphs, LUTRA_CALLS_GEMM, &key, sizeof key, s, issue_matmul, &m,
                              fn));
  }
  if (g->bias && !c->bias_epilogue)
    TRY(lutra_cuda_status(lk_add_bias(d, d_dtype, g->bias, g->bias_dtype, g->m, g->n, s), fn,
                          "bias kernel"));
  if (g->epilogue != LUTRA_EPILOGUE_NONE && !c->lt_epilogue)
    TRY(epilogue_kernels(g, d, d_dtype, s, fn));
  if (c->stage_d)
    TRY(lutra_cuda_status(lk_convert(d, LUTRA_F32, g->d, g->d_dtype, g->m * g->n, s), fn,
                          "rounding the staged D"));
  return LUTRA_OK;
}
