/* lutra: FP8/BF16 training of linear layers, scripted from LuaJIT.
 *
 * The one public header. LuaJIT's cdef (lua/lutra/cdef.lua) is generated from it by
 * running the preprocessor with LUTRA_CDEF defined, so everything below the includes must be
 * plain C declarations that LuaJIT's FFI parser accepts (no inline functions, no macros that
 * Lua needs: constants are enums).
 *
 * Conventions
 * - Every entry point returns an int status: LUTRA_OK (0) or a LUTRA_E* code. On failure
 *   lutra_last_error() returns a thread-local message "call: reason", and every object
 *   passed in is left as it was.
 * - Objects are created by lutra_*_new and destroyed by lutra_*_free. lutra_*_release frees
 *   an object's buffers now and marks it freed while keeping its shell, so that later calls
 *   report "was freed" instead of touching freed memory (the Lua front uses it for :free()).
 * - Matrices are row-major. A tensor with more than two dims is used as a matrix of
 *   shape [product of leading dims, last dim].
 */
#ifndef LUTRA_H
#define LUTRA_H

#ifndef LUTRA_CDEF
#include <stddef.h>
#include <stdint.h>
#define LUTRA_API __attribute__((visibility("default")))
#else
#define LUTRA_API
#endif

/* Fields Lua may read but not write: const in the cdef only, so that a script cannot make a
 * tensor claim more elements than its buffers hold (C code owning a tensor still writes them). */
#ifdef LUTRA_CDEF
#define LUTRA_LUA_RO const
#else
#define LUTRA_LUA_RO
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum {
  LUTRA_OK = 0,
  LUTRA_EINVAL = 1,       /* bad argument: NULL, wrong shape, dtype, range */
  LUTRA_ESTATE = 2,       /* call not valid now: freed object, scope misuse, no forward */
  LUTRA_ENOMEM = 3,       /* allocation failed */
  LUTRA_EUNSUPPORTED = 4, /* valid request this build or device cannot run */
  LUTRA_EBACKEND = 5      /* a library under a backend (BLAS, CUDA) failed */
};

enum {
  LUTRA_F32 = 0,
  LUTRA_BF16 = 1,
  LUTRA_F16 = 2,
  LUTRA_E4M3 = 3, /* FP8 E4M3 (fn: no infinities, max 448) */
  LUTRA_E5M2 = 4, /* FP8 E5M2 (IEEE-like, max 57344) */
  LUTRA_E8M0 = 5, /* unsigned power-of-two scale, bias 127, 0xFF is NaN */
  LUTRA_I32 = 6,  /* class labels */
  LUTRA_NUM_DTYPES = 7
};

enum { LUTRA_CPU = 0, LUTRA_CUDA = 1 };

/* How the values of an FP8 tensor are scaled: value = fp8 * scale_inv(block). */
enum {
  LUTRA_SCALING_NONE = 0,     /* not quantized */
  LUTRA_SCALING_TENSOR = 1,   /* one f32 scale_inv for the whole tensor */
  LUTRA_SCALING_MXFP8 = 2,    /* one E8M0 scale per 1x32 block along the row */
  LUTRA_SCALING_BLOCK_1D = 3, /* one f32 scale_inv per 1x128 block along the row */
  LUTRA_SCALING_BLOCK_2D = 4  /* one f32 scale_inv per 128x128 tile */
};

enum { LUTRA_MAX_DIMS = 4 };

enum {
  LUTRA_TENSOR_OWNS_DATA = 1, /* data and scales were allocated by this tensor */
  LUTRA_TENSOR_BORROWED = 2,  /* owned by a module or quantizer: do not free it */
  LUTRA_TENSOR_FREED = 4,     /* released: every call on it fails */
  LUTRA_TENSOR_WRITTEN = 8    /* written through the API (set, fill, copy, random fills) since an
                                 optimizer last synchronized its f32 master copy from it */
};

/* A tensor. Lua reads these fields directly (spec/layout_spec.lua checks the offsets).
 * An FP8 tensor carries its rowwise data and, when asked for, a columnwise copy: the
 * transpose [cols, rows], quantized along its own rows, which is what Hopper's TN-only FP8
 * GEMMs need for dgrad and wgrad. Scale layouts (rows x cols = the matrix view):
 *   TENSOR   scale_inv: 1 f32 (col_scale_inv: 1 f32, same value)
 *   MXFP8    scale_inv: [rows][cols/32] E8M0; col_scale_inv: [cols][rows/32] E8M0
 *   BLOCK_1D and BLOCK_2D (f32) are in the layout cuBLASLt's VEC128_32F / BLK128x128_32F
 *   scale modes read (TransformerEngine's GEMM_READY): for a stored FP8 matrix of R rows and
 *   C cols quantized along its rows (the rowwise data: R = rows, C = cols; the columnwise
 *   copy: R = cols, C = rows), with R4 = roundup(R, 4), NB = ceil(C/128), NB4 = roundup(NB, 4):
 *     BLOCK_1D [NB][R4]: the scale of row r, block j at j * R4 + r (rows are the fast index)
 *     BLOCK_2D [ceil(R/128)][NB4]: tile (i, j) at i * NB4 + j
 *   Padding entries (r >= R; j >= NB) are 0: scale arrays are zeroed when allocated and
 *   quantizers never write them. */
