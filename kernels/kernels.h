/* Host launchers of lutra's CUDA kernels, callable from C (src/backend/cuda/). Each launches on the
 * given stream, checks the launch (cudaGetLastError) and returns the CUDA status; none
 * synchronizes, allocates or prints. Argument structs are the backend interface's
 * (src/backend.h); every pointer in them is device memory. Numerics match the CPU backend
 * (src/backend/cpu/) bit for bit where the CPU comments say "exact": FP8 casts are RNE and
 * saturating, scales are computed in f32 in the same order. */
#ifndef LUTRA_KERNELS_H
#define LUTRA_KERNELS_H

#include <cuda_runtime.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* element-wise */
cudaError_t lk_convert(const void *src, int src_dtype, void *dst, int dst_dtype, int64_t n,
                       cudaStream_t s);
cudaError_t lk_fill(void *dst, int dtype, int64_t n, float value, cudaStream_t s);

/* quantization family (kernels/quantize*.cu) */
cudaError_t lk_amax(const void *x, int dtype, int64_t n, float *amax, cudaStream_t s);
/* current scaling in one launch: *amax = max|x|, *scale from it (lutra_backend.current_scale;
 * work: 2 zeroed words, left zeroed). Nothing is written when skip && *skip (device memory). */
cudaError_t lk_current_scale(const void *x, int dtype, int64_t n, float fp8_max, int power_2_scale,
                             float epsilon, float *amax, float *scale, uint32_t *work,
                             const int32_t *skip, cudaStream_t s);
/* The quantizers also compute a->dbias when it is set: fused into the tiled kernels where a
 * columnwise output is written and a->dbias_scratch is given, else by lk_bias_grad after.
 * Every kernel they launch reads a->skip (when set) first and returns when it is nonzero. */
cudaError_t lk_cast(const lutra_quant_args *a, cudaStream_t s);
/* current scaling over the values of a cast with an activation inside (a->act, act_kind):
 * lutra_backend.current_scale_act, one launch, work as lk_current_scale's */
cudaError_t lk_current_scale_act(const lutra_quant_args *a, float fp8_max, float *amax,
                                 float *scale, uint32_t *work, cudaStream_t s);
cudaError_t lk_quantize_mxfp8(const lutra_quant_args *a, cudaStream_t s);
cudaError_t lk_quantize_block(const lutra_quant_args *a, cudaStream_t s);
cudaError_t lk_dequantize(const lutra_dequant_args *a, cudaStream_t s);
/* NVFP4 (kernels/quantize/quantize_nvfp4.cu; lutra/nvfp4.h): lutra_backend.quantize_nvfp4, and
 * lk_dequantize's LUTRA_SCALING_NVFP4 case */
cudaError_t lk_quantize_nvfp4(const lutra_quant_args *a, cudaStream_t s);
cudaError_t lk_dequantize_nvfp4(const lutra_dequant_args *a, cudaStream_t s);
/* rowwise scaling (kernels/quantize/quantize_rowwise.cu; lutra/formats.h):
 * lutra_backend.quantize_rowwise, one launch for the rowwise copy, four for the columnwise one; no
 * dbias or activation (the caller sums the bias gradient after); lk_dequantize takes
 * LUTRA_SCALING_ROWWISE */
cudaError_t lk_quantize_rowwise(const lutra_quant_args *a, cudaStream_t s);
/* all n metas in ONE launch (pointers passed by value in the kernel parameters) */
cudaError_t lk_delayed_update(lutra_scale_meta *const *metas, int n, cudaStream_t s);
/* external scaling rules (kernels/rules/rules.cu): gather every meta's [scale, history] into
 * staging (offsets as lutra_backend.rules_gather's) and roll the histories; apply: scale =
 * scales[j], scale_inv = 1 / scales[j] (scales: device memory) */
cudaError_t lk_rules_gather(lutra_scale_meta *const *metas, int n, float *staging, cudaStream_t s);
cudaError_t lk_rules_apply(lutra_scale_meta *const *metas, int n, const float *scales,
                           cudaStream_t s);

/* process groups (kernels/parallel/dist.cu): amax_history[0] of n metas copied into the contiguous
 * buf[n] (gather) or back from it (scatter), one launch per 256 metas */
cudaError_t lk_amax_gather(lutra_scale_meta *const *metas, int n, float *buf, cudaStream_t s);
cudaError_t lk_amax_scatter(lutra_scale_meta *const *metas, int n, const float *buf,
                            cudaStream_t s);

/* activations and the bias gradient (kernels/activation/activation.cu). A kind the kernels do not
 * implement is cudaErrorInvalidValue: the backend refuses it first, with its name. The bias
 * gradient's kernels read a->skip (when set) on the device and write nothing when it is set. */
/* Device scratch of the reducing kernels (bias gradient, losses), owned by the caller, one per
 * stream: kernels on two streams may run at once and must not share it. loss_done is zero
 * between calls (the loss kernel's last block clears it), so it is zeroed once when allocated. */
enum { LK_BIAS_PARTIALS = 1 << 20, LK_LOSS_PARTIALS = 1024 }; /* doubles */
typedef struct lk_scratch {
  double *bias_partial; /* LK_BIAS_PARTIALS */
  double *loss_partial; /* LK_LOSS_PARTIALS */
  unsigned *loss_done;  /* 1 */
} lk_scratch;
cudaError_t lk_activation_forward(const lutra_act_args *a, cudaStream_t s);
cudaError_t lk_activation_backward(const lutra_act_args *a, cudaStream_t s);
cudaError_t lk_bias_grad(const lutra_bias_grad_args *a, const lk_scratch *scratch, cudaStream_t s);
/* d[r, c] += bias[c] (for GEMMs whose epilogue cannot take the bias) */
cudaError_t lk_add_bias(void *d, int d_dtype, const void *bias, int bias_dtype, int64_t rows,
                        int64_t cols, cudaStream_t s);
