/* One tree's norm kernels for tools/norm_ab/main.cu: kernels/norm/norm.cu and
 * kernels/norm/norm_quantize.cu of the directory AB_DIR_NORM / AB_DIR_QUANT name, their entry
 * points renamed AB_PREFIX_lk_* so that two trees link into one program. Built twice by
 * tools/norm_ab/run.sh. */
#define AB_CAT2(a, b)          a##_##b
#define AB_CAT(a, b)           AB_CAT2(a, b)
#define lk_layernorm_forward   AB_CAT(AB_PREFIX, lk_layernorm_forward)
#define lk_layernorm_backward  AB_CAT(AB_PREFIX, lk_layernorm_backward)
#define lk_norm_row_blocks     AB_CAT(AB_PREFIX, lk_norm_row_blocks)
#define lk_norm_quantize       AB_CAT(AB_PREFIX, lk_norm_quantize)
#define lk_norm_quantize_tiles AB_CAT(AB_PREFIX, lk_norm_quantize_tiles)

#include <atomic> /* before the namespaces: norm.cu includes it */

/* the helper library at file scope too: the trees' norm files include it inside the namespaces */
#include "common/base.cuh"
#include "common/bulk_rows.cuh"
#include "common/codec.cuh"
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"
#include "common/reduce.cuh"
#include "common/scale.cuh"
#include "kernels.h"
/* at file scope: the fused norm's tile path calls the quantizer's launchers (lkq::, linked from
 * kernels/quantize/cast_transpose_16bit.cu and quantize_block.cu), not copies in the namespace
 * below */
#include "quantize/quantize_tiles.cuh"

/* the two files' file-local names would clash in one translation unit, and their names of
 * external linkage between the two trees' objects: a namespace per file and tree */
#define ab_norm  AB_CAT(AB_PREFIX, norm)
#define ab_quant AB_CAT(AB_PREFIX, quant)
namespace ab_norm {
#include AB_DIR_NORM
}
namespace ab_quant {
#include AB_DIR_QUANT
}

/* norm.cu's entry points take C linkage from kernels.h's declarations only at file scope: give
 * the namespaced ones C names here (the macros above add the prefix) */
cudaError_t lk_layernorm_forward(const lutra_norm_args *a, cudaStream_t s) {
  return ab_norm::lk_layernorm_forward(a, s);
}
cudaError_t lk_layernorm_backward(const lutra_norm_args *a, const lk_scratch *scratch,
                                  cudaStream_t s) {
  return ab_norm::lk_layernorm_backward(a, scratch, s);
}
