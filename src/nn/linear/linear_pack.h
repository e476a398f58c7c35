/* The CPU inference forward's packed weight (lutra_cpu_set_inference_pack, lutra/base.h): a
 * Linear core's f32 weight kept transposed, [in, out], so that the forward GEMM reads it
 * untransposed (NN) instead of gathering the [out, in] weight into OpenBLAS's panels at every
 * call. Made at the first inference forward that may use it, made again after the weight changed
 * (LUTRA_TENSOR_REPACK, set wherever lutra writes a parameter). */
#ifndef LUTRA_NN_LINEAR_PACK_H
#define LUTRA_NN_LINEAR_PACK_H

#include "nn/linear/linear_core_state.h"

#include <stdatomic.h>
#include <stdbool.h>

extern atomic_int lutra_inference_pack_flag;

/* whether c's high-precision inference forward of x multiplies by the packed weight: the switch
 * is on, everything is f32 on the CPU and the weight is c's alone (a tied weight has sharers
 * whose packs would each clear the other's REPACK mark) */
static inline bool lutra_linear_pack_applies(const lutra_linear_core *c, const lutra_tensor *x) {
  return atomic_load_explicit(&lutra_inference_pack_flag, memory_order_relaxed) &&
         c->device == LUTRA_CPU && c->dtype == LUTRA_F32 && x->dtype == LUTRA_F32 &&
         c->weight->dtype == LUTRA_F32 && !c->tie_owner && c->tie->tied == 0;
}

/* c->packed, the weight's transpose, made or refreshed when stale */
int lutra_linear_pack(lutra_linear_core *c, const char *fn);

#endif