typedef struct lutra_tensor {
  void *LUTRA_LUA_RO data;      /* rowwise values, or NULL when only the columnwise copy exists */
  void *LUTRA_LUA_RO col_data;  /* columnwise (transposed) copy, or NULL */
  void *LUTRA_LUA_RO scale_inv; /* rowwise scale inverses (FP8 only) */
  void *LUTRA_LUA_RO col_scale_inv; /* columnwise scale inverses (FP8 only) */
  float *LUTRA_LUA_RO amax;         /* amax observed when this tensor was quantized, or NULL */
  LUTRA_LUA_RO int64_t shape[4];
  LUTRA_LUA_RO int64_t numel;
  LUTRA_LUA_RO int32_t ndim;
  LUTRA_LUA_RO int32_t dtype;
  LUTRA_LUA_RO int32_t device;
  LUTRA_LUA_RO int32_t scaling;
  LUTRA_LUA_RO uint32_t flags;
  LUTRA_LUA_RO int32_t refs;
} lutra_tensor;

/* ---- errors, version, backends -------------------------------------------------------- */
LUTRA_API const char *lutra_last_error(void);
LUTRA_API const char *lutra_status_name(int status);
LUTRA_API int lutra_version(int *major, int *minor, int *patch);
LUTRA_API int lutra_device_available(int device); /* 1 when the backend can run here */
/* Waits until the device has finished all work lutra queued on it (results read by the host
 * are synchronized already; this is for timing and for sharing buffers with other code). */
LUTRA_API int lutra_device_synchronize(int device);
/* CUDA: run lutra's work on this cudaStream_t (NULL: lutra's own stream). Call it between
 * steps: work already queued stays on the old stream. */
LUTRA_API int lutra_cuda_set_stream(void *stream);
LUTRA_API int lutra_nvtx_active(void); /* 1 when LUTRA_NVTX=1 was set at load */

/* ---- scalar conversions (bit-exact; the reference for every backend) ----------------- */
LUTRA_API float lutra_decode(int dtype, uint32_t bits);  /* bf16/f16/e4m3/e5m2/e8m0 -> f32 */
LUTRA_API uint32_t lutra_encode(int dtype, float value); /* f32 -> bits, RNE, FP8 saturating */
LUTRA_API float lutra_dtype_max(int dtype);              /* largest finite value */
LUTRA_API size_t lutra_dtype_size(int dtype);            /* bytes per element, 0 if unknown */
LUTRA_API const char *lutra_dtype_name(int dtype);

/* ---- tensors ---------------------------------------------------------------------------- */
/* Zero-filled (every dtype). Refused with LUTRA_EINVAL when a byte count overflows. */
LUTRA_API int lutra_tensor_new(int dtype, int ndim, const int64_t *shape, int device,
                               lutra_tensor **out);
LUTRA_API int lutra_tensor_free(lutra_tensor *t);
LUTRA_API int lutra_tensor_release(lutra_tensor *t);
/* References to a tensor's shell. A tensor owned by a module, quantizer or loss stays readable
 * while its owner keeps it; a reference taken here keeps the shell (not the buffers) beyond
 * that, so that a later call on it fails with "was freed" instead of reading freed memory. The
 * Lua front takes one for every such tensor it hands out. Unref drops one (the last frees). */
LUTRA_API void lutra_tensor_retain(lutra_tensor *t);
LUTRA_API int lutra_tensor_unref(lutra_tensor *t);
/* Copy n values in or out, converting from/to f32 (FP8 tensors are dequantized on read). */
LUTRA_API int lutra_tensor_set_f32(lutra_tensor *t, const float *src, int64_t n);
LUTRA_API int lutra_tensor_get_f32(const lutra_tensor *t, float *dst, int64_t n);
LUTRA_API int lutra_tensor_set_i32(lutra_tensor *t, const int32_t *src, int64_t n);
/* Raw bytes of the rowwise data (or of the columnwise copy when columnwise != 0). */
LUTRA_API int lutra_tensor_get_bytes(const lutra_tensor *t, int columnwise, void *dst,
                                     size_t bytes);
