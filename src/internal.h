/* Shared by the C core: error reporting, argument checks, object headers. Not installed. */
#ifndef LUTRA_INTERNAL_H
#define LUTRA_INTERNAL_H

#include "backend.h"
#include "lutra.h"

#include <stdbool.h>
#include <string.h>

/* Sets the thread-local last error to "fn: <formatted reason>" and returns status. */
int lutra_error(int status, const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Argument checks: each returns from the calling entry point with a status and a message
 * naming it. They rely on a local `static const char fn[]` naming the entry point. */
#define CHECK_ARG(cond, ...)                                                                       \
  do {                                                                                             \
    if (!(cond)) return lutra_error(LUTRA_EINVAL, fn, __VA_ARGS__);                                \
  } while (0)
#define CHECK_STATE(cond, ...)                                                                     \
  do {                                                                                             \
    if (!(cond)) return lutra_error(LUTRA_ESTATE, fn, __VA_ARGS__);                                \
  } while (0)
#define TRY(expr)                                                                                  \
  do {                                                                                             \
    int st_ = (expr);                                                                              \
    if (st_ != LUTRA_OK) return st_;                                                               \
  } while (0)

/* NVTX ranges (trace.c): LUTRA_NVTX=1 at load turns them on. */
extern int lutra_nvtx_enabled;
void lutra_range_push(const char *name);
void lutra_range_pop(void);
#define RANGE_PUSH(name)                                                                           \
  do {                                                                                             \
    if (lutra_nvtx_enabled) lutra_range_push(name);                                                \
  } while (0)
#define RANGE_POP()                                                                                \
  do {                                                                                             \
    if (lutra_nvtx_enabled) lutra_range_pop();                                                     \
  } while (0)

/* Every opaque object starts with this header, so "was freed" and "is NULL" are reported the
 * same way everywhere. */
enum { LUTRA_OBJ_FREED = 1 };
typedef struct lutra_object {
  uint32_t magic;
  uint32_t flags;
  int32_t refs;
  int32_t pad;
} lutra_object;

enum {
  LUTRA_MAGIC_RECIPE = 0x4c524543u,
  LUTRA_MAGIC_AUTOCAST = 0x4c415554u,
  LUTRA_MAGIC_QUANTIZER = 0x4c51554eu,
  LUTRA_MAGIC_MODULE = 0x4c4d4f44u,
  LUTRA_MAGIC_LOSS = 0x4c4c4f53u,
  LUTRA_MAGIC_OPTIM = 0x4c4f5054u,
  LUTRA_MAGIC_GRAPH = 0x4c475248u
};

/* LUTRA_OK when obj is a live object of the given magic; else an error naming fn and what. */
int lutra_check_object(const void *obj, uint32_t magic, const char *fn, const char *what);
int lutra_check_tensor(const lutra_tensor *t, const char *fn, const char *what);

/* f32 bit patterns, for the exact conversions */
static inline uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static inline float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* dtype helpers */
bool lutra_dtype_is_float(int dtype); /* F32, BF16, F16 */
bool lutra_dtype_is_fp8(int dtype);   /* E4M3, E5M2 */
static inline int64_t lutra_rows(const lutra_tensor *t) {
  return t->ndim >= 1 ? t->numel / t->shape[t->ndim - 1] : 1;
}
static inline int64_t lutra_cols(const lutra_tensor *t) {
  return t->ndim >= 1 ? t->shape[t->ndim - 1] : 1;
}

/* Tensors owned by modules and quantizers: created borrowed (Lua must not free them) and
 * resized only when the shape changes. *t is replaced only on success. */
int lutra_tensor_ensure(lutra_tensor **t, int dtype, int scaling, int ndim, const int64_t *shape,
                        int device, bool rowwise, bool columnwise, const char *fn);
/* The same in two steps, for calls that must change nothing when a later step fails:
 * prepare gives the current tensor when it fits, else a new one (the current one untouched);
 * commit installs it (destroying the old), discard drops it. */
int lutra_tensor_prepare(lutra_tensor *cur, int dtype, int scaling, int ndim, const int64_t *shape,
                         int device, bool rowwise, bool columnwise, lutra_tensor **out,
                         const char *fn);
void lutra_tensor_commit(lutra_tensor **slot, lutra_tensor *t);
void lutra_tensor_discard(lutra_tensor *slot, lutra_tensor *t);
/* Re-raises the current error under the entry point fn: "fn: <the inner message>". */
int lutra_error_wrap(int status, const char *fn);
/* Allocates a tensor (FP8 ones with their scale arrays) with the given flags. */
int lutra_tensor_make(int dtype, int scaling, int ndim, const int64_t *shape, int device,
                      bool rowwise, bool columnwise, uint32_t flags, lutra_tensor **out,
                      const char *fn);
/* Frees a tensor's buffers and shell regardless of flags (for owners). */
void lutra_tensor_destroy(lutra_tensor *t);
bool lutra_same_shape(const lutra_tensor *a, const lutra_tensor *b);

/* Element count of the scale_inv arrays of a quantized [rows, cols] matrix. */
int64_t lutra_scale_count(int scaling, int64_t rows, int64_t cols, bool columnwise);

/* The GEMM front as modules use it (lutra_gemm checks its arguments first). */
int lutra_gemm_run(const lutra_tensor *a, int transa, const lutra_tensor *b, int transb,
                   lutra_tensor *d, const lutra_tensor *bias, int accumulate, int fast_accum,
                   const char *fn);
/* The same with an epilogue (NULL: LUTRA_EPILOGUE_NONE); checks the epilogue's rules. */
int lutra_gemm_run_ex(const lutra_tensor *a, int transa, const lutra_tensor *b, int transb,
                      lutra_tensor *d, const lutra_tensor *bias, int accumulate, int fast_accum,
                      const lutra_gemm_epilogue *epi, const char *fn);

/* Quantizer internals used by modules and autocast. */
typedef struct lutra_quantizer_spec {
  int32_t kind;  /* LUTRA_QUANT_* */
  int32_t dtype; /* E4M3 / E5M2 */
  int32_t power_2_scale;
  float amax_epsilon;
  int32_t margin;
  int32_t amax_history_len;
  int32_t amax_compute_algo;
  int32_t block_dim;
} lutra_quantizer_spec;

struct lutra_recipe {
  lutra_object obj;
  int32_t kind;
  int32_t reduce_amax;
  lutra_quantizer_spec roles[LUTRA_NUM_ROLES];
  uint64_t key;
};

lutra_scale_meta *lutra_quantizer_meta(lutra_quantizer *q);
int lutra_quantize_run(lutra_quantizer *q, const lutra_tensor *x, bool record_amax,
                       lutra_tensor **out, const char *fn);
int lutra_quantizer_create(const lutra_quantizer_spec *s, int rowwise, int columnwise, int device,
                           lutra_quantizer **out, const char *fn);
void lutra_quantizer_destroy(lutra_quantizer *q);
/* Checks dtype and the FP8 dims rule (multiples of 16; 32 for MXFP8) for a spec's input. */
int lutra_quantizer_check_input(const lutra_quantizer_spec *s, const lutra_tensor *x,
                                const char *fn);
/* Calibration: a delayed quantizer records max|x| without quantizing. */
/* CUDA graph capture in progress on this thread (src/capture_state.c; set by src/graph.c):
 * allocations, host transfers, synchronizations and CPU-backend work refuse while it is. */
extern _Thread_local bool lutra_capture_active;
bool lutra_capturing(void);

/* lutra_quantize_run that also writes the bias gradient of x into dbias (see lutra_quant_args) */
int lutra_quantize_dbias_run(lutra_quantizer *q, const lutra_tensor *x, bool record_amax,
                             lutra_tensor *dbias, bool dbias_accumulate, lutra_tensor **out,
                             const char *fn);
int lutra_quantize_observe(lutra_quantizer *q, const lutra_tensor *x, const char *fn);
/* lutra_quantize_dbias_run of dy * gelu'(act) (GELU's backward fused in front; delayed scaling
 * only): dy is the gradient of a GELU's output, act the GELU's input */
/* whether q can take the fused GELU gradient below (delayed scaling; a columnwise copy on cuda) */
bool lutra_quantizer_takes_dgelu(const lutra_quantizer *q);
int lutra_quantize_dgelu_run(lutra_quantizer *q, const lutra_tensor *dy, const lutra_tensor *act,
                             lutra_tensor *dbias, bool dbias_accumulate, lutra_tensor **out,
                             const char *fn);
/* lutra_quantize_dbias_run governed by a skip flag (lutra_quant_args.skip; NULL: never skip) */
int lutra_quantize_skip_run(lutra_quantizer *q, const lutra_tensor *x, bool record_amax,
                            lutra_tensor *dbias, bool dbias_accumulate, const int32_t *skip,
                            lutra_tensor **out, const char *fn);
/* The device's "skip weight update" flag (src/graph_state.c): backend memory, allocated (zero) at
 * first use, which must not be inside a CUDA graph capture. *host_value: the value the host last
 * set with lutra_set_skip_weight_update (what the flag holds when work queued now runs). */
int lutra_skip_weight_flag(int device, const int32_t **flag, bool *host_value, const char *fn);

/* Autocast internals (autocast.c): the calling thread's state. */
typedef struct lutra_tls_state {
  const lutra_recipe *recipe; /* NULL when no scope with a recipe is active */
  lutra_group *group;
  int32_t enabled;
  int32_t calibrating;
  int32_t depth;
  int32_t pad;
} lutra_tls_state;
const lutra_tls_state *lutra_autocast_current(void);
/* Called by modules for each delayed-scaling meta they use in forward / backward. */
int lutra_autocast_note_forward(lutra_scale_meta *m, int device, const char *fn);
int lutra_autocast_note_backward(lutra_scale_meta *m, int device, const char *fn);
/* True for the first module to run forward in the current outermost scope. */
bool lutra_autocast_claim_backward_trigger(void);
/* Runs the pending backward update (one backend call); called by the trigger module. */
int lutra_autocast_backward_done(const char *fn);
/* Removes a meta from the pending lists (its owner is being freed). */
void lutra_autocast_forget(lutra_scale_meta *m);

/* Modules: a small vtable, as torch/nn modules have. */
typedef struct lutra_module_ops {
  const char *kind;
  int (*forward)(lutra_module *m, const lutra_tensor *x, int first_microbatch, lutra_tensor **y);
  int (*backward)(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx);
  int (*num_params)(const lutra_module *m);
  int (*param)(const lutra_module *m, int i, lutra_param *out);
  void (*release)(lutra_module *m); /* frees buffers and child references */
} lutra_module_ops;

struct lutra_module {
  lutra_object obj;
  const lutra_module_ops *ops;
};
void lutra_module_retain(lutra_module *m);

/* Linear + GELU fused by Sequential (src/sequential.c):
 * - forward with the GELU in the GEMM epilogue (GELU_AUX): *y = gelu(x W^T + b), *pre = the
 *   pre-activation (owned by the Linear), which the GELU module then adopts as its input;
 * - backward of the Linear after that GELU with gelu'(pre) in its dgrad GEMM (DGELU): *dx is
 *   the gradient of the GELU's input and the GELU's own backward is skipped; *fused is false
 *   (and *dx the plain dgrad) where the dgrad GEMM cannot take it (FP8 operands). */
int lutra_linear_forward_gelu(lutra_module *m, const lutra_tensor *x, int first_microbatch,
                              lutra_tensor **y, lutra_tensor **pre);
int lutra_linear_backward_dgelu(lutra_module *m, const lutra_tensor *dy, const lutra_tensor *pre,
                                lutra_tensor **dx, bool *fused);
/* - backward of the Linear whose last forward ran with the GELU, from dy = the gradient of the
 *   GELU's output: gelu' is applied inside the grad_output cast (dgelu + cast + dbias in one
 *   pass, TransformerEngine's fused dact), and the GELU's own backward is skipped; only where
 *   lutra_linear_takes_gelu_grad (FP8 backward with delayed scaling and a columnwise copy). */
bool lutra_linear_takes_gelu_grad(const lutra_module *m);
int lutra_linear_backward_gelu(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx);
bool lutra_module_is_linear(const lutra_module *m);
bool lutra_module_is_gelu(const lutra_module *m);
/* the GELU's forward happened inside the GEMM before it: x = pre-activation, y = its output */
void lutra_gelu_adopt(lutra_module *m, const lutra_tensor *x, const lutra_tensor *y);

#endif
