/* The module protocol (nn/module.c): a small vtable, as torch/nn modules have, and the fusion
 * protocol through which Sequential joins neighbouring modules without knowing their kinds. */
#ifndef LUTRA_NN_MODULE_H
#define LUTRA_NN_MODULE_H

#include "backend/backend.h"
#include "core/object.h"
#include "fp8/factory.h"
#include "lutra.h"
#include "nn/tie.h"

#include <stdbool.h>

enum { LUTRA_PASS_FORWARD = 0, LUTRA_PASS_BACKWARD = 1 };

/* Fusion as a protocol. A module says what its forward can end in (an activation run in its
 * GEMM's epilogue), what its backward can start from (the gradient of that activation's output,
 * d-activation still to apply), and whether its backward can apply an activation's derivative
 * to the gradient it returns (the dgrad GEMM's epilogue). Sequential asks its neighbours and
 * never reads their state; every linear-like module answers through the shared Linear core
 * (nn/linear/linear_core.h). Entries a module cannot honour are NULL. */
typedef struct lutra_fusion_ops {
  /* an activation module: which one (LUTRA_ACT_*; LUTRA_ACT_NONE for other modules), and how it
   * takes over a forward its neighbour ran for it: x its input (the pre-activation), y its output,
   * both owned by the neighbour and valid until the neighbour's next forward */
  int32_t activation;
  void (*adopt)(lutra_module *m, const lutra_tensor *x, const lutra_tensor *y);
  /* a producer: whether this forward can end in activation act, and that forward: *y = act(z)
   * and *pre = z, the pre-activation the module keeps for the backward */
  bool (*ends_in)(const lutra_module *m, int act);
  int (*forward_ending_in)(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *a,
                           int act, lutra_tensor **y, const lutra_tensor **pre);
  /* a producer whose last forward's output was act's input (or whose last forward ended in
   * act, the pre-activation its input): whether its backward can start from dy, the gradient of
   * act's output (act' applied inside its grad_output cast, with the bias gradient: TE's dact +
   * dbias + cast + transpose), and that backward */
  bool (*starts_from_act_grad)(const lutra_module *m, int act);
  int (*backward_from_act_grad)(lutra_module *m, int act, const lutra_tensor *dy,
                                lutra_tensor **dx);
  /* a consumer right after an activation: its backward with the returned gradient multiplied by
   * act'(pre) (pre: the activation's input), so *dx is the gradient of the activation's input;
   * *fused is false (and *dx the plain input gradient) where it could not apply it */
  int (*backward_into_act)(lutra_module *m, const lutra_tensor *dy, int act,
                           const lutra_tensor *pre, lutra_tensor **dx, bool *fused);
  /* a consumer right after an activation: whether its forward can take the activation's input
   * pre and run act itself, inside the cast of its FP8 input (quantize(act(pre)) in one pass),
   * and that forward: *y its output, *act_y the activation's output (the consumer's tensor,
   * valid until its next forward; its data written only where a backward reads it), *fused
   * whether act ran inside the cast (false: the consumer ran the activation's own kernel first,
   * where its recipe or precision has no fused cast; the results are the same either way) */
  bool (*starts_with_act)(const lutra_module *m, int act);
  int (*forward_from_act)(lutra_module *m, const lutra_tensor *pre, const lutra_forward_args *a,
                          int act, lutra_tensor **y, const lutra_tensor **act_y, bool *fused);
  /* a Residual around the module (nn/residual.c): arms its next pass (LUTRA_PASS_FORWARD or
   * _BACKWARD, whichever entry above runs it) to add r by its last kernel and write the sum into
   * out (the Residual's tensor, r's shape and dtype): the forward y = m(x) + r, r the module's
   * input (a Linear's GEMM: its epilogue's C), the backward dx + r, r the gradient passing the
   * module by (a norm's backward kernel, a Linear's dgrad GEMM); rounded once. The pass returns out
   * where it added, its own output otherwise (r not added: another shape, or not its last step). A
   * module with children arms the child whose kernel ends the pass. r NULL disarms. Returns whether
   * anything was armed. */
  bool (*arm_residual)(lutra_module *m, int pass, const lutra_tensor *r, lutra_tensor *out);
} lutra_fusion_ops;

/* What a checkpoint asks of a module. A module with children names none of its own parameters
 * (its num_params/param run over its children's, in order); a child named "" adds no level to
 * the names (a Residual: its module's names are its own). A leaf's parameter i is named by
 * param_name, or "weight", "bias" for 0 and 1 without it. Entries may be NULL; the checkpoint
 * entry of the module's ops may not: a kind without one is refused by lutra_checkpoint_save
 * and _load (it could hold state the file would silently leave out). A kind with no state
 * points it at lutra_checkpoint_stateless. */
enum { LUTRA_MODULE_MAX_QUANTIZERS = 8 };
typedef struct lutra_module_quantizers {
  int count;
  const char *name[LUTRA_MODULE_MAX_QUANTIZERS]; /* "input", or "fc1.input" for a module of two */
  lutra_quantizer *q[LUTRA_MODULE_MAX_QUANTIZERS];
  int32_t slot[LUTRA_MODULE_MAX_QUANTIZERS]; /* the module's own index of each (a Linear: role) */
  /* q were made for the recipe asked for and are not the module's yet: adopt_quantizers installs
   * them, or the caller frees them (lutra_quantizer_owner_drop) */
  bool fresh;
} lutra_module_quantizers;
/* FP8 state a module keeps outside quantizer objects (a GroupedLinear: one scaling state per
 * expert and role in one allocation), reported one named view at a time ("input0": the
 * tensors <m>.fp8.input0.scale, ...). */
