/* The CPU backend table and the device lookup every object uses at creation. */
#include "cpu.h"

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
    .scale_from_amax = lutra_cpu_scale_from_amax,
    .cast = lutra_cpu_cast,
    .quantize_mxfp8 = lutra_cpu_quantize_mxfp8,
    .quantize_block = lutra_cpu_quantize_block,
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

const lutra_backend *lutra_backend_get(int device, const char *fn) {
  if (device == LUTRA_CPU) return &lutra_cpu_backend;
  if (device == LUTRA_CUDA) {
    lutra_error(LUTRA_EUNSUPPORTED, fn,
                "device 'cuda' is not available: this liblutra was built without the CUDA backend");
    return NULL;
  }
  lutra_error(LUTRA_EINVAL, fn, "unknown device %d (expected LUTRA_CPU or LUTRA_CUDA)", device);
  return NULL;
}

int lutra_device_available(int device) {
  return device == LUTRA_CPU;
}
