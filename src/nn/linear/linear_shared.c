/* The checks and decisions linear-like modules share (see nn/linear/linear_shared.h). */
#include "nn/linear/linear_shared.h"
#include "backend/device.h"

#include <math.h>
#include <string.h>

int lutra_linear_check_desc(int64_t in, int64_t out, int32_t dtype, int32_t device,
                            const lutra_backend **be, const char *fn) {
  CHECK_ARG(in > 0 && out > 0, "in_features and out_features must be positive (got %lld, %lld)",
            (long long)in, (long long)out);
  CHECK_ARG(dtype == LUTRA_F32 || dtype == LUTRA_BF16, "dtype must be f32 or bf16, got %s",
            lutra_dtype_name(dtype));
  return lutra_backend_get(device, be, fn);
}

int lutra_linear_make_param(int32_t device, int64_t n0, int64_t n1, int32_t dtype, lutra_tensor **t,
                            const char *fn) {
  int64_t shape[2] = {n0, n1};
  lutra_tensor_spec spec = *PLAIN_TENSOR(dtype, n1 ? 2 : 1, shape, device);
  spec.flags = LUTRA_TENSOR_BORROWED;
  return lutra_tensor_make(&spec, t, fn);
}

int lutra_linear_init_params(lutra_tensor *weight, lutra_tensor *bias, uint64_t seed, int64_t in) {
  float bound = (float)(1.0 / sqrt((double)in));
  if (weight) TRY(lutra_tensor_uniform(weight, seed, -bound, bound));
  return bias ? lutra_tensor_uniform(bias, seed ^ 0x5bd1e995u, -bound, bound) : LUTRA_OK;
}

int lutra_linear_check_backward(const lutra_tensor *saved_x, const lutra_tensor *dy, int32_t dtype,
                                int32_t device, lutra_linear_step step, const char *fn) {
  CHECK_STATE(step.forward_done, "backward called before forward");
  CHECK_STATE(!(step.backward_done && step.accumulate_main_grad),
              "a second backward of one forward would add its gradients into main_grad twice: "
              "run a forward before each backward");
  CHECK_STATE(step.forward_grad, "the last forward ran with grad = false (inference): it kept "
                                 "nothing for a backward");
  CHECK_STATE(!(saved_x->flags & LUTRA_TENSOR_FREED), "the input saved by forward was freed");
  CHECK_ARG(dy->dtype == dtype, "grad_output dtype %s does not match the module's %s",
            lutra_dtype_name(dy->dtype), lutra_dtype_name(dtype));
  CHECK_ARG(dy->device == device, "grad_output is on another device than the module");
  return LUTRA_OK;
}

void lutra_linear_act_out_shape(const lutra_tensor *pre, int act, int64_t shape[LUTRA_MAX_DIMS]) {
  memcpy(shape, pre->shape, sizeof(int64_t) * LUTRA_MAX_DIMS);
  if (lutra_act_is_gated(act) && pre->ndim >= 1) shape[pre->ndim - 1] /= 2;
}

int lutra_linear_check_act_input(const lutra_tensor *pre, int act, int32_t dtype, int32_t device,
                                 int64_t shape[LUTRA_MAX_DIMS], const char *fn) {
  CHECK_ARG(lutra_linear_takes_act(act), "unknown activation kind %d", act);
  CHECK_ARG(pre->dtype == dtype, "input dtype %s does not match the module's %s",
            lutra_dtype_name(pre->dtype), lutra_dtype_name(dtype));
  CHECK_ARG(pre->device == device, "input is on another device than the module");
  CHECK_ARG(pre->ndim >= 1, "the activation's input needs a last dim");
  CHECK_ARG(!lutra_act_is_gated(act) || lutra_cols(pre) % 2 == 0,
            "the input's last dim %lld is odd: a gated activation splits it into two halves",
            (long long)lutra_cols(pre));
  lutra_linear_act_out_shape(pre, act, shape);
  return LUTRA_OK;
}

int lutra_linear_check_act_grad(const lutra_tensor *dy, const lutra_tensor *pre, int act,
                                const char *fn) {
  int64_t shape[LUTRA_MAX_DIMS];
  lutra_linear_act_out_shape(pre, act, shape);
  bool fits = dy->ndim == pre->ndim;
  for (int i = 0; fits && i < dy->ndim; i++)
    fits = dy->shape[i] == shape[i];
  CHECK_ARG(fits, "grad_output shape does not match the activation's output");
  return LUTRA_OK;
}

bool lutra_linear_takes_act_grad(int act, int64_t out, bool fp8_trained, bool cast_takes_act) {
  return lutra_linear_takes_act(act) && fp8_trained && cast_takes_act &&
         (!lutra_act_is_gated(act) || out % 2 == 0);
}

int lutra_linear_run_act(const lutra_backend *be, const lutra_tensor *pre, int act,
                         lutra_tensor *out, const char *fn) {
  (void)fn; /* the backend names itself */
  lutra_act_args aa = {.x = pre->data, .out = out->data, .dtype = pre->dtype, .act = act};
  if (lutra_act_is_gated(act)) {
    aa.cols = lutra_cols(pre);
    aa.rows = lutra_rows(pre);
  } else {
    aa.n = pre->numel;
  }
  return be->activation_forward(&aa);
}
