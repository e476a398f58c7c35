/* GroupedLinear's core (nn/grouped/grouped_core.c): its state and what every file of it shares,
 * the module code (grouped_linear.c), its FP8 passes (grouped_fp8.c), its per-expert path
 * (grouped_host.c, grouped_graphs.c) and its checkpoint entry (grouped_checkpoint.c), all of
 * which call down into this one and none into each other's callers. num experts, each a Linear
 * [out, in]; the token-side rows of expert e are given by the splits in splits_dev (backend
 * memory), so nothing here reads them on a device. */
#ifndef LUTRA_NN_GROUPED_CORE_H
#define LUTRA_NN_GROUPED_CORE_H

#include "backend/backend.h"
#include "fp8/factory.h"
#include "fp8/recipe.h"
#include "nn/module.h"
#include "nn/tp.h"

#include <stdbool.h>

/* The scaling state of one role for all experts, in one backend allocation (delayed and
 * current scaling): scale [4 num] | scale_inv [4 num] | amax and work [4 num] | history
 * [num * history_len]; expert e's scale is at scale[4 e] (16-byte aligned, as cuBLASLt reads
 * it), its delayed-scaling meta points into it. */
typedef struct grouped_role {
  lutra_quantizer_spec spec;
  float *state;
  lutra_scale_meta *metas; /* [num], delayed scaling; host */
} grouped_role;

/* A packed FP8 operand (backend/grouped_layout.h) and the rows its buffers hold. */
typedef struct grouped_fp8_buf {
  lutra_grouped_fp8 q;
  int64_t rows_cap; /* padded rows the data buffers hold */
} grouped_fp8_buf;

typedef struct grouped_linear {
  lutra_module base;
  int32_t num;
  int64_t in, out;
  int32_t dtype, device;
  bool has_bias, accumulate_main_grad;
  const lutra_backend *be;
  /* [num] each; bias ones NULL without bias, main grads NULL unless accumulating */
  lutra_tensor **weight, **bias, **wgrad, **bgrad, **weight_main_grad, **bias_main_grad;
  /* backend memory: the data pointers of weight, bias, the wgrad and bgrad outputs ([num] each) */
  void **ptrs;
  lutra_tensor *y, *dx;
  /* the output of the activation before this module when the forward started from it (the
   * fusion protocol's forward_from_act): written only where a backward reads it */
  lutra_tensor *act_y;
  /* the splits of the next / last forward: splits_dev is what a backward reads; a forward reads
   * lutra_grouped_splits_now: splits_dev for host splits (uploaded there), else the caller's
   * device tensor, held in splits_in and copied into splits_dev by the forward's GEMM as it
   * reads them (lutra_grouped_gemm_args.save_splits): no copy of their own */
  lutra_tensor *splits_dev; /* I32 [num] on the module's device */
  const lutra_tensor *splits_in;
  int32_t *splits_host; /* [num]: valid when splits_host_known */
  bool splits_set, splits_host_known;
  lutra_tensor *bad_split; /* I32 [1] device error flag (devices only) */
  void *call_graphs;       /* the backend's cached graphs of the grouped GEMM calls, or NULL */
  void *scratch;           /* devices only: lutra_grouped_scratch_bytes, zeroed */
  /* FP8 */
  grouped_role roles[LUTRA_NUM_ROLES];
  bool roles_built;
  uint64_t qkey;
  /* a factory recipe (lutra/factory.h): the module's choice of roles, and `chosen`, a copy of
   * that recipe carrying them (its object header zeroed: a view, never referenced or freed),
   * which the FP8 passes run under in its place (lutra_grouped_chosen_recipe) */
  lutra_module_choice choice;
  lutra_recipe chosen;
  bool chosen_set;
  grouped_fp8_buf xq, wq, dyq;
  int32_t host_path;       /* LUTRA_GROUPED_PATH_*: for host-known splits in high precision */
  char (*param_names)[20]; /* checkpoint names of the parameters, in param order */
  /* what the last forward did */
  const lutra_tensor *x;
  int64_t rows;
  bool forward_done, forward_grad, forward_fp8, forward_host, weight_cached, backward_trigger,
      backward_done;
  /* the weights were last quantized by a forward with is_first_microbatch true (checkpoints:
   * lutra_checkpoint_ops.in_accumulation_window) */
  bool cache_opens_window;
  /* tensor parallel (lutra_grouped_linear_parallel_new): every expert sharded alike, the
   * collectives of nn/tp.h on the grouped output; a row-parallel bias is added by rank 0 only,
   * before the output's all-reduce (its gradient is computed on every rank) */
  bool parallel, skip_forward_bias;
  lutra_tp tp;
  struct grouped_graphs *graphs; /* the per-expert path's graphs per split pattern (NULL: none) */
} grouped_linear;

/* An activation formed inside a grouped cast (lutra_grouped_quant_args.act): pre its input,
 * forward whether the cast quantizes its output (else its input gradient, from dy), out where
 * that matrix is written too (NULL: nowhere). */
typedef struct grouped_act {
  const lutra_tensor *pre;
  int32_t kind;
  bool forward;
  lutra_tensor *out;
} grouped_act;

/* the scaling state of a recipe's roles: built (not installed), installed (the old freed), or
 * freed unused (checkpoints build it for a load before they know the load succeeds) */
int lutra_grouped_roles_build(grouped_linear *g, const lutra_recipe *rec,
                              grouped_role fresh[LUTRA_NUM_ROLES], const char *fn);
void lutra_grouped_roles_install(grouped_linear *g, const lutra_recipe *rec,
                                 grouped_role fresh[LUTRA_NUM_ROLES]);
void lutra_grouped_roles_free(grouped_linear *g, grouped_role roles[LUTRA_NUM_ROLES]);
/* the recipe the FP8 passes run under for r: r, or for a factory recipe g->chosen, r with the
 * roles its factory chose for this module (LUTRA_FACTORY_PENDING, nothing done, until the front
 * asked it; lutra/factory.h). ask false: a module with no choice for r yet is refused instead. */
int lutra_grouped_chosen_recipe(grouped_linear *g, const lutra_recipe *r, bool ask,
                                const lutra_recipe **out, const char *fn);
/* the arguments every grouped call shares */
void lutra_grouped_common(const grouped_linear *g, int64_t rows, lutra_grouped_gemm_args *a);
/* a as the forward's GEMM takes it: FPROP, this forward's splits, their copy for the backward */
void lutra_grouped_forward_splits(const grouped_linear *g, lutra_grouped_gemm_args *a);
/* the splits this forward's kernels read */
static inline const int32_t *lutra_grouped_splits_now(const grouped_linear *g) {
  return g->splits_in ? (const int32_t *)g->splits_in->data : (const int32_t *)g->splits_dev->data;
}
/* the wgrad pass of ga (set up for the backward's operands) into the module's weight gradients
 * (or main grads); db the bias gradients the GEMM writes (NULL: none) */
int lutra_grouped_wgrad(const grouped_linear *g, lutra_grouped_gemm_args *ga, void *const *db,
                        const char *fn);

#endif