struct lutra_quantizer_state_view;
typedef struct lutra_fp8_state_sink {
  int (*add)(void *ctx, const char *name, const struct lutra_quantizer_state_view *v,
             const char *fn);
  void *ctx;
} lutra_fp8_state_sink;
typedef struct lutra_checkpoint_ops {
  int (*num_children)(const lutra_module *m);
  /* child i, and its name (NULL: its index, as Sequential's) */
  lutra_module *(*child)(const lutra_module *m, int i, const char **name);
  const char *(*param_name)(const lutra_module *m, int i);
  /* the quantizers the module owns. build_for not NULL and none built yet: fresh ones for that
   * recipe, as its first FP8 forward under it would build them, returned without being
   * installed (out->fresh), so that a load that fails leaves the module as it was; refused when
   * the module's were built for another recipe */
  int (*quantizers)(lutra_module *m, const lutra_recipe *build_for, lutra_module_quantizers *out,
                    const char *fn);
  void (*adopt_quantizers)(lutra_module *m, const lutra_recipe *r,
                           const lutra_module_quantizers *q);
  /* the FP8 state kept outside quantizers, each view to sink. build_for not NULL and none
   * built yet: fresh state for that recipe (*fresh, the views into it), which adopt_fp8_state
   * installs once the load succeeded or drop_fp8_state frees; refused when built for another
   * recipe */
  int (*fp8_state)(lutra_module *m, const lutra_recipe *build_for, const lutra_fp8_state_sink *sink,
                   void **fresh, const char *fn);
  void (*adopt_fp8_state)(lutra_module *m, const lutra_recipe *r, void *fresh);
  void (*drop_fp8_state)(lutra_module *m, void *fresh);
  /* saving: the module is inside a gradient-accumulation window under delayed scaling (a
   * forward with is_first_microbatch true cached its FP8 weight, no optimizer step or write
   * changed the weight since): the cache, which a forward with is_first_microbatch false would
   * reuse, is not saved, so no save can resume it exactly and checkpoints refuse it. NULL: never */
  bool (*in_accumulation_window)(const lutra_module *m);
  /* a generator the module draws from (a DotProductAttention's dropout: seed, offset), saved as
   * <m>.rng_state, U64 [2]. rng_get: *has false when the module has none to save (no
   * dropout); a status, since the state may be read back from the device; rng_set: once a load
   * succeeded. NULL: none */
  int (*rng_get)(const lutra_module *m, uint64_t state[2], bool *has, const char *fn);
  void (*rng_set)(lutra_module *m, const uint64_t state[2]);
} lutra_checkpoint_ops;

/* The checkpoint entry of a module kind with no state of its own (an activation). */
extern const lutra_checkpoint_ops lutra_checkpoint_stateless;

typedef struct lutra_module_ops {
  const char *kind;
  int (*forward)(lutra_module *m, const lutra_tensor *x, const lutra_forward_args *a,
                 lutra_tensor **y);
  int (*backward)(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx);
  int (*num_params)(const lutra_module *m);
  int (*param)(const lutra_module *m, int i, lutra_param *out);
  void (*release)(lutra_module *m); /* frees buffers and child references */
  const lutra_fusion_ops *fusion;   /* NULL: takes part in no fusion */
  /* checkpoints (io/checkpoint.c): how the module tree is named and what FP8 state it owns */
  const lutra_checkpoint_ops *checkpoint; /* NULL: refused by checkpoints (see above) */
  /* its forward reads lutra_forward_args.splits (a GroupedLinear); a module with children takes
   * them when one of its children does (lutra_module_takes_splits) */
  bool takes_splits;
  /* weight tying (nn/tie.h): the state kept for parameter i by the module owning its tensors,
   * which another module may then use as its own (a tied Linear); NULL (or a NULL entry): its
   * parameters cannot be shared */
  lutra_tie *(*tie)(lutra_module *m, int i);
  /* factory recipes (lutra/factory.h): the state of the module's choice (its kind, the name
   * lutra_module_set_name gives it, the roles chosen); NULL: the module takes no choice */
  lutra_module_choice *(*choice)(lutra_module *m);
} lutra_module_ops;

struct lutra_module {
  lutra_object obj;
  const lutra_module_ops *ops;
};

/* Initialises the header of a freshly allocated module. */
void lutra_module_init(lutra_module *m, const lutra_module_ops *ops);
void lutra_module_retain(lutra_module *m);

/* The activation a module is (LUTRA_ACT_NONE when it is none), and the fusion entries. */
static inline int lutra_module_activation(const lutra_module *m) {
  return m->ops->fusion ? m->ops->fusion->activation : LUTRA_ACT_NONE;
}
static inline const lutra_fusion_ops *lutra_module_fusion(const lutra_module *m) {
  return m->ops->fusion;
}

/* lutra_fusion_ops.arm_residual where m has it, else false */
static inline bool lutra_module_arm_residual(lutra_module *m, int pass, const lutra_tensor *r,
                                             lutra_tensor *out) {
  const lutra_fusion_ops *fu = m->ops->fusion;
  return fu && fu->arm_residual && fu->arm_residual(m, pass, r, out);
}

/* whether m or a module under it (through its checkpoint children) reads the splits of
 * lutra_forward_args */
bool lutra_module_takes_splits(const lutra_module *m);

/* Modules without parameters (activations) share these. */
int lutra_module_no_params(const lutra_module *m);
int lutra_module_no_param(const lutra_module *m, int i, lutra_param *out);

#endif