/* GEMM epilogues cuBLASLt did not run (kernels/gemm/epilogue.cu), in place on the GEMM's f32 result
 * x of n elements: GELU_AUX: aux = x rounded to aux_dtype, then x = gelu(x); DGELU:
 * x = x * gelu'(aux). lk_row_sum: out[r] = sum_c x[r, c] in double, rounded once (BGRADB's
 * k-sums of an untransposed B; lk_bias_grad gives the column sums). */
cudaError_t lk_gelu_aux(float *x, void *aux, int aux_dtype, int64_t n, cudaStream_t s);
cudaError_t lk_dgelu(float *x, const void *aux, int aux_dtype, int64_t n, cudaStream_t s);
cudaError_t lk_row_sum(const void *x, int dtype, int64_t rows, int64_t cols, void *out,
                       int out_dtype, cudaStream_t s);
/* losses (kernels/loss/loss.cu); softmax_xent: labels outside [0, cols) make the loss NaN (a device
 * kernel cannot return an error) */
cudaError_t lk_mse(const lutra_loss_args *a, const lk_scratch *scratch, cudaStream_t s);
cudaError_t lk_softmax_xent(const lutra_loss_args *a, const lk_scratch *scratch, cudaStream_t s);
/* LayerNorm and RMSNorm (kernels/norm/norm.cu; lutra_norm_args): rows of 256 threads; the
 * backward's dgamma/dbeta column sums go through scratch->bias_partial as per-row-block partials
 * added in a fixed order (deterministic; two launches with dx up to 8192 16-bit columns, three
 * above), which needs 2 * hidden <= LK_BIAS_PARTIALS (the backend refuses larger hidden sizes
 * first). lk_norm_row_blocks: the row blocks of the wide rows' split (a function of rows and
 * hidden). */
cudaError_t lk_layernorm_forward(const lutra_norm_args *a, cudaStream_t s);
cudaError_t lk_layernorm_backward(const lutra_norm_args *a, const lk_scratch *scratch,
                                  cudaStream_t s);
int64_t lk_norm_row_blocks(int64_t rows, int64_t hidden);
/* the norm writing its output FP8 (kernels/norm/norm_quantize.cu; lutra_norm_quant_args): one
 * launch, two for per-tensor current scaling (its amax first); hidden within the norm kernels'
 * range */
cudaError_t lk_norm_quantize(const lutra_norm_quant_args *a, cudaStream_t s);
/* whether lk_norm_quantize takes the tile path (the statistics, then the quantizer's tile kernel)
 * for a call like a once a's norm has mean (LayerNorm) and rstd to write: the CUDA backend gives
 * a call that keeps none a scratch for them only then */
int lk_norm_quantize_tiles(const lutra_norm_quant_args *a);
/* out = a + b element-wise, the sum in f32 rounded once (kernels/residual/residual.cu) */
cudaError_t lk_add(const void *a, const void *b, void *out, int dtype, int64_t n, cudaStream_t s);
/* optimizers, many tensors per launch (multi-tensor apply; kernels/optim/optim.cu) */
cudaError_t lk_sgd_step(const lutra_optim_args *a, cudaStream_t s);
cudaError_t lk_adamw_step(const lutra_optim_args *a, cudaStream_t s);

/* embedding (kernels/embedding/embedding.cu; lutra_embedding_args): the forward one launch, the
 * backward a memset (unless accumulating), the keys, CUB's radix sort and the row sums, all in
 * a->scratch of lk_embedding_scratch(n, vocab) bytes (a host-side size query: no device work) */
cudaError_t lk_embedding_forward(const lutra_embedding_args *a, cudaStream_t s);
cudaError_t lk_embedding_backward(const lutra_embedding_args *a, cudaStream_t s);
cudaError_t lk_embedding_scratch(int64_t n, int64_t vocab, size_t *bytes);
/* MoE routing (kernels/moe/moe.cu; lutra_topk_args, lutra_permute_args): the router one thread
 * per token (k <= LUTRA_MOE_MAX_K); the permute four launches (count, scan, rank, copy) over a
 * fixed grid, its shared memory experts ints (experts <= LUTRA_MOE_MAX_EXPERTS), scratch
 * lutra_moe_scratch_ints(tokens * k, experts) ints; the others one launch each. */
cudaError_t lk_moe_topk_forward(const lutra_topk_args *a, cudaStream_t s);
cudaError_t lk_moe_topk_backward(const lutra_topk_args *a, cudaStream_t s);
cudaError_t lk_moe_permute(const lutra_permute_args *a, cudaStream_t s);
cudaError_t lk_moe_permute_backward(const lutra_permute_args *a, cudaStream_t s);
cudaError_t lk_moe_unpermute(const lutra_permute_args *a, cudaStream_t s);
cudaError_t lk_moe_unpermute_backward(const lutra_permute_args *a, cudaStream_t s);
/* attention dropout (kernels/attention/dropout_offset.cu): *offset += step, one thread */
cudaError_t lk_attention_offset_advance(int64_t *offset, uint64_t step, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