LUTRA_API int lutra_tensor_fill(lutra_tensor *t, float value);
/* Deterministic fills (xoshiro256**, Box-Muller), the same on every backend. */
/* The process-wide seed generator: lutra_seed_next hands out the next seed (splitmix64 of a
 * state that lutra_manual_seed sets; it starts from a fixed value, so unseeded runs repeat).
 * Fills and layers created without a seed of their own draw theirs from it. */
LUTRA_API int lutra_manual_seed(uint64_t seed);
LUTRA_API int lutra_seed_next(uint64_t *out);
LUTRA_API int lutra_tensor_randn(lutra_tensor *t, uint64_t seed, float mean, float stddev);
LUTRA_API int lutra_tensor_uniform(lutra_tensor *t, uint64_t seed, float lo, float hi);
LUTRA_API int lutra_tensor_copy(lutra_tensor *dst, const lutra_tensor *src); /* converts */
LUTRA_API int lutra_tensor_reshape(lutra_tensor *t, int ndim, const int64_t *shape);
LUTRA_API int lutra_tensor_amax(const lutra_tensor *t, float *amax); /* host result */

/* ---- recipes ----------------------------------------------------------------------------- */
typedef struct lutra_recipe lutra_recipe;

enum { LUTRA_FORMAT_E4M3 = 0, LUTRA_FORMAT_HYBRID = 1, LUTRA_FORMAT_E5M2 = 2 };
enum { LUTRA_AMAX_MAX = 0, LUTRA_AMAX_MOST_RECENT = 1 };
enum {
  LUTRA_RECIPE_DELAYED = 0,
  LUTRA_RECIPE_CURRENT = 1,
  LUTRA_RECIPE_MXFP8 = 2,
  LUTRA_RECIPE_BLOCK = 3,
  LUTRA_RECIPE_CUSTOM = 4
};
/* Tensor roles a recipe quantizes. */
enum {
  LUTRA_ROLE_INPUT = 0,
  LUTRA_ROLE_WEIGHT = 1,
  LUTRA_ROLE_GRAD_OUTPUT = 2,
  LUTRA_NUM_ROLES = 3
};
/* Quantizer kinds a custom recipe may name per role. */
enum {
  LUTRA_QUANT_NONE = 0, /* keep this role in high precision */
  LUTRA_QUANT_DELAYED = 1,
  LUTRA_QUANT_CURRENT = 2,
  LUTRA_QUANT_MXFP8 = 3,
  LUTRA_QUANT_BLOCK_1D = 4,
  LUTRA_QUANT_BLOCK_2D = 5
};

/* TransformerEngine's DelayedScaling. Defaults: lutra_delayed_defaults(). */
typedef struct lutra_delayed_desc {
  int32_t fp8_format;        /* HYBRID (default) or E4M3; E5M2 is refused */
  int32_t margin;            /* 0..32; scale = fp8_max / amax / 2^margin */
  int32_t amax_history_len;  /* >= 1, default 1024 */
  int32_t amax_compute_algo; /* LUTRA_AMAX_MAX (default) or LUTRA_AMAX_MOST_RECENT */
  int32_t reduce_amax;       /* reduce amaxes across the scope's group (default 1) */
} lutra_delayed_desc;

/* Float8CurrentScaling: per-tensor scale from the tensor's own amax. */
typedef struct lutra_current_desc {
  int32_t fp8_format;       /* HYBRID (default) or E4M3 */
  int32_t power_2_scale[3]; /* per role, default 0 */
  float amax_epsilon[3];    /* per role, default 0 */
} lutra_current_desc;

/* MXFP8BlockScaling: 1x32 blocks, E8M0 scales rounded up. */
typedef struct lutra_mxfp8_desc {
  int32_t fp8_format; /* E4M3 (default) or HYBRID */
  int32_t margin;     /* kept for TE parity; must be 0 */
} lutra_mxfp8_desc;

/* Float8BlockScaling: 1x128 blocks for inputs and grads, 128x128 tiles for weights. */
typedef struct lutra_block_desc {
  int32_t fp8_format;       /* E4M3 (default) or HYBRID */
  int32_t power_2_scale[3]; /* per role, default 1 */
  float amax_epsilon[3];    /* per role, default 0 */
  int32_t block_dim[3];     /* per role: 1 (1x128) or 2 (128x128); default {1, 2, 1} */
} lutra_block_desc;

