/* The f32 scale rules of src/backend/cpu/quantize_cpu.c (kernels/common/). */
#ifndef LUTRA_KERNELS_COMMON_SCALE_CUH
#define LUTRA_KERNELS_COMMON_SCALE_CUH

#include "common/f32.cuh"

namespace lkc {

/* TransformerEngine's compute_scale_from_amax (value_for_inf = FLT_MAX) */
LKC_HD float scale_rule(float amax, float fp8_max, int power_2_scale, float epsilon) {
  float a = amax;
  if (a < epsilon) a = epsilon;
  float scale = 1.0f;
  if (is_inf(a) || a == 0.0f) return scale;
  scale = div_x86(fp8_max, a);
  if (is_inf(scale)) scale = FLT_MAX_F;
  if (power_2_scale) scale = bits_f32(f32_bits(scale) & 0xFF800000u);
  return scale;
}

/* exp2f(e) for an integer e, exactly as a correctly rounded exp2f gives it */
LKC_HD float exp2_int(int32_t e) {
  if (e >= 128) return bits_f32(0x7F800000u);
  if (e >= -126) return bits_f32((uint32_t)(e + 127) << 23);
  if (e >= -149) return bits_f32(1u << (e + 149));
  return 0.0f;
}

} // namespace lkc

#endif
