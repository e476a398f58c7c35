/* lutra/embedding.h: nn.Embedding, a lookup table of num_embeddings rows of dim values (torch's
 * nn.Embedding, TransformerEngine's word embeddings). A module (lutra_module_* entries):
 * forward(ids i32, 1 to 3 dims, on the module's device) -> ids' shape + [dim] in the module's
 * dtype, owned by the module and kept per shape; backward(dy) writes the weight gradient and
 * returns no input gradient (*dx = NULL: ids are data). The gradient is deterministic: each
 * weight row's contributions are summed in f32 in increasing position order, the same bits on
 * the CPU and CUDA and on every run (no float atomics). Like Linear, backward overwrites the
 * gradient (rows no id hit are 0), or with accumulate_main_grad adds into an f32 main_grad; a
 * Linear tied to the weight (lutra_linear_desc.tie) that wrote the gradient since this module's
 * forward is added to instead.
 * Out-of-range ids: the CPU refuses them (naming the first bad position and value); on CUDA the
 * kernels set a device flag (their output rows are NaN, the backward skips them), which
 * lutra_embedding_check reads and clears (a host read: it waits for the device). Parameter 0 is
 * "weight" [num_embeddings, dim], initialised N(0, 1) as torch and TE do.
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_EMBEDDING_H
#define LUTRA_EMBEDDING_H

#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lutra_embedding_desc {
  int64_t num_embeddings; /* 1 .. 2^31 - 1 */
  int64_t dim;
  int32_t dtype;                /* F32 (default), BF16 or F16 */
  int32_t device;               /* LUTRA_CPU (default) */
  int32_t accumulate_main_grad; /* the gradient accumulates into an f32 main_grad */
  int32_t pad;
  uint64_t seed; /* weight init N(0, 1); default: the next seed of the global generator */
} lutra_embedding_desc;

LUTRA_API void lutra_embedding_defaults(lutra_embedding_desc *d);
LUTRA_API int lutra_embedding_new(const lutra_embedding_desc *d, lutra_module **out);
/* Reads and clears the device's out-of-range flag: LUTRA_EINVAL naming the range when a forward
 * since the last check met an id outside [0, num_embeddings). LUTRA_OK at once on the CPU. */
LUTRA_API int lutra_embedding_check(lutra_module *m);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_EMBEDDING_H */
