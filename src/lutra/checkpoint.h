/* lutra/checkpoint.h: checkpoints (safetensors files) and the generator's state.
 * Part of lutra.h (include that one; its conventions hold here).
 *
 * A checkpoint is a safetensors file (8-byte little-endian header length, a JSON header naming
 * each tensor's dtype, shape and data_offsets, then the data), readable by Python's safetensors.
 * What it holds, named from the module tree (Sequential children by index, "0.", "1.", ...;
 * modules with named children by those names; a Residual adds no level; a leaf's parameters
 * "weight" and "bias"; LayerNormLinear "norm.weight", "norm.bias", "weight", "bias";
 * LayerNormMLP "norm.*", "fc1.*", "fc2.*" with quantizers "fp8.fc1.input", ...; GroupedLinear
 * "weight0".., "bias0".. with one FP8 state per expert and role, "fp8.input0", ...; a
 * tensor-parallel Linear its rank's shard, one file per rank; LayerNorm / RMSNorm "weight"
 * (gamma) and LayerNorm's "bias" (beta); an Embedding "weight"; a moe Router its Linear's;
 * activations nothing, their index skipped; a hybrid role's columnwise quantizer
 * "fp8.<role>_columnwise"; a DotProductAttention with dropout > 0 its dropout generator
 * (MultiheadAttention's "core_attention.rng_state", TransformerLayer's
 * "self_attention.core_attention.rng_state"; one without dropout draws no mask and stores none)
 * and, with fp8 = 1, FP8 attention's six delayed-scaling states as "fp8.qkv", "fp8.s", "fp8.o",
 * "fp8.do", "fp8.dp", "fp8.dqkv" (scale, scale_inv, amax_history, as a quantizer's; built for
 * the load's recipe when the module ran no FP8 forward yet);
 * a tied weight (lutra_linear_desc.tie) once, under the name of the
 * first module in the tree that holds it (GPT: "0.weight", the embedding's; the tied head
 * stores its bias and FP8 state under its own name, its weight not at all), with its main
 * grad and optimizer state once; loaded back into the same tensor, so the tie holds. A file
 * saved untied holds the head's weight under its own name: a tied model refuses it, naming
 * that tensor and the one it is tied to; a file saved tied lacks it: an untied model refuses
 * it as lacking that tensor. A module kind without a checkpoint entry is refused
 * (LUTRA_EUNSUPPORTED, naming the module and kind):
 *   <m>.weight, <m>.bias                     parameters, in their dtype
 *   <m>.weight.main_grad                     f32 main grads (main_grads = 1)
 *   <m>.fp8.<role>.scale, .scale_inv         every quantizer the module owns (F32 [1];
 *   <m>.fp8.<role>.amax_history              delayed scaling: F32 [amax_history_len])
 *   <m>.fp8.<role>.quantizations             NVFP4: U64 [1], the quantizer's count of
 *                                            quantizations (stochastic rounding draws each
 *                                            one's seed from it; a file without it loads, the
 *                                            count left as it is)
 *   <m>.rng_state                            U64 [2]: a DotProductAttention's dropout
 *                                            generator, (seed, offset of the next forward's
 *                                            mask) as lutra_attention_rng_state reads them, so
 *                                            a resumed run draws the straight run's masks. A
 *                                            file without it (written before it was saved)
 *                                            loads, the generator left as it is; a module
 *                                            without dropout skips a file's (an inference
 *                                            model from a training run's file)
 *   optim.<param>.master                     an optimizer's f32 master of a bf16 parameter
 *   optim.<param>.exp_avg, .exp_avg_sq       AdamW moments; SGD: optim.<param>.momentum_buffer
 *   optim.step, optim.device_step            I64 [1]: step calls, and steps run on the device
 *                                            (the same on the CPU)
 *   rng.state                                U64 [1]: the global seed generator
 * and __metadata__ {"format": "lutra.checkpoint", "version": "1", "data.crc32c", "optim.kind",
 * "optim.lr", "optim.schedule", "optim.warmup_steps", "optim.total_steps", "optim.min_lr",
 * "optim.max_grad_norm", "optim.weight_decay", "optim.decay", AdamW's "optim.beta1", "optim.beta2",
 * "optim.eps", SGD's "optim.momentum"} (io/checkpoint_optim.c). The schedule and clipping, which
 * have setters, are taken from the file; the hyper-parameters fixed when an optimizer is built
 * (weight decay and its rule, betas, eps, momentum) must be the optimizer's: one built with
 * others is refused naming the key (taking the file's would override its construction, keeping
 * its own would resume another run). A file without these keys, written before they were, loads
 * leaving the optimizer's own. A load closes a gradient-accumulation window the optimizer had
 * open (the file's state is a step's end: its sums would be averaged into the next step).
 * data.crc32c is the CRC-32C
 * (Castagnoli) of the data section as 8 lowercase hex digits, checked on load when present (files
 * of other writers, and of lutra before it wrote one, load unchecked); optim.lr is the f32 learning
 * rate as C's "%a" writes it in the C locale. The numbers are written and read in the C locale
 * whatever the process's own (uselocale for the call), so a host that called setlocale reads and
 * writes the same files as any other.
 *
 * Loading is all or nothing: the file must be a regular file; its header length and header are
 * read and checked first, then the file's size against the data the header describes, and only
 * then the data (a bogus file costs a header's read). Then every name, dtype and shape against
 * what the objects expect (names missing or left over), and the values that would break the next
 * step: optim.lr as lutra_optim_set_lr takes it (finite, within f32's range, >= 0); under
 * delayed scaling (whose forward reads the stored scale) every scale and scale_inv finite,
 * positive and exactly reciprocal (scale_inv == 1.0f / scale, what every scale update stores),
 * no negative amax. All before the first byte is written into
 * any object; on failure no object changed. The parts of a lutra
 * checkpoint the objects do not ask for (optim.*, rng.state, *.fp8.*, *.main_grad) are skipped,
 * so a model alone loads from a full checkpoint; in the parts asked for, names match exactly.
 * Saving writes a temporary file in the destination's directory (.NAME.tmp.PID.N), fsyncs it,
 * renames it over the destination and fsyncs the directory: a crash leaves the old file (and
 * the temporary one), never a partial checkpoint. The next save to the same destination removes
 * the temporaries whose PID is no live process of this machine (never a live one's). Both are
 * refused inside an autocast scope or a graph capture (a step half-done is no state to save).
 *
 * Resume is exact (N steps, save, load into fresh objects, M more == N + M straight, bit for bit)
 * at optimizer-step boundaries, NVFP4's stochastic rounding and attention dropout included, and
 * between the micro-batches of a gradient-accumulation window where the weight's quantization
 * depends on the weight alone (current scaling, MXFP8, blocks). Under delayed scaling the FP8
 * weight a forward with is_first_microbatch true cached was quantized with a scale since updated,
 * and is not saved: a save inside such a window (from that forward until an optimizer step, a write
 * or load of the weight, or a forward that quantizes it again) is refused with LUTRA_ESTATE, naming
 * the module, and writes nothing. With fp8 = 0 (no FP8 state saved) it is taken. */
