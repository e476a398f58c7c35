/* The backend's rotary position embedding arguments (backend/backend.h's rope entry). */
#ifndef LUTRA_BACKEND_ARGS_ROPE_H
#define LUTRA_BACKEND_ARGS_ROPE_H

#include "backend/args_common.h"

LUTRA_ARGS_NO_PADDING_BEGIN
/* Rotates pairs of elements of every row of a [b, s, h, d] tensor by position-dependent angles
 * (RoPE). in and out are addressed by four strides in elements, in the order (batch, sequence,
 * head, head_dim), as lutra_attention_args does, so one struct covers bshd, sbhd and the q and k
 * heads of a fused QKV projection's output rotated in place (lutra/rope.h).
 *   pairs: i < r / 2 (r = rotary_dim) pairs (i, i + r / 2) ("rotate half", GPT-NeoX's and
 *          TransformerEngine's default), or (2i, 2i + 1) when interleaved (GPT-J's)
 *   angle: of the row at sequence index t and pair i, p * base^(-2i / r) with p =
 *          position_offset + t; table holds (cos, sin) of it in f32: table[(p * r / 2 + i) * 2]
 *          and the next float, for p < table_rows (the module computes it in f64, once)
 *   value: (x0, x1) -> (x0 c - x1 s, x1 c + x0 s); inverse (the backward: the gradient of a
 *          rotation is the rotation by -angle): (x0 c + x1 s, x1 c - x0 s). Each product and the
 *          sum in f32 as written (no fused multiply-add: the CPU and CUDA give the same bits),
 *          rounded once to dtype.
 *   elements at r .. d - 1 pass through: copied when out is not in, untouched in place.
 * In place: out == in with the same strides; otherwise out must not overlap in. */
typedef struct lutra_rope_args {
  const void *in;
  void *out;
  const float *table; /* backend memory, [table_rows, r / 2, 2] */
  int64_t b, s, h, d;
  int64_t rotary_dim; /* even, 2 .. d */
  int64_t in_stride[4], out_stride[4];
  int64_t position_offset; /* >= 0; position_offset + s <= table_rows */
  int64_t table_rows;
  int32_t dtype; /* F32, BF16, F16 */
  int32_t inverse;
  int32_t interleaved;
  int32_t pad;
} lutra_rope_args;
LUTRA_ARGS_NO_PADDING_END

/* Why a (non-NULL) lutra_rope_args cannot run, or NULL: what every backend refuses before any
 * work (kept here so that the backends' checks cannot drift apart). */
static inline const char *lutra_rope_args_problem(const lutra_rope_args *a) {
  if (a->b < 0 || a->s < 0 || a->h < 0) return "negative b, s or h";
  if (a->d < 2 || a->rotary_dim < 2 || a->rotary_dim > a->d || a->rotary_dim % 2)
    return "rotary_dim must be even and in 2 .. d";
  if (a->dtype != LUTRA_F32 && a->dtype != LUTRA_BF16 && a->dtype != LUTRA_F16)
    return "dtype is not f32, bf16 or f16";
  if (a->position_offset < 0 || a->s > a->table_rows - a->position_offset)
    return "positions position_offset .. position_offset + s - 1 pass the table's rows";
  if (a->b * a->s * a->h > 0 && (!a->in || !a->out || !a->table)) return "in, out or table is NULL";
  for (int i = 0; i < 4; i++)
    if (a->in_stride[i] < 0 || a->out_stride[i] < 0) return "a negative stride";
  if (a->in == a->out)
    for (int i = 0; i < 4; i++)
      if (a->in_stride[i] != a->out_stride[i]) return "in place (out == in) with other strides";
  return 0;
}

#endif
