/* The CPU backend table and the device lookup every object uses at creation. */
#include "cpu.h"

/* The quantizers with their bias gradient (lutra_quant_args.dbias): on the CPU the two are one
 * call but two passes; the sum runs in double as lutra_cpu_bias_grad's. A set skip flag skips
 * both. */
static int with_dbias(int st, const lutra_quant_args *a) {
  if (st != LUTRA_OK || !a->dbias || (a->skip && *a->skip)) return st;
  return lutra_cpu_bias_grad(a->x, a->x_dtype, a->rows, a->cols, a->dbias, a->dbias_dtype,
                             a->dbias_accumulate);
}
static int cpu_cast(const lutra_quant_args *a) {
  return with_dbias(lutra_cpu_cast(a), a);
}
static int cpu_quantize_mxfp8(const lutra_quant_args *a) {
  return with_dbias(lutra_cpu_quantize_mxfp8(a), a);
}
static int cpu_quantize_block(const lutra_quant_args *a) {
  return with_dbias(lutra_cpu_quantize_block(a), a);
}

const lutra_backend lutra_cpu_backend = {
    .name = "cpu",
    .device = LUTRA_CPU,
    .alloc = lutra_cpu_alloc,
    .free = lutra_cpu_free,
    .from_host = lutra_cpu_memcpy,
    .to_host = lutra_cpu_memcpy,
    .copy = lutra_cpu_memcpy,
    .memset = lutra_cpu_memset,
    .convert = lutra_cpu_convert,
    .fill = lutra_cpu_fill,
    .amax = lutra_cpu_amax,
    .current_scale = lutra_cpu_current_scale,
    .cast = cpu_cast,
    .quantize_mxfp8 = cpu_quantize_mxfp8,
    .quantize_block = cpu_quantize_block,
    .dequantize = lutra_cpu_dequantize,
    .delayed_update = lutra_cpu_delayed_update,
    .gemm_plan = lutra_cpu_gemm_plan,
    .gemm_plan_free = lutra_cpu_gemm_plan_free,
    .gemm = lutra_cpu_gemm,
    .gelu_forward = lutra_cpu_gelu_forward,
    .gelu_backward = lutra_cpu_gelu_backward,
    .bias_grad = lutra_cpu_bias_grad,
    .mse = lutra_cpu_mse,
    .softmax_xent = lutra_cpu_softmax_xent,
    .sgd_step = lutra_cpu_sgd_step,
    .adamw_step = lutra_cpu_adamw_step,
};
