/* lutra/base.h: status codes, dtypes, the tensor struct, errors, scalar conversions.
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_BASE_H
#define LUTRA_BASE_H

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
  LUTRA_TENSOR_BORROWED = 2,  /* owned by a module or quantizer: not the caller's to destroy */
  LUTRA_TENSOR_FREED = 4,     /* destroyed: every call on it fails */
  LUTRA_TENSOR_WRITTEN = 8,   /* written through the API (set, fill, copy, random fills) since an
                                 optimizer last synchronized its f32 master copy from it */
  LUTRA_TENSOR_UPDATED = 16,  /* a parameter changed (an optimizer step, a write through the API,
                                 a load) since its module last quantized it for its FP8 weight
                                 cache: what ends a gradient-accumulation window (checkpoint.h) */
  LUTRA_TENSOR_LOADED = 32,   /* a parameter loaded from a checkpoint since its module last
                                 quantized it: the cached FP8 weight is another run's, so a
                                 forward with is_first_microbatch false quantizes it again */
  LUTRA_TENSOR_REPACK = 64    /* a parameter changed (as UPDATED) since its Linear last packed it
                                 for the CPU inference forward (lutra_cpu_set_inference_pack) */
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
  LUTRA_LUA_RO int32_t refs;  /* references to the shell: its owner's or creator's, holders' */
  LUTRA_LUA_RO int32_t held;  /* of refs: those lutra_tensor_retain took (lutra_tensor_unref) */
  LUTRA_LUA_RO int32_t views; /* views alive of this tensor (lutra/tensor_ops.h): its buffers
                               * stay allocated while one lives, even once it was freed */
  struct lutra_tensor *LUTRA_LUA_RO base; /* a view's: the tensor whose buffer it reads (a
                                           * reference held), else NULL */
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
/* Device memory lutra holds: *in_use bytes now and *peak, the most since the last reset (or the
 * start), counted by the CUDA backend's stream-ordered pool (every tensor, optimizer state,
 * GEMM and attention workspace; not cuBLASLt's, cuDNN's or the driver's own). reset_peak != 0
 * starts a new peak at the current use, after reading. The CPU backend does not count its
 * memory: LUTRA_EUNSUPPORTED. */
LUTRA_API int lutra_device_memory(int device, int reset_peak, int64_t *in_use, int64_t *peak);
LUTRA_API int lutra_nvtx_active(void); /* 1 when LUTRA_NVTX=1 was set at load */
/* The CPU backend's GEMM threads (OpenBLAS's, process-wide). Default 1: OpenBLAS's threaded
 * GEMM allocates on the heap at every call it splits, so more threads break the promise of no
 * allocation per training step after warm-up, and they compete with a host's own threads.
 * LUTRA_CPU_THREADS=N in the environment at load sets N; 0 leaves OpenBLAS's own setting
 * (OPENBLAS_NUM_THREADS, or one per core). lutra_cpu_set_threads changes it later (between
 * steps, with no GEMM running); lutra_cpu_threads returns the count GEMMs use. */
LUTRA_API int lutra_cpu_set_threads(int n);
LUTRA_API int lutra_cpu_threads(void);
/* The CPU inference forward's packed weights, process-wide, off by default. On: an inference
 * forward (lutra_forward_args.grad 0) of an f32 Linear on the CPU (and of the Linears inside
 * LayerNormLinear and LayerNormMLP) multiplies by a copy of its weight kept transposed, [in,
 * out], which OpenBLAS reads without the gather its [out, in] layout costs at every call: what
 * ONNX Runtime's prepacking does at load (a 64-64 policy at batch 64: PERFORMANCE.md). The copy
 * is made at the first such forward (the weight's bytes again) and made again at the next one
 * after the weight changed through lutra (an optimizer step, a tensor write, a checkpoint load;
 * a write through the raw data pointer is not seen). Its results may differ from the training
 * forward's in the last bits where OpenBLAS sums the two layouts in different orders (batches
 * of a few rows); off, every inference forward equals the training forward bit for bit. FP8
 * forwards, other dtypes and tied weights are not packed. Set it between steps. */
LUTRA_API int lutra_cpu_set_inference_pack(int on);
LUTRA_API int lutra_cpu_inference_pack(void);

/* ---- scalar conversions (bit-exact; the reference for every backend) ----------------- */
LUTRA_API float lutra_decode(int dtype, uint32_t bits);  /* bf16/f16/e4m3/e5m2/e8m0 -> f32 */
LUTRA_API uint32_t lutra_encode(int dtype, float value); /* f32 -> bits, RNE, FP8 saturating */
LUTRA_API float lutra_dtype_max(int dtype);              /* largest finite value */
LUTRA_API size_t lutra_dtype_size(int dtype);            /* bytes per element, 0 if unknown */
LUTRA_API const char *lutra_dtype_name(int dtype);

/* ---- layout check: the C compiler's view of the structs Lua reads ----------------------- */
LUTRA_API int lutra_layout(int i, const char **type, const char **field, size_t *offset,
                           size_t *size);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_BASE_H */