/* Custom: one quantizer per role. The delayed fields apply to roles that use DELAYED. */
typedef struct lutra_custom_desc {
  int32_t kind[3];   /* LUTRA_QUANT_* per role */
  int32_t format[3]; /* LUTRA_E4M3 or LUTRA_E5M2 per role */
  int32_t power_2_scale[3];
  float amax_epsilon[3];
  int32_t margin;
  int32_t amax_history_len;
  int32_t amax_compute_algo;
  int32_t reduce_amax;
} lutra_custom_desc;

LUTRA_API void lutra_delayed_defaults(lutra_delayed_desc *d);
LUTRA_API void lutra_current_defaults(lutra_current_desc *d);
LUTRA_API void lutra_mxfp8_defaults(lutra_mxfp8_desc *d);
LUTRA_API void lutra_block_defaults(lutra_block_desc *d);
LUTRA_API void lutra_custom_defaults(lutra_custom_desc *d);
LUTRA_API int lutra_recipe_delayed(const lutra_delayed_desc *d, lutra_recipe **out);
LUTRA_API int lutra_recipe_current(const lutra_current_desc *d, lutra_recipe **out);
LUTRA_API int lutra_recipe_mxfp8(const lutra_mxfp8_desc *d, lutra_recipe **out);
LUTRA_API int lutra_recipe_block(const lutra_block_desc *d, lutra_recipe **out);
LUTRA_API int lutra_recipe_custom(const lutra_custom_desc *d, lutra_recipe **out);
LUTRA_API int lutra_recipe_free(lutra_recipe *r);
LUTRA_API int lutra_recipe_release(lutra_recipe *r);
LUTRA_API int lutra_recipe_kind(const lutra_recipe *r, int *kind);
/* What the recipe does with a role: LUTRA_QUANT_* kind and FP8 dtype. */
LUTRA_API int lutra_recipe_role(const lutra_recipe *r, int role, int *quant_kind, int *dtype);
/* 64-bit key of the recipe's fields, computed once at creation. Equal fields, equal keys. */
LUTRA_API int lutra_recipe_key(const lutra_recipe *r, uint64_t *key);

/* ---- process groups (amax reduction); NULL is the single-process group ----------------- */
typedef struct lutra_group lutra_group;

/* ---- autocast scopes --------------------------------------------------------------------- */
typedef struct lutra_autocast lutra_autocast;

LUTRA_API int lutra_autocast_new(lutra_recipe *r, lutra_group *g, int enabled, int calibrating,
                                 lutra_autocast **out);
LUTRA_API int lutra_autocast_free(lutra_autocast *a);
LUTRA_API int lutra_autocast_release(lutra_autocast *a);
LUTRA_API int lutra_autocast_enter(lutra_autocast *a); /* refuses a scope already entered */
LUTRA_API int lutra_autocast_exit(lutra_autocast *a);  /* refuses a scope not innermost */
/* Error recovery: exits every scope of this thread above depth (lutra_autocast_state's depth
 * saved before entering), innermost first. Exiting the outermost scope this way discards the
 * amaxes recorded inside it instead of updating the scales with them (what a failed step
 * observed must not feed the next update). */
LUTRA_API int lutra_autocast_unwind(int depth);
/* The calling thread's state: depth of nesting, whether FP8 compute is on, calibration. */
LUTRA_API int lutra_autocast_state(int *depth, int *enabled, int *calibrating);
/* Number of delayed-scaling updates run on this thread (forward and backward), and the
 * number of quantizer metas the last one covered: for specs and benchmarks. */
LUTRA_API int lutra_autocast_update_stats(uint64_t *updates, int *last_count);

/* ---- quantizers -------------------------------------------------------------------------- */
typedef struct lutra_quantizer lutra_quantizer;

/* A quantizer for one role of a recipe. rowwise/columnwise select the outputs. */
LUTRA_API int lutra_quantizer_new(const lutra_recipe *r, int role, int rowwise, int columnwise,
                                  int device, lutra_quantizer **out);
LUTRA_API int lutra_quantizer_free(lutra_quantizer *q);
LUTRA_API int lutra_quantizer_release(lutra_quantizer *q);
/* A reference to a quantizer (one a module owns, too): it keeps the struct, not the state, so
 * that calls after its owner freed or rebuilt it fail with "was freed". Unref drops one. */
LUTRA_API void lutra_quantizer_retain(lutra_quantizer *q);
LUTRA_API int lutra_quantizer_unref(lutra_quantizer *q);
/* Quantize x into the quantizer's own output tensor (reused while the shape stays). */
LUTRA_API int lutra_quantize(lutra_quantizer *q, const lutra_tensor *x, lutra_tensor **out);
/* lutra_quantize that also writes the bias gradient of x: dbias[c] (+= when accumulate)
 * sum_r x[r, c] (x seen as [rows, cols]); fused into the quantization kernel on CUDA where it
 * writes a columnwise copy (TransformerEngine's quantize_dbias for grad_output). */