#ifndef LUTRA_CHECKPOINT_H
#define LUTRA_CHECKPOINT_H

#include "train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a checkpoint holds. NULL / 0 fields are left out. */
typedef struct lutra_checkpoint_objects {
  lutra_module *model; /* parameters (and FP8 state) of the module tree */
  lutra_optim *optim;  /* its state; parameters named by model's tree (by its own module's when
                          model is NULL); its module must be model or inside it */
  /* load only: a module whose quantizers do not exist yet (no FP8 forward ran) gets them built
   * for this recipe, as its first FP8 forward under it would, to take the file's FP8 state (so
   * that a freshly built model resumes); they become the module's only when the whole load
   * succeeds. A module whose quantizers were built for another recipe is refused. */
  const lutra_recipe *recipe;
  int32_t fp8;        /* quantizer state (default 1) */
  int32_t main_grads; /* main grads (default 0) */
  int32_t rng;        /* the global generator's state (default 0) */
} lutra_checkpoint_objects;

/* A file name read as another object name (PyTorch's "fc1.weight" as lutra's "0.weight"); to
 * NULL: the file's tensor is skipped (a name the model has no use for, e.g. "_extra_state"). */
typedef struct lutra_checkpoint_rename {
  const char *from;
  const char *to;
} lutra_checkpoint_rename;

typedef struct lutra_checkpoint_load_opts {
  const lutra_checkpoint_rename *map;
  int32_t map_len;
  /* parameters (values only) stored as F32, BF16 or F16 are converted to the parameter's dtype
   * (exact widening; narrowing rounds to nearest even, as lutra_encode) instead of refused */
  int32_t convert;
} lutra_checkpoint_load_opts;

LUTRA_API void lutra_checkpoint_defaults(lutra_checkpoint_objects *o);
LUTRA_API int lutra_checkpoint_save(const char *path, const lutra_checkpoint_objects *o);
/* opts NULL: no renames, no conversion. Parameters loaded mark their tensors written, so an
 * optimizer not loaded with them refreshes its f32 masters from them before its next step, and
 * (LUTRA_TENSOR_LOADED) a module that cached an FP8 weight quantizes the loaded one at its next
 * forward even with is_first_microbatch false: the cache held another run's weight. With the
 * device skip flag set, that forward is refused until one runs with the flag 0 (a captured
 * graph's replay is not checked: replay a step with the flag 0 after a load). */
LUTRA_API int lutra_checkpoint_load(const char *path, const lutra_checkpoint_objects *o,
                                    const lutra_checkpoint_load_opts *opts);

/* An optimizer's step count: step calls made (host), and steps run (device: the count a CUDA
 * graph replaying a captured step advances; the host count on the cpu). Either may be NULL. For
 * a resumed loop to know where it is. */
LUTRA_API int lutra_optim_steps(const lutra_optim *o, int64_t *host, int64_t *device);
/* The global seed generator's state (what lutra_manual_seed sets). */
LUTRA_API int lutra_seed_state(uint64_t *state);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_CHECKPOINT_H */
