/* lutra/rope.h: nn.RotaryEmbedding, the rotary position embedding (RoPE) applied to attention's
 * queries and keys, as TransformerEngine's RotaryPositionEmbedding + apply_rotary_pos_emb.
 * For position p and pair i < r / 2 (r = rotary_dim) the pair is rotated by the angle
 * p * base^(-2i / r): (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin), the pairs (i, i + r / 2)
 * ("rotate half", TE's and GPT-NeoX's default) or (2i, 2i + 1) with interleaved (GPT-J's); the
 * elements from r to head_dim - 1 pass through. Positions are offset + the sequence index
 * (lutra_rope_set_offset, for generation with a key/value cache). cos and sin come from a
 * table of max_seq positions computed in f64 once, at construction, and kept in f32 on the
 * module's device; the rotation runs in f32 and is rounded once to the dtype.
 *
 * A module without parameters (lutra_module_* entries): forward(x) with x [B, T, H, head_dim]
 * (qkv_format BSHD) or [T, B, H, head_dim] (SBHD) of the module's dtype and device -> the
 * rotated x, owned by the module and kept per shape; backward(dy) -> dx, the inverse rotation of
 * dy (a rotation's gradient is the rotation by -angle), with the positions of the last forward.
 * A sequence longer than max_seq - offset is refused (make the module with a larger max_seq):
 * the table never grows, so its address stays fixed for CUDA graphs.
 *
 * The fused path (what a MultiheadAttention uses): lutra_rope_apply_qkv rotates, in place and in
 * ONE launch, the query and key heads of a fused QKV projection's output, packed [q heads | k
 * heads | v heads] along the last dim, leaving the value heads untouched; with inverse it is the
 * backward of that on the gradient of the packed output. No copies of q and k are made, and the
 * attention then reads q, k and v in place through strides. cuDNN's SDPA graph has no RoPE node,
 * so this is where the rotation fuses.
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_ROPE_H
#define LUTRA_ROPE_H

#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* the order of the batch and sequence dims of the tensors a RotaryEmbedding takes */
enum { LUTRA_ROPE_BSHD = 0, LUTRA_ROPE_SBHD = 1 };

typedef struct lutra_rope_desc {
  int64_t head_dim;    /* even, 2 .. 2^20 */
  int64_t rotary_dim;  /* even, 2 .. head_dim; 0 (default): head_dim */
  int64_t max_seq;     /* positions in the table (default 4096): offset + T must not pass it */
  double base;         /* default 10000; > 1 */
  int32_t interleaved; /* pairs (2i, 2i + 1) instead of (i, i + rotary_dim / 2) */
  int32_t qkv_format;  /* LUTRA_ROPE_BSHD (default) or LUTRA_ROPE_SBHD */
  int32_t dtype;       /* F32 (default), BF16 or F16: the dtype of the tensors it takes */
  int32_t device;      /* LUTRA_CPU (default) */
} lutra_rope_desc;

LUTRA_API void lutra_rope_defaults(lutra_rope_desc *d);
LUTRA_API int lutra_rope_new(const lutra_rope_desc *d, lutra_module **out);
/* The position of sequence index 0 in the next forward and apply_qkv calls (default 0). A
 * backward uses the positions of its forward whatever the offset is now. */
LUTRA_API int lutra_rope_set_offset(lutra_module *m, int64_t offset);
/* The module's settings as made (rotary_dim filled in) and its offset now; offset may be NULL. */
LUTRA_API int lutra_rope_get(const lutra_module *m, lutra_rope_desc *out, int64_t *offset);
/* Rotates in place the num_heads query heads and num_gqa_groups key heads of qkv, a fused QKV
 * projection's output of the module's dtype and device: [B, T, (num_heads + 2 num_gqa_groups)
 * head_dim] or [B, T, num_heads + 2 num_gqa_groups, head_dim] (T and B swapped with SBHD), the
 * heads packed as [q heads | k heads | v heads]; v is left as it is. inverse != 0: the inverse
 * rotation (the backward, on the gradient of qkv). num_gqa_groups must divide num_heads (1 ..
 * num_heads). One backend call; positions start at the module's offset. */
LUTRA_API int lutra_rope_apply_qkv(lutra_module *m, lutra_tensor *qkv, int64_t num_heads,
                                   int64_t num_gqa_groups, int inverse);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_ROPE_H */