LUTRA_API int lutra_quantize_dbias(lutra_quantizer *q, const lutra_tensor *x, lutra_tensor *dbias,
                                   int accumulate, lutra_tensor **out);
/* lutra_quantize_dbias (dbias NULL: lutra_quantize) under a skip flag, TransformerEngine's noop
 * flag: skip is an i32 tensor of one element on the quantizer's device (NULL: never skip). When
 * it holds a nonzero value at the time the work runs (on CUDA: when the kernels run, so device
 * work queued before, or a change between replays of a CUDA graph, counts), the quantization
 * writes nothing at all: the output keeps its codes, scale_inv and amax, the quantizer its scale
 * and amax history, dbias its values. The output is reallocated (and then left unwritten) when
 * x's shape differs from the last call's. */
LUTRA_API int lutra_quantize_skip(lutra_quantizer *q, const lutra_tensor *x,
                                  const lutra_tensor *skip, lutra_tensor *dbias, int accumulate,
                                  lutra_tensor **out);
/* Delayed scaling: roll this quantizer's amax history and update its scale (one backend call). */
LUTRA_API int lutra_quantizer_update(lutra_quantizer *q);
/* Delayed/current scaling state, copied to the host. history may be NULL. */
LUTRA_API int lutra_quantizer_scale(const lutra_quantizer *q, float *scale, float *scale_inv);
LUTRA_API int lutra_quantizer_history(const lutra_quantizer *q, float *history, int len);
/* Delayed scaling: overwrite the most recent amax (history[0]), as a cast would record it. */
LUTRA_API int lutra_quantizer_record_amax(lutra_quantizer *q, float amax);
LUTRA_API int lutra_dequantize(const lutra_tensor *q, int columnwise, lutra_tensor *out);

/* ---- GEMM -------------------------------------------------------------------------------- */
/* D = op_b(B) @ op_a(A) (+ bias broadcast over rows) (+ D when accumulate), row-major, with
 * TransformerEngine's layout names: transa/transb say whether A/B are used transposed.
 *   "TN" (transa=1, transb=0): D = B @ A^T   fprop: A = weight [out,in], B = input [N,in]
 *   "NN" (transa=0, transb=0): D = B @ A     dgrad: A = weight, B = grad_output
 *   "NT" (transa=0, transb=1): D = B^T @ A   wgrad: A = input, B = grad_output
 * FP8 operands are run as TN through their columnwise copies (Hopper's only FP8 layout). */
LUTRA_API int lutra_gemm(const lutra_tensor *a, int transa, const lutra_tensor *b, int transb,
                         lutra_tensor *d, const lutra_tensor *bias, int accumulate);

/* GEMM epilogues, as TransformerEngine runs them through cuBLASLt, in lutra's row-major naming
 * (P = op(B) [m,k] @ op(A) [k,n], computed in f32; everything below is applied to the f32 P
 * and rounded once into each output's dtype):
 *   NONE         D = P (+ bias[n]) (+ D when accumulate): lutra_gemm.
 *   GELU         D = gelu(P + bias)                                   (cuBLASLt GELU[_BIAS])
 *   GELU_AUX     D = gelu(P + bias), aux [m,n] = P + bias, the pre-activation that DGELU
 *                reads back in backward                       (cuBLASLt GELU_AUX[_BIAS])
 *   DGELU        D = P * gelu'(aux), aux [m,n] saved by GELU_AUX            (cuBLASLt DGELU)
 *   DGELU_BGRAD  DGELU, and dbias[n] = sum over rows of D: the bias gradient of the GELU input,
 *                summed from the f32 values before D's rounding          (cuBLASLt DGELU_BGRAD)
 *   BGRADB       D = P (+ D when accumulate), and dbias[m] = sum over k of op(B)[m,k]: in the
 *                wgrad layout NT (D[out,in] = dY^T X, B = dY [N,out]) the column sums of dY,
 *                the bias gradient                                          (cuBLASLt BGRADB)
 * gelu is the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the formula
 * of lutra_gelu_new and of cuBLASLt's GELU epilogue. Rules (refused with LUTRA_EINVAL,
 * nothing written, otherwise):
 * - aux: the shape of D ([m,n] as a matrix), D's dtype and device, not D itself; only for
 *   GELU_AUX, DGELU, DGELU_BGRAD. dbias: f32, bf16 or f16 on D's device, m or n elements as
 *   above; only for DGELU_BGRAD and BGRADB. Dbias sums run in double (CPU) and are rounded once.
 * - accumulate only with NONE and BGRADB: the GELU epilogues would apply to D_old + P.
 * - bias only with NONE, GELU, GELU_AUX (DGELU_BGRAD and BGRADB write dbias through
 *   cuBLASLt's bias pointer).
 * - FP8 operands with NONE, GELU, GELU_AUX (TE's FP8 fprop runs GELU_AUX_BIAS); DGELU,
 *   DGELU_BGRAD and BGRADB take f32/bf16/f16 operands (TE's FP8 backward computes dgelu and
 *   dbias in the cast of grad_output, not in the GEMM). */
