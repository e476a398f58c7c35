/* What every linear-like module checks and decides alike, whatever holds its parameters: the
 * Linear core (nn/linear/linear_core.c, one weight) and GroupedLinear (nn/grouped/grouped_linear.c,
 * a weight per expert). The input check runs on every forward and is inline; the rest is out of
 * line in nn/linear/linear_shared.c. Errors name fn. */
#ifndef LUTRA_NN_LINEAR_SHARED_H
#define LUTRA_NN_LINEAR_SHARED_H

#include "backend/backend.h"
#include "core/error.h"
#include "lutra.h"
#include "runtime/tensor.h"

#include <stdbool.h>

/* x's dtype, features and device against a module of dtype, in features on device */
static inline int lutra_linear_check_input(const lutra_tensor *x, int32_t dtype, int64_t in,
                                           int32_t device, const char *fn) {
  CHECK_ARG(x->dtype == dtype, "input dtype %s does not match the module's %s",
            lutra_dtype_name(x->dtype), lutra_dtype_name(dtype));
  CHECK_ARG(lutra_cols(x) == in, "input has %lld features, the module expects %lld",
            (long long)lutra_cols(x), (long long)in);
  CHECK_ARG(x->device == device, "input is on another device than the module");
  return LUTRA_OK;
}

/* A desc's features and dtype (f32 or bf16), and the backend of its device. */
int lutra_linear_check_desc(int64_t in, int64_t out, int32_t dtype, int32_t device,
                            const lutra_backend **be, const char *fn);
/* A parameter-shaped tensor [n0, n1] (n1 0: [n0]) on device, owned by the module. */
int lutra_linear_make_param(int32_t device, int64_t n0, int64_t n1, int32_t dtype, lutra_tensor **t,
                            const char *fn);
/* torch's default initialisation of a Linear from seed: uniform(-1/sqrt(in), 1/sqrt(in)) for
 * weight and bias (NULL: none; a tied weight keeps its owner's values), in the full layer's in
 * features */
int lutra_linear_init_params(lutra_tensor *weight, lutra_tensor *bias, uint64_t seed, int64_t in);

/* Where a module's last forward left its backward. */
typedef struct lutra_linear_step {
  bool forward_done, forward_grad, backward_done, accumulate_main_grad;
} lutra_linear_step;
/* What a backward checks of the forward it follows (saved_x: the input it kept) and of its
 * gradient dy against a module of dtype on device. */
int lutra_linear_check_backward(const lutra_tensor *saved_x, const lutra_tensor *dy, int32_t dtype,
                                int32_t device, lutra_linear_step step, const char *fn);

/* The input of a forward that starts with activation act (pre: the activation's input) against
 * a module of dtype on device; shape receives act's output shape (gated kinds halve the last
 * dim). */
int lutra_linear_check_act_input(const lutra_tensor *pre, int act, int32_t dtype, int32_t device,
                                 int64_t shape[LUTRA_MAX_DIMS], const char *fn);
/* act's output shape for its input pre */
void lutra_linear_act_out_shape(const lutra_tensor *pre, int act, int64_t shape[LUTRA_MAX_DIMS]);
/* dy, the gradient of act's output, against pre, act's input */
int lutra_linear_check_act_grad(const lutra_tensor *dy, const lutra_tensor *pre, int act,
                                const char *fn);

/* Whether a backward can start from the gradient of activation act's output, act' inside its
 * grad_output cast: the last forward was an FP8 training forward (fp8_trained), the gradient's
 * cast takes an activation (cast_takes_act: per-tensor scaling, and whatever else the module
 * needs), and a gated act has an even out to halve. */
bool lutra_linear_takes_act_grad(int act, int64_t out, bool fp8_trained, bool cast_takes_act);
/* whether a forward can start with activation act (inside its input cast, or by act's kernel) */
static inline bool lutra_linear_takes_act(int act) {
  return act > LUTRA_ACT_NONE && act < LUTRA_ACT_COUNT;
}

/* act's kernel: out = act(pre), out act's output (pre's dtype) */
int lutra_linear_run_act(const lutra_backend *be, const lutra_tensor *pre, int act,
                         lutra_tensor *out, const char *fn);

#endif
