/* lutra/grouped.h: GroupedLinear, the experts of a mixture-of-experts layer.
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_GROUPED_H
#define LUTRA_GROUPED_H

#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* num_gemms experts, each a Linear of in_features -> out_features with its own weight [out, in]
 * (and bias [out]), initialised as Linear does from seed + the expert's index. The input x
 * [sum(m_splits), in] holds each expert's rows contiguously, expert 0 first; the output has the
 * same rows. Parameters (lutra_module_param) are weight_0, bias_0, weight_1, bias_1, ... */
typedef struct lutra_grouped_linear_desc {
  int32_t num_gemms;
  int32_t bias; /* default 1 */
  int64_t in_features;
  int64_t out_features;
  int32_t dtype;                /* F32 (default) or BF16 */
  int32_t device;               /* LUTRA_CPU (default) */
  int32_t accumulate_main_grad; /* wgrad accumulates into f32 main_grad buffers */
  int32_t pad;
  uint64_t seed; /* default: the next seed of the global generator */
} lutra_grouped_linear_desc;

LUTRA_API void lutra_grouped_linear_defaults(lutra_grouped_linear_desc *d);
LUTRA_API int lutra_grouped_linear_new(const lutra_grouped_linear_desc *d, lutra_module **out);
/* The rows of each expert for the next forward: splits is an I32 tensor of num_gemms elements,
 * on the CPU (host splits: checked now, LUTRA_EINVAL when one is < 0 or they do not sum to the
 * input's rows) or on the module's device (device splits: held by the module and read in place,
 * in stream order, by the next forward, whose GEMM keeps the copy its backward reads, so the
 * tensor may be rewritten once that forward was called; never read by the host; checked where
 * the work runs, a bad one sets the module's error flag, which lutra_grouped_check reports). Setting splits ends the last forward (a backward needs a new
 * forward). lutra_module_forward then uses them, so a GroupedLinear runs inside a Sequential. */
LUTRA_API int lutra_grouped_set_splits(lutra_module *m, const lutra_tensor *splits);
/* lutra_grouped_set_splits, then lutra_module_forward_ex; m may also be a module holding
 * GroupedLinears (a Sequential: lutra_module_forward_ex with splits in the args, which it hands
 * to each of them). */
LUTRA_API int lutra_grouped_forward(lutra_module *m, const lutra_tensor *x,
                                    const lutra_tensor *splits, const lutra_forward_args *a,
                                    lutra_tensor **y);
/* A host read of the module's device error flag: LUTRA_EINVAL (and the flag cleared) when the
 * device splits of a forward or backward since the last check were bad; their outputs are then
 * undefined. A synchronization on a device: call it where the host reads anyway (the loss). */
LUTRA_API int lutra_grouped_check(lutra_module *m);
LUTRA_API int lutra_grouped_num_gemms(const lutra_module *m, int *n);
/* How a high-precision forward and its backward run when the host knows the splits (a CPU
 * tensor): GROUPED (the default) as with device splits, one grouped GEMM per pass; PER_EXPERT
 * one GEMM per expert with an expert's rows through the GEMM front (cuBLASLt plans cached per
 * shape, as a Linear's), which also runs f32 modules on cuda. FP8 forwards always take the
 * grouped path. bench/grouped_bench.lua measures which is faster where. */
enum { LUTRA_GROUPED_PATH_GROUPED = 0, LUTRA_GROUPED_PATH_PER_EXPERT = 1 };
LUTRA_API int lutra_grouped_set_path(lutra_module *m, int path);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_GROUPED_H */