enum {
  LUTRA_EPILOGUE_NONE = 0,
  LUTRA_EPILOGUE_GELU = 1,
  LUTRA_EPILOGUE_GELU_AUX = 2,
  LUTRA_EPILOGUE_DGELU = 3,
  LUTRA_EPILOGUE_DGELU_BGRAD = 4,
  LUTRA_EPILOGUE_BGRADB = 5,
  LUTRA_NUM_EPILOGUES = 6
};
typedef struct lutra_gemm_epilogue {
  int32_t kind; /* LUTRA_EPILOGUE_* */
  int32_t pad;
  lutra_tensor *aux;   /* GELU_AUX: output; DGELU, DGELU_BGRAD: input; else NULL */
  lutra_tensor *dbias; /* DGELU_BGRAD, BGRADB: output; else NULL */
} lutra_gemm_epilogue;
/* lutra_gemm with an epilogue; epi NULL is LUTRA_EPILOGUE_NONE (then it is lutra_gemm). */
LUTRA_API int lutra_gemm_ex(const lutra_tensor *a, int transa, const lutra_tensor *b, int transb,
                            lutra_tensor *d, const lutra_tensor *bias, int accumulate,
                            const lutra_gemm_epilogue *epi);
/* Plans (one per shape/dtype/layout/epilogue) and workspace bytes held by the caches. */
LUTRA_API int lutra_gemm_cache_stats(int *plans, size_t *workspace_bytes);
/* Eager cuda GEMMs replayed as one-GEMM CUDA graphs: a call seen again with the same arguments
 * (pointers, beta, stream) runs as a cudaGraphLaunch of its captured cublasLtMatmul, which costs
 * the host several times less than the call itself (BENCHMARKS.md), with the same results
 * (src/backend/cuda/gemm_graphs.c; LUTRA_GEMM_GRAPHS=0 at load turns it off). graphs: cached now;
 * launches: calls served so far. */
LUTRA_API int lutra_gemm_graph_stats(int64_t *graphs, int64_t *launches);

/* ---- CUDA graphs --------------------------------------------------------------------------- */
/* Capture everything this thread issues on lutra's CUDA stream between begin and end into one
 * graph; lutra_graph_replay runs it again with one launch. Run the step once eagerly first: a
 * capture refuses (with an error, ending nothing) allocations (first use of a shape, a shape
 * change), host transfers and synchronizations (e.g. reading a loss), and cpu-device work; after
 * an error inside a capture call lutra_graph_abort. Frees during a capture are deferred to its end.
 * The graph holds the device addresses of the buffers the step used: keep those tensors, modules,
 * quantizers and optimizers alive and their shapes unchanged while replaying; copy new inputs into
 * the captured input tensors. */
typedef struct lutra_graph lutra_graph;
LUTRA_API int lutra_graph_begin(int device);
LUTRA_API int lutra_graph_end(lutra_graph **out);
/* Ends a capture in progress and discards it (no-op when none is). */
LUTRA_API int lutra_graph_abort(void);
LUTRA_API int lutra_graph_capturing(void);
LUTRA_API int lutra_graph_replay(lutra_graph *g);
/* nodes: kernels, copies and memsets in the graph; replays: lutra_graph_replay calls so far */
LUTRA_API int lutra_graph_info(const lutra_graph *g, int64_t *nodes, int64_t *replays);
LUTRA_API int lutra_graph_release(lutra_graph *g);
LUTRA_API int lutra_graph_free(lutra_graph *g);

/* ---- modules ----------------------------------------------------------------------------- */
typedef struct lutra_module lutra_module;

/* is_first_microbatch of lutra_module_forward. DEVICE: the weight is quantized on every call,
 * under the device's skip-weight-update flag (lutra_set_skip_weight_update), which the
 * quantization reads when it runs: 0 quantizes (and caches), 1 keeps the FP8 weight of the last
 * quantization. For CUDA graphs of gradient accumulation, where the host cannot choose between
 * 1 and 0 per replay. The first forward of a Linear (and the first after a recipe change) must
 * quantize: it is refused while the flag is set from the host. */
enum { LUTRA_FIRST_MICROBATCH_NONE = -1, LUTRA_FIRST_MICROBATCH_DEVICE = 2 };

