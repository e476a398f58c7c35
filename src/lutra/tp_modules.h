/* lutra/tp_modules.h: tensor-parallel norm-fused modules (TransformerEngine's / Megatron's
 * placement; lutra_tp_desc and the shardings in lutra/dist.h).
 * Part of lutra.h (include that one; its conventions hold here). */
#ifndef LUTRA_TP_MODULES_H
#define LUTRA_TP_MODULES_H

#include "dist.h"
#include "fused.h"
#include "grouped.h"

#ifdef __cplusplus
extern "C" {
#endif

/* LayerNormLinear, column-parallel only (tp->mode LUTRA_TP_COLUMN): d gives the full layer;
 * this rank holds the norm's weight (and bias) [in] whole and W [out/size, in], bias
 * [out/size]. The norm runs over the full hidden on every rank; with sequence_parallel on this
 * rank's rows of the sequence, whose norm output is then all-gathered (under delayed FP8 scaling
 * with the amaxes reduced over tp->group: as FP8 codes, the norm writing them). Backward: the
 * dgrad all-reduced (sequence_parallel: reduce-scattered) before the norm's backward; wgrad and
 * the bias gradient local; the norm's gradients are whole without sequence_parallel and this
 * rank's rows' part with it (Megatron sums them over the group, as for its sequence-parallel
 * LayerNorm). Row-parallel is refused, as TransformerEngine refuses it: its input would be a
 * shard of the features, and a norm over the full hidden needs every feature of a row (all of
 * the input, or a reduction of each row's statistics over the group, which TE does not do).
 * TE's LayerNormLinear raises NotImplementedError("Normalization does not support
 * tensor-parallel distribution.") for parallel_mode="row" at construction, whatever the group
 * size (transformer_engine/pytorch/module/layernorm_linear.py, NVIDIA/TransformerEngine#2688);
 * before that its row mode normalized each rank's shard of the features on its own (a norm
 * weight of in/size), which is another layer than the unsharded one. lutra refuses it the same
 * way, whatever the group size or sequence_parallel. */
LUTRA_API int lutra_layernorm_linear_parallel_new(const lutra_layernorm_linear_desc *d,
                                                  const lutra_tp_desc *tp, lutra_module **out);

/* LayerNormMLP over tp->group (tp->mode must be LUTRA_TP_NONE: the modes are fixed): FC1 a
 * column-parallel LayerNormLinear, the activation on the shard, FC2 row-parallel (its output
 * all-reduced, with sequence_parallel reduce-scattered; its bias whole, added once). Gated
 * activations: FC1's shard on rank r is [gate rows r*f/size .. (r+1)*f/size, then the same rows
 * of the linear half] (f = ffn_hidden), so the shard's activation gives exactly the features
 * r*f/size .. (r+1)*f/size that FC2's shard reads. ffn_hidden must be a multiple of the size. */
LUTRA_API int lutra_layernorm_mlp_parallel_new(const lutra_layernorm_mlp_desc *d,
                                               const lutra_tp_desc *tp, lutra_module **out);

/* GroupedLinear with every expert sharded as a parallel Linear (tp->mode COLUMN or ROW; d gives
 * the full layer): COLUMN W_e [out/size, in], bias_e [out/size], the input whole, the input
 * gradient all-reduced; ROW W_e [out, in/size], bias_e [out] whole (added by rank 0, before the
 * reduction), the input [rows, in/size], the grouped output all-reduced. Every rank routes the
 * same tokens (the same m_splits). sequence_parallel is refused. Expert e of rank r draws its
 * weights from seed + e + num_gemms r with the full layer's bound. */
LUTRA_API int lutra_grouped_linear_parallel_new(const lutra_grouped_linear_desc *d,
                                                const lutra_tp_desc *tp, lutra_module **out);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_TP_MODULES_H */
