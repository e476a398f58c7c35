/* The public scalar helpers over the codecs of core/codec.h: encode, decode, dtype facts. */
#include "core/dtype.h"
#include "core/codec.h"
#include "core/fp4.h"

#include <float.h>

float lutra_decode(int dtype, uint32_t bits) {
  switch (dtype) {
  case LUTRA_F32:
    return bits_f32(bits);
  case LUTRA_BF16:
    return bf16_to_f32((uint16_t)bits);
  case LUTRA_F16:
    return f16_to_f32((uint16_t)bits);
  case LUTRA_E4M3:
    return e4m3_to_f32(bits);
  case LUTRA_E5M2:
    return e5m2_to_f32(bits);
  case LUTRA_E8M0:
    return e8m0_to_f32(bits);
  case LUTRA_E2M1:
    return e2m1_to_f32(bits);
  default:
    return NAN;
  }
}

uint32_t lutra_encode(int dtype, float value) {
  switch (dtype) {
  case LUTRA_F32:
    return f32_bits(value);
  case LUTRA_BF16:
    return f32_to_bf16(value);
  case LUTRA_F16:
    return f32_to_f16(value);
  case LUTRA_E4M3:
    return f32_to_e4m3(value);
  case LUTRA_E5M2:
    return f32_to_e5m2(value);
  case LUTRA_E8M0:
    return f32_to_e8m0(value);
  case LUTRA_E2M1:
    return f32_to_e2m1(value);
  default:
    return 0;
  }
}

float lutra_dtype_max(int dtype) {
  switch (dtype) {
  case LUTRA_F32:
    return FLT_MAX;
  case LUTRA_BF16:
    return bits_f32(0x7F7F0000u);
  case LUTRA_F16:
    return 65504.0f;
  case LUTRA_E4M3:
    return 448.0f;
  case LUTRA_E5M2:
    return 57344.0f;
  case LUTRA_E8M0:
    return bits_f32(0x7F000000u); /* 2^127 */
  case LUTRA_E2M1:
    return 6.0f;
  default:
    return 0.0f;
  }
}

size_t lutra_dtype_size(int dtype) {
  switch (dtype) {
  case LUTRA_F32:
    return 4;
  case LUTRA_BF16:
    return 2;
  case LUTRA_F16:
    return 2;
  case LUTRA_E4M3:
  case LUTRA_E5M2:
  case LUTRA_E8M0:
    return 1;
  case LUTRA_I32:
    return 4;
  default:
    return 0;
  }
}

const char *lutra_dtype_name(int dtype) {
  switch (dtype) {
  case LUTRA_F32:
    return "f32";
  case LUTRA_BF16:
    return "bf16";
  case LUTRA_F16:
    return "f16";
  case LUTRA_E4M3:
    return "e4m3";
  case LUTRA_E5M2:
    return "e5m2";
  case LUTRA_E8M0:
    return "e8m0";
  case LUTRA_I32:
    return "i32";
  case LUTRA_E2M1:
    return "e2m1";
  default:
    return "?";
  }
}

size_t lutra_dtype_bytes(int dtype, int64_t n) {
  if (dtype == LUTRA_E2M1) return (size_t)(n / 2 + n % 2);
  return (size_t)n * lutra_dtype_size(dtype);
}