typedef struct lutra_linear_desc {
  int64_t in_features;
  int64_t out_features;
  int32_t bias;                 /* default 1 */
  int32_t dtype;                /* parameter and activation dtype: F32 (default) or BF16 */
  int32_t device;               /* LUTRA_CPU (default) */
  int32_t accumulate_main_grad; /* wgrad accumulates into an f32 main_grad buffer */
  uint64_t seed; /* weight init: uniform(-1/sqrt(in), 1/sqrt(in)); default: the next seed of
                    the global generator (lutra_seed_next) */
} lutra_linear_desc;

LUTRA_API void lutra_linear_defaults(lutra_linear_desc *d);
LUTRA_API int lutra_linear_new(const lutra_linear_desc *d, lutra_module **out);
LUTRA_API int lutra_gelu_new(lutra_module **out);
/* LayerNorm and RMSNorm over the last dim (TransformerEngine's LayerNorm / RMSNorm): weight
 * [hidden] (ones, or zeros when zero_centered_gamma: the stored weight is gamma - 1) and, for
 * LayerNorm, bias [hidden] (zeros), in dtype; the input must have dtype and hidden features. */
typedef struct lutra_norm_desc {
  int64_t hidden;
  float eps;                   /* default 1e-5 */
  int32_t rms;                 /* 1: RMSNorm (no bias) */
  int32_t zero_centered_gamma; /* default 0 */
  int32_t dtype;               /* F32 (default) or BF16 */
  int32_t device;              /* LUTRA_CPU (default) */
} lutra_norm_desc;
LUTRA_API void lutra_norm_defaults(lutra_norm_desc *d);
LUTRA_API int lutra_layernorm_new(const lutra_norm_desc *d, lutra_module **out);
/* ---- activations (TransformerEngine's set) ----
 * lutra_activation_new(kind): an activation module of a LUTRA_ACTIVATION_* kind; lutra_gelu_new
 * is kind GELU_TANH, the only one a Linear before it runs in its GEMM's epilogue. Gated kinds
 * take an input whose last dim is 2h and give h: the first half a is the gate, the second b the
 * linear part (TE's order), y = f(a) b; their last dim must be even (LUTRA_EINVAL otherwise). */
enum {
  LUTRA_ACTIVATION_GELU_TANH = 1, /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
  LUTRA_ACTIVATION_RELU = 2,      /* max(x, 0) */
  LUTRA_ACTIVATION_SILU = 3,      /* x sigmoid(x) */
  LUTRA_ACTIVATION_QGELU = 4,     /* x sigmoid(1.702 x), QuickGELU */
  LUTRA_ACTIVATION_SRELU = 5,     /* relu(x)^2, SquaredReLU */
  LUTRA_ACTIVATION_GELU_ERF = 6,  /* 0.5 x (1 + erf(x / sqrt 2)), the exact GELU */
  LUTRA_ACTIVATION_SWIGLU = 7,    /* silu(a) b */
  LUTRA_ACTIVATION_GEGLU = 8,     /* gelu_tanh(a) b */
  LUTRA_ACTIVATION_REGLU = 9,     /* relu(a) b */
};
LUTRA_API int lutra_activation_new(int kind, lutra_module **out);
/* ---- end activations ---- */
/* A chain of modules; it holds a reference to each. A Linear followed by a GELU runs as one
 * GEMM with the GELU in its epilogue, and the Linear after that GELU applies gelu' in its dgrad
 * GEMM (not with FP8 operands, where the GELU's backward kernel runs). */
LUTRA_API int lutra_sequential_new(lutra_module *const *mods, int n, lutra_module **out);
/* Linear+GELU pairs the last forward and backward of a Sequential fused into GEMM epilogues. */
LUTRA_API int lutra_sequential_fusions(const lutra_module *m, int *forward, int *backward);
LUTRA_API int lutra_module_free(lutra_module *m);
LUTRA_API int lutra_module_release(lutra_module *m);
LUTRA_API const char *lutra_module_kind(const lutra_module *m);
/* What one forward call is told beyond its input, for every module kind (fields a module does
 * not use are ignored; start from lutra_forward_defaults so that new fields get their defaults).
 *   is_first_microbatch  -1 (always quantize weights), 1 (quantize and cache), 0 (reuse), 2
 *                        (LUTRA_FIRST_MICROBATCH_DEVICE: quantize unless the device's
 *                        skip-weight-update flag is set)
 *   grad                 nonzero (default): a backward follows. 0: an inference forward; the
 *                        module keeps nothing for backward, and a backward after it is refused */
typedef struct lutra_forward_args {
  int32_t is_first_microbatch;
  int32_t grad;
} lutra_forward_args;
LUTRA_API void lutra_forward_defaults(lutra_forward_args *a);
LUTRA_API int lutra_module_forward_ex(lutra_module *m, const lutra_tensor *x,
                                      const lutra_forward_args *a, lutra_tensor **y);
/* lutra_module_forward_ex with the defaults and is_first_microbatch. */
LUTRA_API int lutra_module_forward(lutra_module *m, const lutra_tensor *x, int is_first_microbatch,
                                   lutra_tensor **y);
/* dx NULL: the input's gradient is not wanted (the input is data, as a tensor without
 * requires_grad in PyTorch): the module skips the work that only it needs (a Linear's dgrad GEMM,
 * a Sequential's first module's); parameter gradients are computed as always. */
LUTRA_API int lutra_module_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx);
/* Parameters: weight, bias, their gradients and main grads, by index. NULL where absent. */
typedef struct lutra_param {
  lutra_tensor *value;
  lutra_tensor *grad;      /* written by backward (overwritten each backward) */
  lutra_tensor *main_grad; /* f32, accumulated by backward when asked for, else NULL */
} lutra_param;
LUTRA_API int lutra_module_num_params(const lutra_module *m, int *n);
LUTRA_API int lutra_module_param(const lutra_module *m, int i, lutra_param *out);
LUTRA_API int lutra_module_zero_grad(lutra_module *m);
/* The device's skip-weight-update flag (TransformerEngine's skip_fp8_weight_update), read by
 * forwards with is_first_microbatch LUTRA_FIRST_MICROBATCH_DEVICE: nonzero skips their weight
 * quantization. It lives in device memory (zero at first use) and is set in stream order (work
 * queued before sees the old value, work and graph replays queued after the new one), without
 * synchronizing. Refused while this thread captures a CUDA graph: set it between replays. */
LUTRA_API int lutra_set_skip_weight_update(int device, int skip);
/* Linear only: the quantizer a role used in the last forward/backward, or NULL. */
LUTRA_API int lutra_linear_quantizer(const lutra_module *m, int role, lutra_quantizer **out);

/* ---- losses ------------------------------------------------------------------------------ */
typedef struct lutra_loss lutra_loss;
enum { LUTRA_LOSS_MSE = 0, LUTRA_LOSS_SOFTMAX_XENT = 1 };

LUTRA_API int lutra_loss_new(int kind, lutra_loss **out);
LUTRA_API int lutra_loss_free(lutra_loss *l);
LUTRA_API int lutra_loss_release(lutra_loss *l);
/* MSE: target has pred's shape. Softmax cross-entropy: pred [N, C], target I32 labels [N].
 * The loss is a mean over rows (MSE: over all elements), written to a 1-element f32 tensor. */
LUTRA_API int lutra_loss_forward(lutra_loss *l, const lutra_tensor *pred,
                                 const lutra_tensor *target, lutra_tensor **loss);
LUTRA_API int lutra_loss_backward(lutra_loss *l, lutra_tensor **dpred);
LUTRA_API int lutra_loss_value(const lutra_loss *l, float *value); /* host copy of the loss */

/* ---- optimizers -------------------------------------------------------------------------- */
typedef struct lutra_optim lutra_optim;
enum { LUTRA_OPTIM_SGD = 0, LUTRA_OPTIM_ADAMW = 1 };

typedef struct lutra_optim_desc {
  int32_t kind;
  float lr;
  float momentum;     /* SGD */
  float weight_decay; /* SGD: L2 added to the gradient; AdamW: decoupled */
  float beta1, beta2, eps;
} lutra_optim_desc;

LUTRA_API void lutra_optim_defaults(int kind, lutra_optim_desc *d);
/* Collects the parameters of m (and its children) once. BF16 parameters get f32 masters. */
LUTRA_API int lutra_optim_new(const lutra_optim_desc *d, lutra_module *m, lutra_optim **out);
LUTRA_API int lutra_optim_free(lutra_optim *o);
LUTRA_API int lutra_optim_release(lutra_optim *o);
/* AdamW on cuda keeps its step count (bias correction) in device memory and its kernel advances
 * it, so a CUDA graph that captured a step takes the next step at every replay; lr, betas, eps
 * and weight decay are captured by value (lutra_optim_set_lr does not reach a captured step). */
LUTRA_API int lutra_optim_step(lutra_optim *o);
LUTRA_API int lutra_optim_set_lr(lutra_optim *o, float lr);

/* ---- layout check: the C compiler's view of the structs Lua reads ----------------------- */
LUTRA_API int lutra_layout(int i, const char **type, const char **field, size_t *offset,
                           size_t *size);

#ifdef __cplusplus
}
#endif
#endif
